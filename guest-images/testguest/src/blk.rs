//! virtio-blk driver exercise (`testguest.scenario=blk`).

use crate::bootinfo::BootInfo;
use crate::print;
use crate::println;
use crate::serial;
use crate::smp::tsc_per_ms;
use crate::virtio::{
    self, read64, read8, write32, write64, write8, Buf, DmaArena, InitError, Mmio, Virtqueue,
    DEVICE_BLK, REG_MAGIC, STATUS_NEEDS_RESET,
};

const F_RO: u64 = 1 << 5;
pub(crate) const F_FLUSH: u64 = 1 << 9;

pub(crate) const T_IN: u32 = 0;
pub(crate) const T_OUT: u32 = 1;
pub(crate) const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;

pub(crate) const SECTOR: u64 = 512;
/// Sectors written and read back: 1..=8, one request.
const FIRST: u64 = 1;
const COUNT: u64 = 8;
/// The status byte before the device writes it.
const STATUS_UNSET: u8 = 0xff;
/// A guest-physical address far outside RAM (1020 GiB).
const HOSTILE_ADDR: u64 = 0xff_0000_0000;
pub(crate) const REQUEST_TIMEOUT_MS: u64 = 2000;

/// 64-bit word `w` (0..64) of sector `s` in the test pattern.
pub(crate) fn pattern(s: u64, w: u64) -> u64 {
    0x6d76_0000_0000_0000 ^ (s << 32) ^ (w << 8) ^ s.wrapping_mul(0x9e37_79b9)
}
pub(crate) const WORDS: u64 = SECTOR / 8;

pub(crate) struct Blk {
    pub(crate) mmio: Mmio,
    pub(crate) q: Virtqueue,
    /// Request header (16 bytes) at +0, status byte at +0x100, id at +0x200.
    pub(crate) req: u64,
    pub(crate) tsc_ms: u64,
    /// How long a request may take before it counts as not completed.
    pub(crate) timeout_ms: u64,
}

/// Outcome of one request.
pub(crate) enum Done {
    Status(u8),
    Timeout,
}

impl Blk {
    pub(crate) fn request(&mut self, ty: u32, sector: u64, data: Option<Buf>) -> Done {
        write32(self.req, ty);
        write32(self.req + 4, 0);
        write64(self.req + 8, sector);
        write8(self.req + 0x100, STATUS_UNSET);
        let hdr = Buf {
            addr: self.req,
            len: 16,
            write: false,
        };
        let st = Buf {
            addr: self.req + 0x100,
            len: 1,
            write: true,
        };
        let pushed = match data {
            Some(d) => self.q.push_chain(0, &[hdr, d, st]),
            None => self.q.push_chain(0, &[hdr, st]),
        };
        if pushed.is_none() {
            return Done::Status(STATUS_UNSET);
        }
        self.q.notify();
        let r = self.q.wait_used(self.tsc_ms * self.timeout_ms);
        self.mmio.ack_interrupt();
        match r {
            Some(_) => Done::Status(read8(self.req + 0x100)),
            None => Done::Timeout,
        }
    }
}

fn show(d: &Done) -> u32 {
    match d {
        Done::Status(s) => u32::from(*s),
        Done::Timeout => u32::MAX,
    }
}

/// Runs the block checks on every virtio-blk device named on the command line.
pub fn run(bi: &BootInfo) {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("blk: no RAM for DMA buffers");
        return;
    };
    let tsc_ms = tsc_per_ms().max(1);
    let mut index = 0;
    for &base in &addrs[..n] {
        let mmio = Mmio { base };
        if mmio.probe() != Some(DEVICE_BLK) {
            continue;
        }
        let i = index;
        index += 1;
        match exercise(i, mmio, &mut arena, tsc_ms) {
            Ok(()) => {}
            Err(e) => println!("blk{}: init failed: {:?}", i, e),
        }
    }
    if index == 0 {
        println!("blk: no devices");
    }
}

