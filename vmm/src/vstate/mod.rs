//! KVM-backed state: the VM, its vCPUs and guest memory.
pub mod exits;
pub mod memory;
pub mod persist;
pub mod vcpu;
pub mod vm;
