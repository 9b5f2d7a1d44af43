//! [`Vmm::build`]: a VM from a kernel — guest memory, the kernel and initrd, the boot
//! information and tables, the devices and the vCPUs, all paused.

use std::sync::{Arc, OnceLock};

use kvm_ioctls::VcpuFd;

use super::{block_io, legacy_devices, BuildOptions, Parts, Reboots, VmmError, DEFAULT_CMDLINE};
use crate::acpi;
use crate::arch::x86_64::{boot, cpuid, mptable};
use crate::config::{RebootPolicy, SerialConfig, VmConfig};
use crate::device_manager::attach::{self, AttachedDevice};
use crate::device_manager::mmio::MmioDeviceManager;
use crate::event_loop::Vmm;
use crate::reboot::{BootImage, Loaded};
use crate::snapshot::state::MachineInfo;
use crate::timing::{Clock, Phases};
use crate::vstate::memory::{self, GuestRam};
use crate::vstate::persist as vpersist;
use crate::vstate::vcpu::{self, RunMarks, SaveSpec, Vcpu, VcpuContext};
use crate::vstate::vm;

fn compose_cmdline(cfg: &VmConfig, device_entries: &[String]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if cfg.default_cmdline {
        if cfg.serial != SerialConfig::None {
            parts.push("console=ttyS0".into());
        }
        parts.push(DEFAULT_CMDLINE.into());
    }
    parts.extend(device_entries.iter().cloned());
    if let Some(user) = cfg
        .cmdline
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        parts.push(user.to_string());
    }
    parts.join(" ")
}

