//! The threads of a built VM and the per-thread hook an embedder installs on each (the
//! launcher stacks a tighter seccomp filter there). A leaf: the vCPU threads
//! (`vstate/vcpu.rs`) and the VMM thread (`event_loop.rs`) both run the hook.

use std::sync::Arc;

/// A thread of a built VM, as passed to [`crate::BuildOptions::thread_hook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmThread {
    /// The thread that runs [`crate::Vmm::run`] (event loop, device I/O).
    Vmm,
    /// The thread of vCPU `id`.
    Vcpu(u8),
}

/// Runs once on each thread of the VM after the VM is built: on each vCPU thread when it
/// starts (before its first `KVM_RUN`) and on the VMM thread at the start of [`crate::Vmm::run`] or
/// [`crate::Vmm::run_paused`] (before the vCPUs are resumed). An embedder installs per-thread restrictions here (the
/// launcher stacks a tighter seccomp filter). An error on a vCPU ends the VM with a fault; on
/// the VMM thread `run` fails.
pub type ThreadHook = Arc<dyn Fn(VmThread) -> Result<(), String> + Send + Sync>;
