//! The KVM VM: capability checks, guest memory registration, in-kernel irqchip and PIT.

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};

use super::memory::GuestMemoryMmap;
use crate::arch::x86_64::layout::KVM_TSS_ADDR;
use crate::timing::Phases;

const KVM_API_VERSION: i32 = 12;

/// Capabilities the VMM cannot work without.
const REQUIRED_CAPS: [(Cap, &str); 6] = [
    (Cap::Irqchip, "in-kernel irqchip"),
    (Cap::UserMemory, "user memory regions"),
    (Cap::SetTssAddr, "TSS address"),
    (Cap::Pit2, "in-kernel PIT"),
    (Cap::Irqfd, "irqfd"),
    (Cap::Ioeventfd, "ioeventfd"),
];

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0} (is KVM available and do you have access to /dev/kvm?)")]
    OpenKvm(kvm_ioctls::Error),
    #[error("KVM API version {0} is not supported (need {KVM_API_VERSION})")]
    ApiVersion(i32),
    #[error("KVM lacks a required capability: {0}")]
    MissingCap(&'static str),
    #[error("{what} failed: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// Opens /dev/kvm and checks the API version and required capabilities.
pub fn open_kvm() -> Result<Kvm, VmError> {
    check_kvm(Kvm::new().map_err(VmError::OpenKvm)?)
}

/// Like [`open_kvm`], with `/dev/kvm` already opened by the embedder (e.g. before it gave up
/// the privileges to open it).
pub fn kvm_from_file(file: std::fs::File) -> Result<Kvm, VmError> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the descriptor is an open file we take ownership of; KVM ioctls on anything
    // that is not /dev/kvm fail (and are reported) by the checks below.
    check_kvm(unsafe { Kvm::from_raw_fd(file.into_raw_fd()) })
}

fn check_kvm(kvm: Kvm) -> Result<Kvm, VmError> {
    let v = kvm.get_api_version();
    if v != KVM_API_VERSION {
        return Err(VmError::ApiVersion(v));
    }
    for (cap, name) in REQUIRED_CAPS {
        if !kvm.check_extension(cap) {
            return Err(VmError::MissingCap(name));
        }
    }
    Ok(kvm)
}

/// The helper thread's stack: as large as a vCPU thread's (`vcpu::VCPU_STACK_SIZE`), so that
/// glibc hands the helper's stack, cached once it was joined, to the first vCPU thread instead
/// of keeping its touched pages resident beside a new one (docs/boot-time.md, "VMM memory").
const HELPER_STACK_SIZE: usize = 256 << 10;

/// Work handed to the helper thread of [`supported_cpuid_async`]: it runs there with the
/// supported CPUID once the query is done.
pub type HelperJob<T> = Box<dyn FnOnce(&CpuId) -> T + Send>;

type HelperResult<T> = (Result<CpuId, kvm_ioctls::Error>, Option<T>);

/// `KVM_GET_SUPPORTED_CPUID` running on a helper thread (see [`supported_cpuid_async`]), and
/// optionally one more job there ([`SupportedCpuid::then`]).
pub struct SupportedCpuid<T> {
    thread: Option<std::thread::JoinHandle<HelperResult<T>>>,
    job: Option<std::sync::mpsc::Sender<HelperJob<T>>>,
}

/// Starts `KVM_GET_SUPPORTED_CPUID` on a helper thread with its own `/dev/kvm` fd, so that it
/// overlaps with building the VM. If the thread cannot be started, [`SupportedCpuid::wait`] asks
/// on the calling thread instead. Once it has the answer the thread waits for the job handed to
/// [`SupportedCpuid::then`] and runs it; it ends when the handle is waited for or dropped.
pub fn supported_cpuid_async<T: Send + 'static>() -> SupportedCpuid<T> {
    let (tx, rx) = std::sync::mpsc::channel::<HelperJob<T>>();
    let t = std::thread::Builder::new()
        .name("cpuid".into())
        .stack_size(HELPER_STACK_SIZE)
        .spawn(move || {
            let cpuid = Kvm::new().and_then(|k| k.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES));
            let more = match (&cpuid, rx.recv()) {
                (Ok(c), Ok(job)) => Some(job(c)),
                _ => None,
            };
            (cpuid, more)
        });
    match t {
        Ok(t) => SupportedCpuid {
            thread: Some(t),
            job: Some(tx),
        },
        Err(_) => SupportedCpuid {
            thread: None,
            job: None,
        },
    }
}

impl<T> SupportedCpuid<T> {
    /// Hands `job` to the helper thread (at most once). False, and `job` dropped, when there is
    /// no helper thread.
    pub fn then(&mut self, job: impl FnOnce(&CpuId) -> T + Send + 'static) -> bool {
        match self.job.take() {
            Some(tx) => tx.send(Box::new(job)).is_ok(),
            None => false,
        }
    }

    /// The supported CPUID, and what the job handed to [`SupportedCpuid::then`] returned (None
    /// when it did not run); `kvm` answers when the helper thread could not.
    pub fn wait(mut self, kvm: &Kvm) -> Result<(CpuId, Option<T>), kvm_ioctls::Error> {
        // Without a job handed over, the helper returns once it has the CPUID.
        self.job = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok((Ok(c), more))) => Ok((c, more)),
            _ => kvm
                .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
                .map(|c| (c, None)),
        }
    }
}

impl<T> Drop for SupportedCpuid<T> {
    /// A build that fails before [`SupportedCpuid::wait`] waits for the helper here, so that
    /// nothing it holds (its `/dev/kvm` fd, the VM and vCPUs of its job) outlives the build.
    fn drop(&mut self) {
        self.job = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates the VM with its TSS, irqchip (PIC + IOAPIC), PIT and guest memory.
pub fn create_vm(kvm: &Kvm, mem: &GuestMemoryMmap, phases: &mut Phases) -> Result<VmFd, VmError> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    phases.mark("create-vm");
    vm.set_tss_address(KVM_TSS_ADDR as usize)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the host range [userspace_addr, +memory_size) is a live mapping owned by
        // `mem`, which the caller keeps alive for as long as the VM exists.
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    phases.mark("memory-regions");
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    phases.mark("irqchip");
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    phases.mark("pit");
    Ok(vm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_runs_its_job_with_the_supported_cpuid() {
        let kvm = open_kvm().unwrap();
        let mut h = supported_cpuid_async::<usize>();
        assert!(h.then(|c| c.as_slice().len()));
        let (c, n) = h.wait(&kvm).unwrap();
        assert!(!c.as_slice().is_empty());
        assert_eq!(n, Some(c.as_slice().len()));

        // Without a job the helper only answers the CPUID.
        let (c2, none) = supported_cpuid_async::<usize>().wait(&kvm).unwrap();
        assert_eq!(none, None);
        assert_eq!(c2.as_slice().len(), c.as_slice().len());

        // Dropped without a wait, the handle waits for the job the helper was given.
        let mut h = supported_cpuid_async::<usize>();
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(h.then(move |_| {
            tx.send(()).unwrap();
            1
        }));
        drop(h);
        rx.try_recv().expect("the job ran before the drop returned");
    }
}
