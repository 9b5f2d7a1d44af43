//! The parts of a built VM that a snapshot reads: KVM VM, guest RAM, devices and what the VM
//! was configured as. Owned by the VMM thread's control subscriber.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use kvm_ioctls::{Kvm, VmFd};

use crate::arch::x86_64::layout;
use crate::device_manager::attach::Devices;
use crate::snapshot::host::HostFacts;
use crate::snapshot::state::{MachineInfo, MicrovmState};
use crate::snapshot::{overlay_file_name, write_state, SnapshotSummary, SnapshotWriter};
use crate::vstate::memory::GuestRam;
use crate::vstate::persist::{self, VcpuCaps};
use crate::vstate::vcpu::{SaveSpec, VcpuHandle};

/// The mask bit of an IOAPIC redirection entry.
const IOAPIC_MASKED: u64 = 1 << 16;

pub struct Machine {
    /// /dev/kvm: the host facts and the MSR list are read from it when a snapshot is taken
    /// (not while building, where every millisecond counts).
    pub kvm: Kvm,
    pub vm: Arc<VmFd>,
    pub ram: GuestRam,
    /// The devices a snapshot saves.
    pub devices: Devices,
    pub info: MachineInfo,
    /// Shared with the vCPUs: what they read for a snapshot.
    pub save_spec: Arc<OnceLock<SaveSpec>>,
}

impl Machine {
    /// After a restore: raises again every device interrupt the guest has not taken yet (a
    /// virtio device with InterruptStatus bits set, a UART with an interrupt pending, an i8042
    /// with bytes for the guest). One injected by KVM's irqfd worker while the snapshot was read
    /// may not be in the saved interrupt controllers; an extra edge is harmless (the drivers
    /// check their device's status; the GED's `_EVT` reads no event).
    pub fn raise_pending_interrupts(&self) {
        for d in &self.devices.virtio {
            let i = d.interrupt();
            if i.status() != 0 {
                if let Err(e) = i.irq().trigger() {
                    log::warn!("re-raising GSI {}: {e}", i.irq().gsi());
                }
            }
        }
        self.devices
            .serial
            .lock()
            .expect("serial lock")
            .raise_if_pending();
        self.devices
            .i8042
            .lock()
            .expect("i8042 lock")
            .raise_if_pending();
        if let Some(pm) = &self.devices.acpi_pm {
            pm.lock().expect("ACPI lock").raise_if_pending();
        }
    }

    /// Whether the guest listens to the ACPI power button (and so runs with ACPI): the VM has
    /// ACPI and the guest unmasked the GED's pin in the IOAPIC. A kernel binds an interrupt handler there once it
    /// found the GED in the DSDT (Linux's `ged` driver does at boot); a kernel without ACPI
    /// (the shipped guest kernel) leaves the pin masked as the IOAPIC resets it, and a button
    /// press would go unnoticed.
    pub fn power_button_armed(&self) -> bool {
        if self.devices.acpi_pm.is_none() {
            return false;
        }
        let mut chip = kvm_bindings::kvm_irqchip {
            chip_id: kvm_bindings::KVM_IRQCHIP_IOAPIC,
            ..Default::default()
        };
        if let Err(e) = self.vm.get_irqchip(&mut chip) {
            log::warn!("KVM_GET_IRQCHIP (IOAPIC): {e}");
            return false;
        }
        // SAFETY: KVM_GET_IRQCHIP with chip_id KVM_IRQCHIP_IOAPIC filled the `ioapic` member of
        // the union; every bit pattern of the redirection entry is a valid u64.
        let entry = unsafe { chip.chip.ioapic.redirtbl[layout::ACPI_GED_IRQ as usize].bits };
        entry & IOAPIC_MASKED == 0
    }

    /// The IOAPIC's unmasked pins (vector, trigger mode, remote IRR: a level-triggered pin whose
    /// remote IRR stays set waits for an EOI that never came) and its pin levels, for
    /// [`crate::actions::VmmController::describe`].
    pub fn describe_ioapic(&self) -> serde_json::Value {
        let mut chip = kvm_bindings::kvm_irqchip {
            chip_id: kvm_bindings::KVM_IRQCHIP_IOAPIC,
            ..Default::default()
        };
        if let Err(e) = self.vm.get_irqchip(&mut chip) {
            return serde_json::json!({"error": format!("KVM_GET_IRQCHIP (IOAPIC): {e}")});
        }
        // SAFETY: KVM_GET_IRQCHIP with chip_id KVM_IRQCHIP_IOAPIC filled the `ioapic` member of
        // the union; every bit pattern of its fields is a valid integer.
        let ioapic = unsafe { chip.chip.ioapic };
        let pins: Vec<serde_json::Value> = (0..ioapic.redirtbl.len())
            .filter_map(|pin| {
                // SAFETY: as above; `bits` covers the whole redirection entry.
                let e = unsafe { ioapic.redirtbl[pin].bits };
                (e & IOAPIC_MASKED == 0).then(|| {
                    serde_json::json!({
                        "pin": pin,
                        "vector": e & 0xff,
                        "level": e & (1 << 15) != 0,
                        "remote_irr": e & (1 << 14) != 0,
                        "dest": e >> 56,
                    })
                })
            })
            .collect();
        serde_json::json!({"irr": format!("{:#x}", ioapic.irr), "unmasked": pins})
    }

