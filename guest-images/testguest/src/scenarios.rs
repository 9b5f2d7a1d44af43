//! The scenarios selected by `testguest.scenario=NAME`.

use crate::bootinfo::BootInfo;
use crate::io::{halt_forever, inb, inl, mmio_read32, mmio_write32, outb, outl, pause};
use crate::{finish, i8042, print, println, serial, triple_fault, Fault};

/// Longest echoed line; longer input is echoed in pieces of this size.
const LINE_MAX: usize = 256;
/// Most i8042 bytes shown in the `i8042:` line.
const KBD_LOG_MAX: usize = 32;
/// After Ctrl+Alt+Del, stop collecting bytes after this many empty status polls.
const KBD_DRAIN_IDLE_POLLS: u32 = 2000;

/// Runs the scenario named on the command line (default `basic`).
pub fn run(bi: &BootInfo) -> ! {
    let name = bi.param("testguest.scenario").unwrap_or(b"basic");
    match name {
        b"basic" => basic(),
        b"echo" => echo(),
        b"ctrlaltdel" => ctrl_alt_del(bi),
        b"triple-fault" => {
            let fault = match bi.param("testguest.fault") {
                Some(b"ud2") => Fault::InvalidOpcode,
                Some(b"de") => Fault::DivideError,
                Some(b"gp") => Fault::GeneralProtection,
                _ => Fault::Breakpoint,
            };
            println!("triple-fault: now");
            triple_fault(fault)
        }
        b"unknown-io" => unknown_io(),
        b"blk" => {
            crate::blk::run(bi);
            finish()
        }
        b"net" => {
            crate::net::run(bi, false);
            finish()
        }
        b"net-serve" => crate::netserve::run(bi),
        b"net-many" => {
            crate::net::run(bi, true);
            finish()
        }
        b"counter" => crate::snap::counter(bi),
        b"ticker" => crate::ticker::run(bi),
        b"stream" => {
            crate::snap::stream(bi);
            finish()
        }
        b"rng" => {
            crate::rng::run(bi);
            finish()
        }
        b"slowdisk" => {
            crate::slowdisk::run(bi);
            finish()
        }
        b"acpi" => crate::acpi::run(bi),
        b"vmgenid" => crate::vmgenid::run(bi),
        b"reboot" => crate::reboot::run(bi),
        b"halt-forever" => {
            println!("halting");
            halt_forever()
        }
        // As `halt-forever`, but the boot timer was never written (see `report`): a guest
        // that runs without ever signalling boot, as every stock guest does.
        b"no-boot-timer" => {
            println!("no-boot-timer: running, halting");
            halt_forever()
        }
        other => {
            print!("unknown scenario: ");
            serial::write_bytes_escaped(other);
            println!();
            finish()
        }
    }
}

fn basic() -> ! {
    println!("end");
    finish()
}

fn echo() -> ! {
    println!("echo: ready");
    let mut line = [0u8; LINE_MAX];
    let mut len = 0;
    let mut last_cr = false;
    loop {
        let b = serial::read_byte();
        let was_cr = core::mem::replace(&mut last_cr, b == b'\r');
        if b == b'\n' && was_cr {
            continue; // second half of CRLF
        }
        if b == b'\r' || b == b'\n' || len == LINE_MAX {
            print!("echo: ");
            serial::write_bytes_escaped(&line[..len]);
            println!();
            if &line[..len] == b"quit" {
                println!("echo: bye");
                finish();
            }
            len = 0;
            if b == b'\r' || b == b'\n' {
                continue;
            }
        }
        line[len] = b;
        len += 1;
    }
}

fn ctrl_alt_del(bi: &BootInfo) -> ! {
    // With testguest.acpi_button=1 and ACPI, the power button is armed too (a guest that
    // listens to both, as a systemd guest does) and powers off.
    let button = match crate::acpi::discover(bi).and_then(|p| p.sleep) {
        Some(sleep) if bi.param("testguest.acpi_button") == Some(b"1") => {
            crate::acpi::arm_power_button();
            println!("acpi: power button armed");
            Some(sleep)
        }
        _ => None,
    };
    println!("waiting for ctrl-alt-del");
    let mut got = [0u8; KBD_LOG_MAX];
    let mut n = 0;
    let mut dec = i8042::CtrlAltDel::default();
    loop {
        if let Some((port, typ)) = button {
            if crate::acpi::power_button_pressed() {
                println!("acpi: power button pressed");
                crate::acpi::power_off(port, typ);
            }
        }
        let Some(b) = i8042::try_read() else {
            pause();
            continue;
        };
        if n < got.len() {
            got[n] = b;
            n += 1;
        }
        if dec.feed(b) {
            break;
        }
    }
    // Collect the key releases that follow (bounded: stop after a stretch of empty polls).
    let mut idle = 0;
    while idle < KBD_DRAIN_IDLE_POLLS {
        match i8042::try_read() {
            Some(b) => {
                idle = 0;
                if n < got.len() {
                    got[n] = b;
                    n += 1;
                }
            }
            None => {
                idle += 1;
                pause();
            }
        }
    }
    print!("i8042:");
    for b in &got[..n] {
        print!(" {:02x}", b);
    }
    println!();
    println!("ctrl-alt-del received");
    finish()
}

fn unknown_io() -> ! {
    let port = inb(0x510);
    let port32 = inl(0x511);
    let mmio = mmio_read32(0xcf00_0000);
    println!(
        "unknown-io: port={:02x} port32={:08x} mmio={:08x}",
        port, port32, mmio
    );
    outb(0x510, 0x5a);
    outl(0x511, 0xdead_beef);
    mmio_write32(0xcf00_0000, 0xdead_beef);
    finish()
}
