//! `testguest.scenario=reboot`: reboots itself `testguest.reboots` times (default 1) through
//! the i8042 or the ACPI reset register (`testguest.reboot_via=i8042|acpi`), for the VMM's
//! in-place reboot. The boots are counted on the first virtio-blk disk (sector 0: a magic word
//! and the count), which an in-place reboot keeps; a word in RAM, written before each reboot,
//! must read zero after it (the VMM clears RAM). After the last boot it powers off (ACPI,
//! else resets), or halts with `testguest.reboot_then=halt`. `testguest.acpi_button=1` arms
//! the ACPI power button on every boot, as a kernel with ACPI does. `testguest.resets=N` writes
//! the i8042 reset command N times per reboot. `testguest.after_reset=triple-fault` triple-faults
//! right after asking for the reset instead of waiting for it, as Linux's reboot does when the
//! reset is not taken within ~2 ms (it tries the next method and ends with a triple fault).

use crate::blk::{Blk, Done, F_FLUSH, REQUEST_TIMEOUT_MS, T_FLUSH, T_IN, T_OUT};
use crate::bootinfo::BootInfo;
use crate::io::{halt_forever, phys_u64};
use crate::parse::parse_num;
use crate::smp::tsc_per_ms;
use crate::virtio::{self, read64, write64, Buf, DmaArena, Mmio, DEVICE_BLK};
use crate::{finish, i8042, println, triple_fault, Fault};

/// The RAM word written before a reboot (7 MiB: above the DMA window, inside 32 MiB).
const MARKER_ADDR: u64 = 0x70_0000;
const MARKER: u64 = 0x6d76_7262_0000_0000;
/// Sector 0's first word: "mvrboots".
const MAGIC: u64 = u64::from_le_bytes(*b"mvrboots");

fn disk(bi: &BootInfo, arena: &mut DmaArena) -> Option<(Blk, u64, bool)> {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let mmio = addrs[..n]
        .iter()
        .map(|&base| Mmio { base })
        .find(|m| m.probe() == Some(DEVICE_BLK))?;
    let features = mmio.begin_init(F_FLUSH).ok()?;
    let q = mmio.setup_queue(0, arena).ok()?;
    let req = arena.alloc(1)?;
    let data = arena.alloc(1)?;
    mmio.finish_init();
    let blk = Blk {
        mmio,
        q,
        req,
        tsc_ms: tsc_per_ms().max(1),
        timeout_ms: REQUEST_TIMEOUT_MS,
    };
    Some((blk, data, features & F_FLUSH != 0))
}

fn ok(d: Done) -> bool {
    matches!(d, Done::Status(0))
}

pub fn run(bi: &BootInfo) -> ! {
    let marker = phys_u64(MARKER_ADDR);
    // As a kernel with ACPI would (a VMM rebooting in place only guests that use ACPI looks
    // for this).
    if bi.param("testguest.acpi_button") == Some(b"1") && crate::acpi::discover(bi).is_some() {
        crate::acpi::arm_power_button();
        println!("acpi: power button armed");
    }
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("reboot: no RAM for DMA buffers");
        finish()
    };
    let Some((mut blk, data, flush)) = disk(bi, &mut arena) else {
        println!("reboot: no disk");
        finish()
    };
    let sector = |write| Buf {
        addr: data,
        len: 512,
        write,
    };
    if !ok(blk.request(T_IN, 0, Some(sector(true)))) {
        println!("reboot: disk read failed");
        finish()
    }
    let boot = if read64(data) == MAGIC {
        read64(data + 8) + 1
    } else {
        1
    };
    println!(
        "reboot: boot={} ram={}",
        boot,
        if marker == 0 { "clear" } else { "NOT-CLEARED" }
    );
    write64(data, MAGIC);
    write64(data + 8, boot);
    let written = ok(blk.request(T_OUT, 0, Some(sector(false))))
        && (!flush || ok(blk.request(T_FLUSH, 0, None)));
    if !written {
        println!("reboot: disk write failed");
        finish()
    }
    let wanted = bi
        .param("testguest.reboots")
        .and_then(parse_num)
        .unwrap_or(1);
    if boot > wanted {
        println!("reboot: done after {} reboots", boot - 1);
        if bi.param("testguest.reboot_then") == Some(b"halt") {
            println!("reboot: halting");
            halt_forever()
        }
        finish()
    }
    // SAFETY: MARKER_ADDR is guest RAM this program does not otherwise use (the VMM gives at
    // least 32 MiB to the scenarios that run this); an aligned 8-byte write.
    unsafe { core::ptr::write_volatile(MARKER_ADDR as usize as *mut u64, MARKER | boot) };
    match bi.param("testguest.reboot_via") {
        Some(b"acpi") => match crate::acpi::discover(bi).and_then(|p| p.reset) {
            Some((port, value)) => {
                println!("reboot: rebooting via the ACPI reset register {:#x}", port);
                crate::acpi::reset(port, value);
                after_reset(bi)
            }
            None => {
                println!("reboot: no ACPI reset register");
                finish()
            }
        },
        _ => {
            // `testguest.resets=N` pulses the reset line N times back to back, as Linux's
            // keyboard reboot does (up to ten writes): one reboot must come of them.
            let n = bi
                .param("testguest.resets")
                .and_then(parse_num)
                .unwrap_or(1)
                .clamp(1, 16);
            println!("reboot: rebooting via the i8042");
            for _ in 0..n {
                i8042::reset();
            }
            after_reset(bi)
        }
    }
}

/// Waits for the reset asked for, or (`testguest.after_reset=triple-fault`) does not.
fn after_reset(bi: &BootInfo) -> ! {
    if bi.param("testguest.after_reset") == Some(b"triple-fault") {
        triple_fault(Fault::Breakpoint)
    }
    halt_forever()
}
