//! [`Persist`]: the one shape of every piece of a VM that a snapshot saves — the serial port,
//! the i8042, the ACPI registers, the virtio-mmio transport and each virtio device. A piece
//! saves its own state as plain data and is rebuilt from it, with the host resources the new VM
//! hands it (interrupt lines, backends, files); what goes wrong is its own error. The device
//! manager (`device_manager/persist.rs`) saves and restores them all together; a piece knows
//! nothing of it.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A piece of a VM that a snapshot saves and restore rebuilds.
pub trait Persist: Sized {
    /// What a snapshot keeps of it: plain data, part of the state file's payload.
    type State: Serialize + DeserializeOwned;
    /// What rebuilding it needs besides the state: what the restoring VM gives it.
    type Args<'a>;
    /// Why a saved state cannot be restored.
    type Error: std::error::Error;

    /// Its state now.
    fn save(&self) -> Self::State;

    /// A new one in the saved `state`, on what `args` gives it.
    fn restore(args: Self::Args<'_>, state: &Self::State) -> Result<Self, Self::Error>;
}