    /// Resets every device for an in-place reboot (the vCPUs are paused): the virtio devices
    /// (a disk's request in flight is waited for; disks, overlays and TAPs stay open), the
    /// UART, the i8042 and the ACPI registers.
    pub fn reset_devices(&self) -> Result<(), String> {
        for d in &self.devices.virtio {
            d.reset();
        }
        self.devices
            .serial
            .lock()
            .expect("serial lock")
            .reset()
            .map_err(|e| e.to_string())?;
        self.devices.i8042.lock().expect("i8042 lock").reset();
        if let Some(pm) = &self.devices.acpi_pm {
            pm.lock().expect("ACPI lock").reset();
        }
        Ok(())
    }

    /// Indices of the virtio devices that are disks with a copy-on-write overlay.
    pub fn overlay_devices(&self) -> Vec<usize> {
        self.devices
            .virtio
            .iter()
            .enumerate()
            .filter(|(_, d)| d.has_overlay())
            .map(|(i, _)| i)
            .collect()
    }

    /// Makes sure the vCPUs know which MSRs to read (from /dev/kvm, once; builds that reboot
    /// in place have it from the start).
    pub fn ensure_save_spec(&self, caps: VcpuCaps) -> Result<(), String> {
        if self.save_spec.get().is_none() {
            let msr_indices =
                persist::msrs_to_save(&self.kvm).map_err(|e| format!("MSR list: {e}"))?;
            let _ = self.save_spec.set(SaveSpec { msr_indices, caps });
        }
        Ok(())
    }

    /// Writes a snapshot through `w`. The vCPUs must be paused; runs on the VMM thread (the
    /// only thread that runs device code), so nothing changes guest memory or device state
    /// meanwhile. Only writes to the descriptors in `w`; opens nothing.
    pub fn save(
        &self,
        vcpus: &mut [VcpuHandle],
        mut w: SnapshotWriter,
    ) -> Result<SnapshotSummary, String> {
        let t0 = Instant::now();
        let caps = VcpuCaps::probe(&self.kvm);
        let host = HostFacts::probe(&self.kvm, caps).map_err(|e| format!("host facts: {e}"))?;
        self.ensure_save_spec(caps)?;
        // Complete what the guest already queued; flush disks.
        for d in &self.devices.virtio {
            d.quiesce().map_err(|e| format!("quiescing devices: {e}"))?;
        }
        // The interrupt sources before the vCPUs: an interrupt the in-kernel PIT raises while
        // state is read is then either still pending at its source or already in a LAPIC that is
        // read after it, never lost in between.
        let vm = persist::save_vm(&self.vm).map_err(|e| format!("VM state: {e}"))?;
        let mut vcpu_states = Vec::with_capacity(vcpus.len());
        for v in vcpus.iter_mut() {
            vcpu_states.push(v.save_state().map_err(|e| e.to_string())?);
        }
        let (devices, overlay_bytes) = self
            .devices
            .save(|i| w.overlay(i).map(|f| (f, overlay_file_name(i))))
            .map_err(|e| e.to_string())?;
        let memory = self
            .ram
            .dump(&w.memory)
            .map_err(|e| format!("memory file: {e}"))?;
        let state = MicrovmState {
            host,
            machine: self.info.clone(),
            vm,
            vcpus: vcpu_states,
            devices,
            memory,
        };
        let state_bytes =
            write_state(&mut w.state, &state).map_err(|e| format!("state file: {e}"))?;
        for (what, f) in [("memory file", &w.memory), ("state file", &w.state)]
            .into_iter()
            .chain(w.overlays.iter().map(|(_, f)| ("overlay copy", f)))
        {
            f.sync_all().map_err(|e| format!("{what}: sync: {e}"))?;
        }
        Ok(SnapshotSummary {
            ram_bytes: memory.ram_bytes,
            touched_bytes: memory.candidate_bytes,
            memory_bytes: memory.written_bytes,
            overlay_bytes,
            state_bytes,
            paused_us: 0,
            write_us: t0.elapsed().as_micros() as u64,
            was_running: false,
        })
    }
}
