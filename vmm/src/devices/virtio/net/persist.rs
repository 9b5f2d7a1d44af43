//! Snapshot state of a virtio-net device.
//!
//! Saved: the configuration (TAP name, MAC), offered and acked features (the offloads the TAP
//! is told to produce follow the acked ones), counters, the broken flag and a received frame
//! still waiting for a guest buffer. Restore may attach to a different TAP (each clone has its
//! own); it must support the offloads the guest acked. Frames still queued inside the host's
//! TAP, or on the wire, are not part of the VM and are not saved.

use serde::{Deserialize, Serialize};

use super::device::{NetBackend, NetDevice, NetDeviceState};
use super::tap::Tap;
use super::NetConfig;
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::persist::{restore_state, CommonState, FeaturesError};
use crate::devices::virtio::VirtioError;
use crate::persist::Persist;
use crate::snapshot::blob;

/// A virtio-net device in a snapshot: the TAP it was on and what the device saves of itself
/// (in the same JSON object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub config: NetConfig,
    #[serde(flatten)]
    pub saved: NetSaved,
}

/// What a virtio-net device saves of itself ([`Persist::save`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetSaved {
    pub device: NetDeviceState,
    /// A frame taken from the TAP that no receive buffer has taken yet.
    #[serde(default, with = "opt_bytes")]
    pub rx_pending: Option<Vec<u8>>,
}

mod opt_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct B(#[serde(with = "super::blob::bytes")] Vec<u8>);

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().map(|b| B(b.clone())).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<B>::deserialize(d)?.map(|b| b.0))
    }
}

/// What a restored NIC gets from the new VM: the configuration (the snapshot's or its
/// replacement), its interrupt line, and the TAP when the embedder opened it already (else it
/// is opened here).
pub struct NetArgs<'a> {
    pub config: &'a NetConfig,
    pub irq: IrqLine,
    pub opened: Option<Tap>,
}

/// Why a NIC could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum NetRestoreError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error("MAC {asked} asked for, but the guest's NIC has MAC {saved}")]
    Mac { asked: String, saved: String },
    #[error(transparent)]
    Features(#[from] FeaturesError),
}

impl Persist for NetDevice {
    type State = NetSaved;
    type Args<'a> = NetArgs<'a>;
    type Error = NetRestoreError;

    /// The device's part of a snapshot.
    fn save(&self) -> NetSaved {
        NetSaved {
            device: self.state(),
            rx_pending: self.rx_pending_frame().map(<[u8]>::to_vec),
        }
    }

    /// Attaches to the TAP `args.config` names and gives the device the saved `state`. The MAC
    /// is the guest's (from the snapshot); `args.config.mac`, when given, must be the same.
    fn restore(args: NetArgs<'_>, state: &NetSaved) -> Result<Self, NetRestoreError> {
        let cfg = args.config;
        if let Some(m) = cfg.mac.filter(|m| Some(*m) != state.device.mac) {
            return Err(NetRestoreError::Mac {
                asked: m.to_string(),
                saved: state
                    .device
                    .mac
                    .map_or_else(|| "none".to_string(), |m| m.to_string()),
            });
        }
        let tap = match args.opened {
            Some(t) => t,
            None => Tap::open(&cfg.tap).map_err(VirtioError::Tap)?,
        };
        Self::restore_on(Box::new(tap), &format!("TAP {}", cfg.tap), args.irq, state)
    }
}

impl NetDevice {
    /// The device half of [`Persist::restore`] on an already opened `backend` (`what` names
    /// it in errors): the saved MAC, acked features (which the backend must offer), counters,
    /// broken flag and pending frame.
    pub fn restore_on(
        backend: Box<dyn NetBackend>,
        what: &str,
        irq: IrqLine,
        state: &NetSaved,
    ) -> Result<Self, NetRestoreError> {
        let mut dev = NetDevice::new(backend, state.device.mac, irq)?;
        let saved = CommonState {
            avail_features: state.device.avail_features,
            acked_features: state.device.acked_features,
            needs_reset: state.device.needs_reset,
        };
        restore_state(&mut dev, what, saved)?;
        dev.restore_runtime(state.device.stats, state.rx_pending.as_deref());
        Ok(dev)
    }
}
