//! ACPI, as a guest kernel reads it: the RSDP (from the boot information, else by scanning
//! 0xe0000..0x100000), the XSDT and every table it lists (signature, length, checksum), the
//! MADT's local APICs and IOAPICs, the DSDT and its `\_S5_` sleep type; power-off through the
//! FADT's sleep control register. Every pointer and length read from the tables is bounded.

use crate::bootinfo::BootInfo;
use crate::io::{inb, mmio_write32, outb, pause, phys_read, phys_u32, phys_u64, phys_u8};
use crate::{print, println};

const SCAN_START: u64 = 0xe_0000;
const SCAN_END: u64 = 0x10_0000;
/// Larger tables are refused (ours are a few KiB).
const MAX_TABLE_LEN: u32 = 0x1_0000;
/// Most XSDT entries walked.
const MAX_ENTRIES: u32 = 32;
/// GAS address space of system I/O ports.
const GAS_SYSTEM_IO: u8 = 1;
/// The sleep control register's enable bit and type shift (ACPI 6.5 §4.8.3.7).
const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;
/// The VMM's GED event register (microvirt `vmm/src/devices/acpi.rs`): the DSDT's `_EVT` reads
/// it; this guest has no AML interpreter, so it polls the port the VMM documents.
const GED_EVENT_PORT: u16 = 0x600;
const GED_POWER_BUTTON: u8 = 1;
/// The GED's interrupt (its `_CRS` in the VMM's DSDT; no AML interpreter here either) and the
/// IOAPIC the MADT names (the VMM's layout).
const GED_GSI: u32 = 3;
const IOAPIC_BASE: u64 = 0xfec0_0000;
/// The vector the armed GED pin delivers (interrupts stay disabled: it only waits in the IRR).
const GED_VECTOR: u32 = 0x40;

fn checksum_ok(addr: u64, len: u64) -> bool {
    let mut buf = [0u8; 256];
    let mut sum = 0u8;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        if !phys_read(addr + off, &mut buf[..n]) {
            return false;
        }
        sum = buf[..n].iter().fold(sum, |s, &b| s.wrapping_add(b));
        off += n as u64;
    }
    sum == 0
}

fn signature(addr: u64) -> [u8; 4] {
    phys_u32(addr).to_le_bytes()
}

/// The table's length when its header and checksum are sound.
fn table_len(addr: u64) -> Option<u32> {
    let len = phys_u32(addr.checked_add(4)?);
    ((36..=MAX_TABLE_LEN).contains(&len) && checksum_ok(addr, u64::from(len))).then_some(len)
}

fn rsdp_ok(addr: u64) -> bool {
    phys_u64(addr) == u64::from_le_bytes(*b"RSD PTR ") && checksum_ok(addr, 20)
}

fn scan_rsdp() -> Option<u64> {
    (SCAN_START..SCAN_END).step_by(16).find(|&a| rsdp_ok(a))
}

fn print_sig(sig: &[u8; 4]) {
    for &b in sig {
        let c = if b.is_ascii_graphic() { b } else { b'?' };
        print!("{}", c as char);
    }
}

/// The first element of the `\_S5_` package in the AML `[start, start + len)`: the search
/// looks for `NameOp "_S5_" PackageOp`.
fn s5_sleep_type(start: u64, len: u32) -> Option<u8> {
    let end = start + u64::from(len);
    let mut a = start;
    while a + 8 < end {
        if phys_u8(a) == 0x08 && phys_u32(a + 1) == u32::from_le_bytes(*b"_S5_") {
            let pkg = a + 5;
            if phys_u8(pkg) != 0x12 {
                return None;
            }
            // PkgLength: bits 6-7 of the lead byte give the number of extra bytes.
            let extra = u64::from(phys_u8(pkg + 1) >> 6);
            let first = pkg + 2 + extra + 1; // after NumElements
            return match phys_u8(first) {
                0x00 => Some(0),
                0x01 => Some(1),
                0x0a => Some(phys_u8(first + 1)),
                _ => None,
            };
        }
        a += 1;
    }
    None
}

