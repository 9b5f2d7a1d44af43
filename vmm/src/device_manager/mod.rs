//! The device manager: it gives devices their bus addresses and IRQs (`mmio.rs`; devices never
//! choose their own), wires them into the VM (`attach.rs`) and saves and restores them
//! (`persist.rs`). The devices (`devices/`) know nothing of it.
pub mod attach;
pub mod mmio;
pub mod persist;
