//! `testguest.scenario=rng`: the virtio-rng device.
//!
//! Finds the first virtio-rng device (type 4), reads 64 bytes twice:
//! `rng: read <n> bytes nonzero=<bytes not 0> differ=<0|1>` (differ: the two reads differ);
//! offers a device-readable buffer (a driver mistake): `rng: readonly-buffer len=<used length>`;
//! then reads once more (`rng: after-mistake len=<n>`). With `testguest.rng_wait=1` it then
//! prints `rng: waiting`, waits for a line on the console (a snapshot and restore can happen
//! meanwhile) and reads again: `rng: after-wait len=<n> differ=<0|1>` (against the first read).
//! Then `rng: end` and a reset. `rng: no device` without one.

use crate::bootinfo::BootInfo;
use crate::println;
use crate::serial;
use crate::smp::tsc_per_ms;
use crate::virtio::{self, read8, write8, Buf, DmaArena, Mmio, Virtqueue};

/// virtio device id of virtio-rng.
pub const DEVICE_RNG: u32 = 4;
const LEN: u32 = 64;
const TIMEOUT_MS: u64 = 2000;

struct Rng {
    mmio: Mmio,
    q: Virtqueue,
    tsc_ms: u64,
}

impl Rng {
    /// Offers `buf` and waits for the device; the used length, or None on a timeout.
    fn request(&mut self, buf: Buf) -> Option<u32> {
        self.q.push_chain(0, &[buf])?;
        self.q.notify();
        let r = self.q.wait_used(self.tsc_ms * TIMEOUT_MS);
        self.mmio.ack_interrupt();
        r.map(|(_, len)| len)
    }

    /// Reads `LEN` bytes into `at` (zeroed first).
    fn read(&mut self, at: u64) -> Option<u32> {
        for i in 0..u64::from(LEN) {
            write8(at + i, 0);
        }
        self.request(Buf {
            addr: at,
            len: LEN,
            write: true,
        })
    }
}

fn show(r: Option<u32>) -> u32 {
    r.unwrap_or(u32::MAX)
}

fn differ(a: u64, b: u64) -> u8 {
    u8::from((0..u64::from(LEN)).any(|i| read8(a + i) != read8(b + i)))
}

pub fn run(bi: &BootInfo) {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let Some(mmio) = addrs[..n]
        .iter()
        .map(|&base| Mmio { base })
        .find(|m| m.probe() == Some(DEVICE_RNG))
    else {
        println!("rng: no device");
        return;
    };
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("rng: no RAM for DMA buffers");
        return;
    };
    let set_up = (|| {
        mmio.begin_init(0).ok()?;
        let q = mmio.setup_queue(0, &mut arena).ok()?;
        let page = arena.alloc(1)?;
        mmio.finish_init();
        Some((q, page))
    })();
    let Some((q, page)) = set_up else {
        println!("rng: init failed");
        return;
    };
    let mut rng = Rng {
        mmio,
        q,
        tsc_ms: tsc_per_ms().max(1),
    };
    let (a, b, c) = (page, page + 0x100, page + 0x200);
    let first = rng.read(a);
    let second = rng.read(b);
    let nonzero = (0..u64::from(LEN))
        .filter(|&i| read8(a + i) != 0)
        .count();
    println!(
        "rng: read {} bytes nonzero={} differ={}",
        show(first),
        nonzero,
        if first == Some(LEN) && second == Some(LEN) {
            differ(a, b)
        } else {
            0
        }
    );
    let bad = rng.request(Buf {
        addr: c,
        len: LEN,
        write: false,
    });
    println!("rng: readonly-buffer len={}", show(bad));
    println!("rng: after-mistake len={}", show(rng.read(c)));
    if bi.param("testguest.rng_wait") == Some(b"1") {
        println!("rng: waiting");
        while serial::read_byte() != b'\n' {}
        let r = rng.read(b);
        println!("rng: after-wait len={} differ={}", show(r), differ(a, b));
    }
    println!("rng: end");
}
