//! Snapshot state of a virtio-rng device: the acked features and the broken (NEEDS_RESET)
//! flag. Queue positions are the transport's part; requests are completed as they are taken,
//! so none is half done. The rate limit starts over full after a restore.

use serde::{Deserialize, Serialize};

use super::device::{RngDevice, RngDeviceState};
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::common::{self, CommonState};
use crate::devices::virtio::persist_error::PersistError;

/// A virtio-rng device in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    pub device: RngDeviceState,
}

impl RngDevice {
    /// The device's part of a snapshot.
    pub fn save(&self) -> RngState {
        RngState {
            device: self.state(),
        }
    }

    /// A device in the saved `state`.
    pub fn restore(irq: IrqLine, state: &RngState) -> Result<Self, PersistError> {
        let mut dev = RngDevice::new(irq)?;
        let saved = CommonState {
            avail_features: 0,
            acked_features: state.device.acked_features,
            needs_reset: state.device.needs_reset,
        };
        common::restore_state(&mut dev, "virtio-rng", saved)?;
        Ok(dev)
    }
}
