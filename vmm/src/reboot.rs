//! In-place reboots (`RebootPolicy::InPlace`): what a guest-initiated reboot puts back.
//!
//! A VM built for in-place reboots keeps, from its build, a [`BootImage`]: the kernel and
//! initrd files (open: the launcher's VMM thread may not open files), the guest RAM below
//! 1 MiB as the build wrote it (boot information, command line, MP table, ACPI tables, the boot
//! vCPU's GDT and page tables; only the pages it wrote, found with `SEEK_DATA`) and the interrupt
//! controllers' and PIT's state before the first run. Each vCPU keeps its own boot state
//! (`Vcpu::new(.., keep_boot_state)`).
//!
//! A reboot, on the VMM thread with every vCPU paused, its paravirtual MSRs turned off (KVM
//! must not write the old kernel's kvm-clock, steal-time or PV EOI areas into the new kernel's
//! RAM: `persist::paravirt_off`) and the devices reset (`Control::reboot` in event_loop.rs):
//! [`BootImage::load`] puts the irqchip and PIT back,
//! zeroes all RAM ([`GuestRam::clear`]), writes the low pages back and loads the kernel and
//! initrd again from their files; then every vCPU goes back to its boot state. The result is
//! the VM as `Vmm::build` left it, with the same disks, overlays, TAPs and console.

use std::fs::File;

use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress};

use crate::arch::x86_64::boot::{self, LoadedKernel};
use crate::vstate::memory::{self, Backing, GuestRam};
use crate::vstate::persist::{self, VmState};

/// Guest RAM below this address is kept as the build wrote it.
pub const LOW_MEMORY_END: u64 = 0x10_0000;
const PAGE: usize = 4096;

/// What an in-place reboot loads again (see the module documentation).
pub struct BootImage {
    kernel: File,
    kernel_shown: String,
    initrd: Option<(File, String)>,
    mem_size: u64,
    /// Where the build put the kernel's entry and the initrd: a reboot must put them there too
    /// (the boot information and the boot vCPU's registers point at them).
    entry: u64,
    initrd_at: Option<(u64, u64)>,
    /// The pages below [`LOW_MEMORY_END`] the build wrote: (address, contents).
    low_pages: Vec<(u64, Vec<u8>)>,
    /// Interrupt controllers and PIT before the first run.
    vm_state: VmState,
}

/// Why a reboot could not put the VM back.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("reading the boot state: {0}")]
    Capture(String),
    #[error("resetting the interrupt controllers: {0}")]
    Irqchip(persist::StateError),
    #[error("clearing guest RAM: {0}")]
    Clear(crate::vstate::memory::MemoryError),
    #[error("writing the boot information back: {0}")]
    LowMemory(String),
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    #[error("{0} changed since the VM was built (loaded elsewhere now); cannot reboot in place")]
    Changed(&'static str),
}

/// The files and results of the build's kernel and initrd loading.
pub struct Loaded {
    pub kernel: File,
    pub kernel_shown: String,
    pub kernel_loaded: LoadedKernel,
    pub initrd: Option<(File, String)>,
    pub initrd_at: Option<(u64, u64)>,
}

impl BootImage {
    /// Captures the boot image of a VM that was just built (nothing has run).
    pub fn capture(
        loaded: Loaded,
        ram: &GuestRam,
        mem_size: u64,
        vm: &VmFd,
    ) -> Result<Self, RebootError> {
        let vm_state = persist::save_vm(vm).map_err(|e| RebootError::Capture(e.to_string()))?;
        // Only the pages the build wrote hold data in the memfd (the first RAM region starts
        // at guest address 0 and file offset 0): the others are holes and need no copy.
        let Backing::Memfd(file) = ram.backing() else {
            return Err(RebootError::Capture(
                "guest RAM is not a fresh VM's memfd".into(),
            ));
        };
        let written = memory::data_extents(file, 0, LOW_MEMORY_END.min(mem_size))
            .map_err(|e| RebootError::Capture(e.to_string()))?;
        let mem = ram.memory();
        let mut low_pages = Vec::new();
        for (start, end) in written {
            for addr in (start..end).step_by(PAGE) {
                let mut page = vec![0u8; PAGE];
                mem.read_slice(&mut page, GuestAddress(addr))
                    .map_err(|e| RebootError::Capture(format!("guest RAM at {addr:#x}: {e}")))?;
                low_pages.push((addr, page));
            }
        }
        Ok(Self {
            kernel: loaded.kernel,
            kernel_shown: loaded.kernel_shown,
            initrd: loaded.initrd,
            mem_size,
            entry: loaded.kernel_loaded.entry,
            initrd_at: loaded.initrd_at,
            low_pages,
            vm_state,
        })
    }

    /// Puts irqchip, PIT and RAM back as the build left them. The vCPUs must be paused and the
    /// devices reset (nothing may touch guest memory meanwhile).
    pub fn load(&mut self, ram: &GuestRam, vm: &VmFd) -> Result<(), RebootError> {
        persist::reset_vm(vm, &self.vm_state).map_err(RebootError::Irqchip)?;
        ram.clear().map_err(RebootError::Clear)?;
        let mem = ram.memory();
        for (addr, page) in &self.low_pages {
            mem.write_slice(page, GuestAddress(*addr))
                .map_err(|e| RebootError::LowMemory(format!("at {addr:#x}: {e}")))?;
        }
        let k = boot::load_kernel_file(mem, self.mem_size, &mut self.kernel, &self.kernel_shown)?;
        if k.entry != self.entry {
            return Err(RebootError::Changed("the kernel"));
        }
        if let Some((f, shown)) = &mut self.initrd {
            let at = boot::load_initrd_file(mem, self.mem_size, f, shown, &k)?;
            if Some(at) != self.initrd_at {
                return Err(RebootError::Changed("the initrd"));
            }
        }
        Ok(())
    }

    /// Host memory the image holds (the low pages), in bytes.
    pub fn kept_bytes(&self) -> usize {
        self.low_pages.len() * PAGE
    }
}