impl Vmm {
    /// Builds the whole VM, paused: nothing guest-visible has run when this returns.
    pub fn build(cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, VmmError> {
        let start = opts.start.unwrap_or_else(Clock::now);
        cfg.validate()?;
        let vcpu_count = cfg.vcpu_count();
        let mem_size = cfg.mem_mib << 20;

        let mut phases = Phases::new(start.wall);
        let mut opts = opts;
        let kvm = match opts.kvm.take() {
            Some(f) => vm::kvm_from_file(f)?,
            None => vm::open_kvm()?,
        };
        // KVM_GET_SUPPORTED_CPUID takes a while (hundreds of CPUID instructions, each a trap when
        // the host is itself virtualized): ask on the side while the VM is created. The same
        // helper thread then creates and sets up the vCPUs (below).
        let tsc_deadline = kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
        let mut helper = vm::supported_cpuid_async::<Result<Vec<VcpuFd>, vcpu::VcpuError>>();
        phases.mark("open-kvm");
        let regions = boot::memory_regions(mem_size);
        let ram = GuestRam::create(&regions).map_err(|e| VmmError::GuestMemory {
            mib: cfg.mem_mib,
            detail: e.to_string(),
        })?;
        let mem = ram.memory().clone();
        phases.mark("guest-memory");
        let vm = Arc::new(vm::create_vm(&kvm, &mem, &mut phases)?);
        // With the irqchip in place the vCPUs can be created: the helper thread does their own
        // set-up (KVM_CREATE_VCPU, CPUID, MSRs, FPU, LAPIC; each vCPU ioctl costs tens of
        // microseconds on a nested host) while this thread loads the kernel and builds the
        // devices. docs/boot-time.md, "VMM start-up".
        let helper_vm = vm.clone();
        helper.then(move |supported| {
            let mut base = supported.clone();
            if tsc_deadline {
                cpuid::enable_tsc_deadline(&mut base);
            }
            (0..vcpu_count)
                .map(|id| Vcpu::prepare_fd(&helper_vm, &base, id, vcpu_count))
                .collect()
        });

        // Kernel, initrd, command line, boot information, MP table. The files stay open for
        // in-place reboots (reboot.rs), which load them again.
        let kernel_shown = cfg.kernel.display().to_string();
        let mut kernel_file = boot::open_kernel(&cfg.kernel)?;
        let kernel = boot::load_kernel_file(&mem, mem_size, &mut kernel_file, &kernel_shown)?;
        let (initrd, initrd_file) = match &cfg.initrd {
            Some(p) => {
                let shown = p.display().to_string();
                let mut f =
                    std::fs::File::open(p).map_err(|source| boot::BootError::ReadInitrd {
                        path: shown.clone(),
                        source,
                    })?;
                let at = boot::load_initrd_file(&mem, mem_size, &mut f, &shown, &kernel)?;
                (Some(at), Some((f, shown)))
            }
            None => (None, None),
        };
        phases.mark("load-kernel");
        let mut p = Parts::new(kvm, vm, ram)?;

        // virtio devices: the device manager assigns slots and IRQs, in config order.
        let mut mmio_mgr = MmioDeviceManager::new();
        for (i, disk) in cfg.disks.iter().enumerate() {
            let a = attach::attach_block(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
                disk,
                block_io(i),
            )?;
            p.virtio.push(AttachedDevice::Block {
                slot: a.slot,
                config: disk.clone(),
                transport: a.transport,
                device: a.device,
            });
        }
        let mut taps = std::mem::take(&mut opts.taps);
        for net in &cfg.nets {
            let opened = taps
                .iter()
                .position(|t| t.name() == net.tap)
                .map(|i| taps.swap_remove(i));
            let a = attach::attach_net(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
                net,
                opened,
            )?;
            p.virtio.push(AttachedDevice::Net {
                slot: a.slot,
                config: net.clone(),
                transport: a.transport,
                device: a.device,
            });
        }
        if cfg.rng.is_some() {
            let a = attach::attach_rng(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
            )?;
            p.virtio.push(AttachedDevice::Rng {
                slot: a.slot,
                transport: a.transport,
                device: a.device,
            });
        }

        phases.mark("virtio-devices");
        // The device manager's list is the one source for both the command line's
        // virtio_mmio.device= entries and the DSDT. With ACPI on, the MP table and the
        // command-line entries stay: kernels without ACPI (or without
        // CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES) still find CPUs and devices, and a kernel with
        // both ignores the MP table once it has a MADT. A kernel that has ACPI and the
        // command-line devices registers each device twice; the second registration should
        // fail on the MMIO region the first claimed (a log line, not a lost device; not yet
        // seen with a real kernel). vmm/README.md ("ACPI").
        let cmdline = compose_cmdline(cfg, &mmio_mgr.cmdline_entries());
        boot::write_cmdline(&mem, &cmdline)?;
        // With ACPI, the DSDT's \_SB.VGEN points at a random VM generation ID (acpi/vmgenid.rs).
        let (rsdp, vmgenid) = if cfg.acpi {
            let tables = acpi::create(vcpu_count, &mmio_mgr)?;
            tables.write(&mem)?;
            let genid = acpi::vmgenid::install(&mem)?;
            (Some(tables.rsdp_addr()), Some(genid))
        } else {
            (None, None)
        };
        boot::write_boot_info(&mem, &kernel, mem_size, cmdline.len(), initrd, rsdp)?;
        mptable::setup(&mem, vcpu_count)?;

        let legacy = legacy_devices(&mut p, &opts, &cfg.serial, start, cfg.acpi, None)?;
        phases.mark("boot-info+legacy-devices");

        // vCPUs, created paused.
        vcpu::install_kick_handler()?;
        let (mut base_cpuid, prepared) = helper.wait(&p.kvm).map_err(VmmError::Cpuid)?;
        if tsc_deadline {
            cpuid::enable_tsc_deadline(&mut base_cpuid);
        }
        let prepared = prepared.transpose()?;
        phases.mark("helper-wait");
        let marks = Arc::new(RunMarks::new(start.wall));
        let save_spec = Arc::new(OnceLock::new());
        // In-place reboots put every vCPU back into the state it is built in, read back in
        // full (the MSR list comes from /dev/kvm, as for a snapshot).
        let in_place = cfg.reboot != RebootPolicy::Exit;
        if in_place {
            let caps = vpersist::VcpuCaps::probe(&p.kvm);
            let msr_indices = vpersist::msrs_to_save(&p.kvm)
                .map_err(|e| VmmError::Kvm(format!("MSR list: {e}")))?;
            let _ = save_spec.set(SaveSpec { msr_indices, caps });
        }
        let info = MachineInfo {
            mem_mib: cfg.mem_mib,
            vcpus: vcpu_count,
            cmdline: cmdline.clone(),
            memory_regions: regions.iter().map(|r| (r.0 .0, r.1 as u64)).collect(),
            acpi: cfg.acpi,
            vmgenid,
        };
        let ctx = VcpuContext {
            vm: &p.vm,
            mem: &mem,
            base_cpuid: &base_cpuid,
            count: vcpu_count,
            pio: Arc::new(p.pio.clone()),
            mmio: Arc::new(p.mmio.clone()),
            marks: marks.clone(),
            save_spec: save_spec.clone(),
            reset: legacy.reset.clone(),
            poweroff: legacy.poweroff.clone(),
        };
        let mut vcpus = Vec::with_capacity(vcpu_count as usize);
        let (kernel_protocol, kernel_entry) = (kernel.protocol, kernel.entry);
        // Without the helper thread, the whole set-up happens here.
        let mut prepared = prepared.map(Vec::into_iter);
        for id in 0..vcpu_count {
            let boot = (id == 0).then_some((kernel_protocol, kernel_entry));
            let fd = match prepared.as_mut().and_then(Iterator::next) {
                Some(fd) => fd,
                None => Vcpu::prepare_fd(&p.vm, &base_cpuid, id, vcpu_count)?,
            };
            vcpus.push(Vcpu::from_prepared(&ctx, id, fd, boot, in_place)?);
        }
        phases.mark("vcpus");
        let boot_image = if in_place {
            let loaded = Loaded {
                kernel: kernel_file,
                kernel_shown,
                kernel_loaded: kernel,
                initrd: initrd_file,
                initrd_at: initrd,
            };
            let image = BootImage::capture(loaded, &p.ram, mem_size, &p.vm)
                .map_err(|e| VmmError::Kvm(e.to_string()))?;
            phases.mark("boot-image");
            log::debug!(
                "in-place reboots: {} KiB of low memory kept",
                image.kept_bytes() >> 10
            );
            Some(image)
        } else {
            None
        };
        let aligned = memory::huge_page_aligned(&mem);
        let (protocol, entry) = (kernel_protocol, kernel_entry);
        let vmm = Self::assemble(
            p,
            legacy,
            vcpus,
            save_spec,
            info,
            start,
            marks,
            None,
            opts.thread_hook,
            Reboots {
                image: boot_image,
                if_acpi: cfg.reboot == RebootPolicy::InPlaceIfAcpi,
                notify: opts.reboot_notify,
            },
        )?;
        phases.mark("threads+control");
        log::debug!(
            "built VM: {} vCPU(s), {} MiB (2 MiB aligned: {aligned}), {:?} entry {:#x}, in {} us: {phases}",
            vcpu_count,
            cfg.mem_mib,
            protocol,
            entry,
            vmm.timings.build_us,
        );
        Ok(vmm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::ExitReason;

    #[test]
    fn cmdline_composition() {
        let mut cfg = VmConfig::new("/k");
        cfg.cmdline = Some(" quiet ".into());
        let c = compose_cmdline(&cfg, &["virtio_mmio.device=4K@0xc0001000:5".into()]);
        assert!(c.starts_with("console=ttyS0 reboot=k"));
        assert!(!c.split(' ').any(|a| a == "nomodule"), "{c}");
        assert!(c.ends_with("virtio_mmio.device=4K@0xc0001000:5 quiet"));
        cfg.serial = SerialConfig::None;
        cfg.default_cmdline = false;
        assert_eq!(compose_cmdline(&cfg, &[]), "quiet");
        assert_eq!(ExitReason::GuestReset.exit_code(), 0);
        assert_ne!(ExitReason::Fault("x".into()).exit_code(), 0);
    }
}
