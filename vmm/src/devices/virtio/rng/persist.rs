//! Snapshot state of a virtio-rng device: the acked features and the broken (NEEDS_RESET)
//! flag. Queue positions are the transport's part; requests are completed as they are taken,
//! so none is half done. The rate limit starts over full after a restore.

use serde::{Deserialize, Serialize};

use super::device::{RngDevice, RngDeviceState};
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::persist::{restore_state, CommonState, FeaturesError};
use crate::devices::virtio::VirtioError;
use crate::persist::Persist;

/// A virtio-rng device in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    pub device: RngDeviceState,
}

/// Why an entropy device could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RngRestoreError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error(transparent)]
    Features(#[from] FeaturesError),
}

/// A restored device gets only its interrupt line from the new VM.
impl Persist for RngDevice {
    type State = RngState;
    type Args<'a> = IrqLine;
    type Error = RngRestoreError;

    /// The device's part of a snapshot.
    fn save(&self) -> RngState {
        RngState {
            device: self.state(),
        }
    }

    /// A device in the saved `state`.
    fn restore(irq: IrqLine, state: &RngState) -> Result<Self, RngRestoreError> {
        let mut dev = RngDevice::new(irq)?;
        let saved = CommonState {
            avail_features: 0,
            acked_features: state.device.acked_features,
            needs_reset: state.device.needs_reset,
        };
        restore_state(&mut dev, "virtio-rng", saved)?;
        Ok(dev)
    }
}
