//! The `vmgenid` scenario: finds the VM generation ID device in the DSDT as a kernel's driver
//! would (`\_SB.VGEN`, its `_HID`/`_CID` and the address its `ADDR` method returns; read from the
//! AML bytes, this guest has no interpreter), reads the 16-byte ID there, arms the GED's
//! interrupt and waits for the VMM's generation-change event on the GED event port, printing the
//! ID it then reads.

use crate::acpi;
use crate::bootinfo::BootInfo;
use crate::io::{inb, mmio_read32, mmio_write32, pause, phys_range_ok, phys_read};
use crate::parse::aml_vmgenid;
use crate::{finish, print, println};

/// The VMM's GED event register and its generation-change bit (microvirt
/// `vmm/src/devices/acpi.rs`; the DSDT's `_EVT` notifies `\_SB.VGEN` for it).
const GED_EVENT_PORT: u16 = 0x600;
const GED_VMGENID: u8 = 1 << 1;
/// The local APIC: its spurious-vector register (bit 8 enables it, so that it accepts the GED's
/// interrupt) and the IRR word holding [`GED_VECTOR`].
const LAPIC_SVR: u64 = 0xfee0_00f0;
const GED_VECTOR: u32 = 0x40;
const LAPIC_IRR_GED: u64 = 0xfee0_0200 + 0x10 * (GED_VECTOR as u64 / 32);
/// How long to look for the GED's interrupt in the IRR after its event (~seconds of `pause`).
const IRQ_POLLS: u32 = 200_000_000;
/// The ACPI table header's length: the AML follows it.
const SDT_HEADER: u64 = 36;

fn print_id(addr: u64) {
    let mut id = [0u8; 16];
    if !phys_read(addr, &mut id) {
        print!("unreadable");
        return;
    }
    for b in id {
        print!("{:02x}", b);
    }
}

pub fn run(bi: &BootInfo) -> ! {
    let Some((dsdt, len)) = acpi::discover(bi).and_then(|p| p.dsdt) else {
        println!("vmgenid: no dsdt");
        finish()
    };
    let body = dsdt + SDT_HEADER;
    let body_len = u64::from(len).saturating_sub(SDT_HEADER);
    if !phys_range_ok(body, body_len) {
        println!("vmgenid: dsdt outside memory");
        finish()
    }
    // SAFETY: the range was checked to lie in the identity-mapped low 4 GiB (phys_range_ok);
    // the DSDT is in RAM the VMM wrote before the guest ran and nothing writes it meanwhile.
    let aml = unsafe { core::slice::from_raw_parts(body as usize as *const u8, body_len as usize) };
    let Some(dev) = aml_vmgenid(aml, b"VGEN") else {
        println!("vmgenid: no device");
        finish()
    };
    let Some(addr) = dev.addr.filter(|&a| phys_range_ok(a, 16)) else {
        println!("vmgenid: device=VGEN without a usable ADDR");
        finish()
    };
    println!(
        "vmgenid: device=VGEN hid={} cid={} addr={:#x} ram={}",
        u8::from(dev.hid),
        u8::from(dev.cid),
        addr,
        u8::from(bi.in_ram(addr, 16))
    );
    // As a kernel's GED driver does: the GED's pin unmasked; with the local APIC enabled and
    // interrupts off, the interrupt waits in the IRR where this guest looks for it.
    mmio_write32(LAPIC_SVR, mmio_read32(LAPIC_SVR) | 0x1ff);
    acpi::arm_power_button();
    print!("vmgenid: id=");
    print_id(addr);
    println!();
    println!("vmgenid: waiting for a change");
    let mut changes = 0u32;
    loop {
        if inb(GED_EVENT_PORT) & GED_VMGENID != 0 {
            changes += 1;
            // KVM injects an irqfd's interrupt from a worker: it may reach the IRR a moment
            // after the event register shows the event.
            let mut irq = false;
            for _ in 0..IRQ_POLLS {
                irq = mmio_read32(LAPIC_IRR_GED) & (1 << (GED_VECTOR % 32)) != 0;
                if irq {
                    break;
                }
                pause();
            }
            print!("vmgenid: notified n={} irq={} id=", changes, u8::from(irq));
            print_id(addr);
            println!();
        }
        pause();
    }
}
