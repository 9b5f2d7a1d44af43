//! [`Vmm::restore`]: a VM from a snapshot, paused where it was saved.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kvm_bindings::CpuId;
use vm_memory::GuestAddress;

use super::{block_io, legacy_devices, BuildOptions, Parts, Reboots, RestoreConfig, VmmError};
use crate::acpi;
use crate::device_manager::attach::AttachContext;
use crate::device_manager::mmio::MmioDeviceManager;
use crate::device_manager::persist::PlanError;
use crate::event_loop::Vmm;
use crate::snapshot::LoadedSnapshot;
use crate::timing::{Clock, Phases};
use crate::vstate::memory::{self, GuestRam};
use crate::vstate::persist as vpersist;
use crate::vstate::vcpu::{self, RunMarks, Vcpu, VcpuContext};
use crate::vstate::vm;

impl Vmm {
    /// Restores the VM saved in `rc.dir`, paused: the state of every vCPU and device is in
    /// place and guest memory is mapped from the snapshot's memory file (private, loaded on
    /// demand); nothing of the guest has run when this returns, and [`Vmm::run`] continues it
    /// where it was. Every check (files, checksum, version, host CPU and KVM, memory size, disks,
    /// overrides) happens before the guest could run; an error leaves nothing behind and the
    /// snapshot's files as they were.
    pub fn restore(rc: &RestoreConfig, opts: BuildOptions) -> Result<Vmm, VmmError> {
        let start = opts.start.unwrap_or_else(Clock::now);
        let snap = LoadedSnapshot::open(&rc.dir)?;
        let st = &snap.state;
        let dir = rc.dir.display().to_string();
        let mismatch = |detail: String| VmmError::Mismatch {
            dir: dir.clone(),
            detail,
        };
        if let Some(m) = rc.expect_mem_mib.filter(|m| *m != st.machine.mem_mib) {
            return Err(mismatch(format!(
                "memory size mismatch: the snapshot has {} MiB, {m} MiB asked for",
                st.machine.mem_mib
            )));
        }
        if let Some(v) = rc
            .expect_vcpus
            .filter(|v| *v != u64::from(st.machine.vcpus))
        {
            return Err(mismatch(format!(
                "vCPU count mismatch: the snapshot has {}, {v} asked for",
                st.machine.vcpus
            )));
        }
        let mut opts = opts;
        let kvm = match opts.kvm.take() {
            Some(f) => vm::kvm_from_file(f)?,
            None => vm::open_kvm()?,
        };
        st.host.check(&kvm).map_err(|source| VmmError::Host {
            dir: dir.clone(),
            source,
        })?;
        // Which configuration each device gets; every disk image must exist before anything
        // is built.
        let plan = st.devices.plan(&rc.disks, &rc.nets).map_err(|e| match e {
            PlanError::Count { .. } => mismatch(e.to_string()),
            PlanError::Device { index, source } => VmmError::RestoreDevice {
                dir: dir.clone(),
                index,
                source,
            },
        })?;

        let regions: Vec<(GuestAddress, usize)> = st
            .machine
            .memory_regions
            .iter()
            .map(|&(a, l)| (GuestAddress(a), l as usize))
            .collect();
        let memory = snap.memory.try_clone().map_err(|e| VmmError::GuestMemory {
            mib: st.machine.mem_mib,
            detail: e.to_string(),
        })?;
        let ram = GuestRam::from_snapshot(memory, &regions).map_err(|e| VmmError::GuestMemory {
            mib: st.machine.mem_mib,
            detail: e.to_string(),
        })?;
        let mem = ram.memory().clone();
        let mut phases = Phases::new(start.wall);
        let vm = Arc::new(vm::create_vm(&kvm, &mem, &mut phases)?);
        // Real time since the snapshot: the guest's clocks advance by it (vstate/persist.rs).
        let elapsed_ns = vpersist::realtime_ns().saturating_sub(st.vm.realtime_ns);
        vpersist::restore_vm(&vm, &st.vm, elapsed_ns).map_err(|e| VmmError::RestoreState {
            dir: dir.clone(),
            detail: e.to_string(),
        })?;
        let mut p = Parts::new(kvm, vm, ram)?;
        // Overlays written for this VM are removed again if the restore fails.
        let mut written_overlays = OverlayCleanup(Vec::new());
        let mut mmio_mgr = MmioDeviceManager::new();
        let mut ctx = AttachContext {
            vm: &p.vm,
            mem: &mem,
            mmio_bus: &mut p.mmio,
            mgr: &mut mmio_mgr,
            evmgr: &mut p.event_manager,
        };
        p.virtio = st
            .devices
            .restore_virtio(
                plan,
                &mut ctx,
                |i| snap.overlay(i),
                block_io,
                &mut opts.taps,
                &mut written_overlays.0,
            )
            .map_err(|(index, source)| VmmError::RestoreDevice {
                dir: dir.clone(),
                index,
                source,
            })?;
        let legacy = legacy_devices(
            &mut p,
            &opts,
            &rc.serial,
            start,
            st.machine.acpi,
            Some(&st.devices),
        )?;
        phases.mark("devices");
        // Every restore is a possible copy: a new VM generation ID before any vCPU runs, and
        // the GED event that notifies the guest, raised once the vCPUs' interrupt controllers
        // are back (raise_pending_interrupts below).
        if let (Some(addr), Some(pm)) = (st.machine.vmgenid, &legacy.acpi_pm) {
            let id = acpi::vmgenid::GenerationId::random()?;
            id.write(&mem, addr)?;
            pm.lock().expect("ACPI lock").queue_generation_change();
            log::debug!("new VM generation ID {id} at {addr:#x}");
        }
        phases.mark("vmgenid");

        vcpu::install_kick_handler()?;
        // Restored vCPUs take their CPUID from the snapshot.
        let no_cpuid = CpuId::new(0).map_err(|e| VmmError::Kvm(format!("CPUID table: {e:?}")))?;
        let marks = Arc::new(RunMarks::new(start.wall));
        let save_spec = Arc::new(OnceLock::new());
        let ctx = VcpuContext {
            vm: &p.vm,
            mem: &mem,
            base_cpuid: &no_cpuid,
            count: st.machine.vcpus,
            pio: Arc::new(p.pio.clone()),
            mmio: Arc::new(p.mmio.clone()),
            marks: marks.clone(),
            save_spec: save_spec.clone(),
            reset: legacy.reset.clone(),
            poweroff: legacy.poweroff.clone(),
        };
        let tsc_scaling = p.kvm.check_extension(kvm_ioctls::Cap::TscControl);
        let mut vcpus = Vec::with_capacity(st.vcpus.len());
        for vs in &st.vcpus {
            let khz = vs.tsc_khz.unwrap_or(0);
            let v = Vcpu::restore(&ctx, vs, vpersist::tsc_ticks(elapsed_ns, khz), tsc_scaling)?;
            vcpus.push(v);
        }
        let info = st.machine.clone();
        let notify = opts.boot_notify.clone().map(|tx| (start, tx));
        // A restored VM has no kernel to load again: a guest reboot ends it.
        let vmm = Self::assemble(
            p,
            legacy,
            vcpus,
            save_spec,
            info,
            start,
            marks,
            notify,
            opts.thread_hook,
            Reboots {
                image: None,
                if_acpi: false,
                notify: None,
            },
        )?;
        vmm.control
            .lock()
            .expect("control lock")
            .machine
            .raise_pending_interrupts();
        written_overlays.0.clear();
        log::info!(
            "restored a snapshot taken {} ms ago; the guest's clocks advanced by that",
            elapsed_ns / 1_000_000
        );
        log::debug!(
            "restored VM from {}: {} vCPU(s), {} MiB (2 MiB aligned: {}); {phases}",
            rc.dir.display(),
            st.machine.vcpus,
            st.machine.mem_mib,
            memory::huge_page_aligned(&mem),
        );
        Ok(Vmm {
            restored: true,
            ..vmm
        })
    }
}

/// Removes overlay files a failed restore created.
struct OverlayCleanup(Vec<PathBuf>);

impl Drop for OverlayCleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}