/// What the tables said.
#[derive(Default)]
struct Found {
    tables: u32,
    bad: u32,
    lapics: u32,
    ioapics: u32,
    dsdt: Option<(u64, u32)>,
    sleep_port: Option<u16>,
    /// The FADT's RESET_REG (a system I/O port) and RESET_VALUE.
    reset: Option<(u16, u8)>,
}

fn madt(addr: u64, len: u32, f: &mut Found) {
    let end = addr + u64::from(len);
    let mut p = addr + 44;
    while p + 2 <= end {
        let (ty, l) = (phys_u8(p), u64::from(phys_u8(p + 1)));
        if l < 2 || p + l > end {
            break;
        }
        match ty {
            0 if phys_u32(p + 4) & 1 != 0 => f.lapics += 1,
            1 => f.ioapics += 1,
            _ => {}
        }
        p += l;
    }
}

fn fadt(addr: u64, len: u32, f: &mut Found) {
    if len >= 148 {
        let dsdt = phys_u64(addr + 140);
        if let Some(l) = table_len(dsdt).filter(|_| signature(dsdt) == *b"DSDT") {
            f.dsdt = Some((dsdt, l));
        }
    }
    // SLEEP_CONTROL_REG (ACPI 5+), a GAS at 244: the guest only powers off through ports.
    if len >= 256 && phys_u8(addr + 244) == GAS_SYSTEM_IO {
        f.sleep_port = u16::try_from(phys_u64(addr + 248)).ok();
    }
    // RESET_REG, a GAS at 116, and RESET_VALUE at 128 (ACPI 2+).
    if len >= 129 && phys_u8(addr + 116) == GAS_SYSTEM_IO {
        if let Ok(port) = u16::try_from(phys_u64(addr + 120)) {
            f.reset = Some((port, phys_u8(addr + 128)));
        }
    }
}

/// What a kernel needs to power off and reset through ACPI, found without printing.
#[derive(Clone, Copy)]
pub struct Platform {
    /// The FADT's sleep control port and the `SLP_TYP` of `\_S5_`.
    pub sleep: Option<(u16, u8)>,
    /// The FADT's reset port and value.
    pub reset: Option<(u16, u8)>,
    /// The DSDT (address, length), its header and checksum sound.
    pub dsdt: Option<(u64, u32)>,
}

/// Walks the tables (RSDP from the boot information, else the scan) without checksumming them
/// again: `None` without a sound RSDP and XSDT.
pub fn discover(bi: &BootInfo) -> Option<Platform> {
    let rsdp = if bi.rsdp != 0 { bi.rsdp } else { scan_rsdp()? };
    if !rsdp_ok(rsdp) || phys_u8(rsdp + 15) < 2 {
        return None;
    }
    let xsdt = phys_u64(rsdp + 24);
    let xlen = table_len(xsdt).filter(|_| signature(xsdt) == *b"XSDT")?;
    let mut f = Found::default();
    for i in 0..((xlen - 36) / 8).min(MAX_ENTRIES) {
        let t = phys_u64(xsdt + 36 + u64::from(i) * 8);
        if signature(t) == *b"FACP" {
            if let Some(len) = table_len(t) {
                fadt(t, len, &mut f);
            }
        }
    }
    let s5 = f.dsdt.and_then(|(a, l)| s5_sleep_type(a, l));
    Some(Platform {
        sleep: f.sleep_port.zip(s5),
        reset: f.reset,
        dsdt: f.dsdt,
    })
}

/// Arms the power button as a kernel's GED driver does when it binds: the GED's IOAPIC pin is
/// unmasked (edge, active high, to the BSP). The VMM presses the button on a shutdown request
/// only when it sees this pin unmasked; else it sends Ctrl-Alt-Del.
pub fn arm_power_button() {
    let entry = 0x10 + 2 * GED_GSI;
    // High half first (destination APIC ID 0), then the low half, which unmasks.
    mmio_write32(IOAPIC_BASE, entry + 1);
    mmio_write32(IOAPIC_BASE + 0x10, 0);
    mmio_write32(IOAPIC_BASE, entry);
    mmio_write32(IOAPIC_BASE + 0x10, GED_VECTOR);
}