fn exercise(i: usize, mmio: Mmio, arena: &mut DmaArena, tsc_ms: u64) -> Result<(), InitError> {
    let features = mmio.begin_init(F_RO | F_FLUSH)?;
    let q = mmio.setup_queue(0, arena)?;
    let req = arena.alloc(1).ok_or(InitError::NoMemory)?;
    let data = arena.alloc(2).ok_or(InitError::NoMemory)?;
    mmio.finish_init();
    let ro = features & F_RO != 0;
    let capacity = mmio.config64(0);
    let mut blk = Blk {
        mmio,
        q,
        req,
        tsc_ms,
        timeout_ms: REQUEST_TIMEOUT_MS,
    };

    // GET_ID: up to 20 bytes, NUL-padded.
    let id_buf = Buf {
        addr: req + 0x200,
        len: 20,
        write: true,
    };
    let id_done = blk.request(T_GET_ID, 0, Some(id_buf));
    print!("blk{}: capacity={} ro={} id=", i, capacity, u8::from(ro));
    match id_done {
        Done::Status(0) => {
            let mut id = [0u8; 20];
            for (k, b) in id.iter_mut().enumerate() {
                *b = read8(req + 0x200 + k as u64);
            }
            let len = id.iter().position(|&b| b == 0).unwrap_or(id.len());
            serial::write_bytes_escaped(&id[..len]);
            println!();
        }
        other => println!("<status {}>", show(&other)),
    }

    // The first 4 KiB as the disk holds them before this run writes: a checksum the host
    // compares with the image's (FNV-1a, 32 bits).
    let head = Buf {
        addr: data + 4096,
        len: 4096,
        write: true,
    };
    let hd = blk.request(T_IN, 0, Some(head));
    let mut fnv: u32 = 0x811c_9dc5;
    for k in 0..4096u64 {
        fnv ^= u32::from(read8(data + 4096 + k));
        fnv = fnv.wrapping_mul(0x0100_0193);
    }
    println!("blk{}: head status={} fnv1a={:08x}", i, show(&hd), fnv);

    let len = (COUNT * SECTOR) as u32;
    let wbuf = Buf {
        addr: data,
        len,
        write: false,
    };
    if ro {
        let d = blk.request(T_OUT, FIRST, Some(wbuf));
        println!("blk{}: ro-write status={}", i, show(&d));
    } else {
        for s in 0..COUNT {
            for w in 0..WORDS {
                write64(data + s * SECTOR + w * 8, pattern(FIRST + s, w));
            }
        }
        let rbuf = Buf {
            addr: data + 4096,
            len,
            write: true,
        };
        let w = blk.request(T_OUT, FIRST, Some(wbuf));
        let f = if features & F_FLUSH != 0 {
            blk.request(T_FLUSH, 0, None)
        } else {
            Done::Status(0)
        };
        let r = blk.request(T_IN, FIRST, Some(rbuf));
        let bad = [&w, &f, &r]
            .into_iter()
            .find(|d| !matches!(d, Done::Status(0)));
        match bad {
            Some(d) => println!("blk{}: write-flush-read ERR status={}", i, show(d)),
            None => {
                let mut same = true;
                'cmp: for s in 0..COUNT {
                    for w in 0..WORDS {
                        if read64(data + 4096 + s * SECTOR + w * 8) != pattern(FIRST + s, w) {
                            same = false;
                            break 'cmp;
                        }
                    }
                }
                println!(
                    "blk{}: write-flush-read {}",
                    i,
                    if same { "ok" } else { "MISMATCH" }
                );
            }
        }
    }

    // A request whose data buffer is far outside guest RAM.
    let hostile = Buf {
        addr: HOSTILE_ADDR,
        len: SECTOR as u32,
        write: true,
    };
    let h = blk.request(T_IN, 0, Some(hostile));
    let status = blk.mmio.status();
    if status != u32::MAX && status & STATUS_NEEDS_RESET != 0 {
        println!("blk{}: hostile needs-reset", i);
    } else {
        match h {
            Done::Status(s) => println!("blk{}: hostile status={}", i, s),
            Done::Timeout => println!("blk{}: hostile no-completion", i),
        }
    }
    let magic = blk.mmio.read(REG_MAGIC);
    println!(
        "blk{}: registers after hostile: magic={:08x} status={:#x}",
        i, magic, status
    );
    Ok(())
}
