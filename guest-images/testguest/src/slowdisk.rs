//! `testguest.scenario=slowdisk`: one disk's request stays pending while another disk is used.
//!
//! With two virtio-blk devices (vda, vdb): prints `slowdisk: ready`, waits for a line on the
//! console (the host makes vda slow meanwhile), submits one write of sector 0 to vda without
//! waiting for it, then runs rounds on vdb — write a sector, read it back, compare — printing
//! `slowdisk: vdb <i> ok|ERR|TIMEOUT vda=pending|done` per round (about every 10 ms). Five
//! rounds after vda's write completed it prints `slowdisk: vda done status=<s> after=<i>`, reads
//! sector 0 of vda back (`slowdisk: vda read-back ok|MISMATCH|ERR`) and `slowdisk: end`. A vdb
//! request that fails or takes more than 2 s ends the scenario early, as does vda never
//! completing within 3000 rounds (`slowdisk: vda never completed`).

use crate::blk::{self, Blk, Done};
use crate::bootinfo::BootInfo;
use crate::io::{pause, rdtsc};
use crate::println;
use crate::serial;
use crate::smp::tsc_per_ms;
use crate::virtio::{
    self, read64, read8, write32, write64, write8, Buf, DmaArena, Mmio, DEVICE_BLK,
};

const ROUNDS: u64 = 3000;
const ROUND_MS: u64 = 10;
/// Rounds run on vdb after vda completed.
const AFTER: u64 = 5;

fn set_up(mmio: Mmio, arena: &mut DmaArena, tsc_ms: u64) -> Option<(Blk, u64)> {
    mmio.begin_init(0).ok()?;
    let q = mmio.setup_queue(0, arena).ok()?;
    let req = arena.alloc(1)?;
    let data = arena.alloc(1)?;
    mmio.finish_init();
    Some((
        Blk {
            mmio,
            q,
            req,
            tsc_ms,
            timeout_ms: blk::REQUEST_TIMEOUT_MS,
        },
        data,
    ))
}

fn fill(data: u64, sector: u64) {
    for w in 0..blk::WORDS {
        write64(data + w * 8, blk::pattern(sector, w));
    }
}

fn matches(data: u64, sector: u64) -> bool {
    (0..blk::WORDS).all(|w| read64(data + w * 8) == blk::pattern(sector, w))
}

fn sector_buf(data: u64, write: bool) -> Buf {
    Buf {
        addr: data,
        len: blk::SECTOR as u32,
        write,
    }
}

pub fn run(bi: &BootInfo) {
    let tsc_ms = tsc_per_ms().max(1);
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("slowdisk: no RAM for DMA buffers");
        return;
    };
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let mut disks = addrs[..n]
        .iter()
        .map(|&base| Mmio { base })
        .filter(|m| m.probe() == Some(DEVICE_BLK));
    let (Some(a), Some(b)) = (disks.next(), disks.next()) else {
        println!("slowdisk: needs two disks");
        return;
    };
    let (Some((mut vda, vda_data)), Some((mut vdb, vdb_data))) = (
        set_up(a, &mut arena, tsc_ms),
        set_up(b, &mut arena, tsc_ms),
    ) else {
        println!("slowdisk: init failed");
        return;
    };
    println!("slowdisk: ready");
    while serial::read_byte() != b'\n' {}

    // vda: one write of sector 0, not waited for.
    fill(vda_data, 0);
    write32(vda.req, blk::T_OUT);
    write32(vda.req + 4, 0);
    write64(vda.req + 8, 0);
    write8(vda.req + 0x100, 0xff);
    let hdr = Buf {
        addr: vda.req,
        len: 16,
        write: false,
    };
    let st = Buf {
        addr: vda.req + 0x100,
        len: 1,
        write: true,
    };
    if vda
        .q
        .push_chain(0, &[hdr, sector_buf(vda_data, false), st])
        .is_none()
    {
        println!("slowdisk: cannot queue the vda write");
        return;
    }
    vda.q.notify();
    println!("slowdisk: vda submitted");

    let mut done_at: Option<u64> = None;
    for i in 0..ROUNDS {
        let t0 = rdtsc();
        let sector = 1 + i % 64;
        fill(vdb_data, sector);
        let w = vdb.request(blk::T_OUT, sector, Some(sector_buf(vdb_data, false)));
        for w in 0..blk::WORDS {
            write64(vdb_data + w * 8, 0);
        }
        let r = vdb.request(blk::T_IN, sector, Some(sector_buf(vdb_data, true)));
        let result = match (w, r) {
            (Done::Status(0), Done::Status(0)) if matches(vdb_data, sector) => "ok",
            (Done::Timeout, _) | (_, Done::Timeout) => "TIMEOUT",
            _ => "ERR",
        };
        if done_at.is_none() && vda.q.pop_used().is_some() {
            done_at = Some(i);
        }
        println!(
            "slowdisk: vdb {} {} vda={}",
            i,
            result,
            if done_at.is_some() { "done" } else { "pending" }
        );
        if result != "ok" || done_at.is_some_and(|d| i >= d + AFTER) {
            break;
        }
        while rdtsc().wrapping_sub(t0) < tsc_ms * ROUND_MS {
            pause();
        }
    }
    match done_at {
        None => println!("slowdisk: vda never completed"),
        Some(d) => {
            println!(
                "slowdisk: vda done status={} after={}",
                read8(vda.req + 0x100),
                d
            );
            for w in 0..blk::WORDS {
                write64(vda_data + w * 8, 0);
            }
            let back = match vda.request(blk::T_IN, 0, Some(sector_buf(vda_data, true))) {
                Done::Status(0) if matches(vda_data, 0) => "ok",
                Done::Status(0) => "MISMATCH",
                _ => "ERR",
            };
            println!("slowdisk: vda read-back {}", back);
        }
    }
    println!("slowdisk: end");
}