/// Reads (and so clears) the GED's pending events: whether the power button was pressed.
pub fn power_button_pressed() -> bool {
    inb(GED_EVENT_PORT) & GED_POWER_BUTTON != 0
}

/// Enters S5 through the sleep control register (the VMM ends the VM as a guest power-off).
pub fn power_off(port: u16, typ: u8) -> ! {
    println!("acpi: powering off through port {:#x}", port);
    // A byte write: the FADT's GAS says the register is 8 bits wide.
    outb(port, (typ << SLP_TYP_SHIFT) | SLP_EN);
    // The VMM stops the vCPUs a moment later (as after an i8042 reset).
    crate::io::halt_forever()
}

/// Writes the FADT's reset value to its reset register and returns: the guest runs on until
/// the VMM takes the reset.
pub fn reset(port: u16, value: u8) {
    outb(port, value);
}

/// The `acpi` scenario: report the tables, optionally wait for the power button
/// (`testguest.acpi_button=1`), then power off through the sleep control register. Without
/// ACPI it says so and resets.
pub fn run(bi: &BootInfo) -> ! {
    let (rsdp, via) = if bi.rsdp != 0 {
        (Some(bi.rsdp), "bootinfo")
    } else {
        (scan_rsdp(), "scan")
    };
    let Some(rsdp) = rsdp else {
        println!("acpi: no rsdp");
        crate::reset()
    };
    let rsdp_sound = rsdp_ok(rsdp)
        && phys_u8(rsdp + 15) >= 2
        && phys_u32(rsdp + 20) == 36
        && checksum_ok(rsdp, 36);
    println!(
        "acpi: rsdp={:#x} via={} checksum={}",
        rsdp,
        via,
        if rsdp_sound { "ok" } else { "BAD" }
    );
    if !rsdp_sound {
        crate::reset()
    }
    let xsdt = phys_u64(rsdp + 24);
    let Some(xlen) = table_len(xsdt).filter(|_| signature(xsdt) == *b"XSDT") else {
        println!("acpi: xsdt at {:#x} BAD", xsdt);
        crate::reset()
    };
    let mut f = Found::default();
    let n = ((xlen - 36) / 8).min(MAX_ENTRIES);
    print!("acpi: xsdt entries={}:", n);
    for i in 0..n {
        let t = phys_u64(xsdt + 36 + u64::from(i) * 8);
        let sig = signature(t);
        print!(" ");
        print_sig(&sig);
        f.tables += 1;
        let Some(len) = table_len(t) else {
            print!("(BAD)");
            f.bad += 1;
            continue;
        };
        match &sig {
            b"APIC" => madt(t, len, &mut f),
            b"FACP" => fadt(t, len, &mut f),
            _ => {}
        }
    }
    println!();
    println!("acpi: madt lapics={} ioapics={}", f.lapics, f.ioapics);
    let s5 = match f.dsdt {
        Some((addr, len)) => {
            let s5 = s5_sleep_type(addr, len);
            print!("acpi: dsdt len={} checksum=ok s5=", len);
            match s5 {
                Some(t) => println!("{}", t),
                None => println!("none"),
            }
            s5
        }
        None => {
            println!("acpi: dsdt BAD");
            None
        }
    };
    println!("acpi: tables={} bad={}", f.tables, f.bad);
    let (Some(port), Some(typ)) = (f.sleep_port, s5) else {
        println!("acpi: no sleep control register or no \\_S5_");
        crate::reset()
    };
    if bi.param("testguest.acpi_button") == Some(b"1") {
        arm_power_button();
        println!("acpi: waiting for the power button");
        while !power_button_pressed() {
            pause();
        }
        println!("acpi: power button pressed");
    }
    power_off(port, typ)
}
