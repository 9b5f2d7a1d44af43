//! Guest memory.

/// The guest memory type used across the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;
