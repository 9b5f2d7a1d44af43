//! `mmio_transport`: a real [`MmioTransport`] with a virtio-blk (in-memory disk) or virtio-net
//! (fake TAP) device behind it, driven by register reads and writes in any order and any width,
//! with guest memory (rings, descriptors, buffers) taken from the input.
//!
//! Besides "no panic", a register model written from the virtio 1.2 MMIO rules is kept and
//! compared after every access:
//! - identification registers, device features per selector page, QueueNumMax, QueueReady,
//!   Status (with NEEDS_RESET), ConfigGeneration and SHM lengths read as the model says;
//!   write-only and unknown registers read as zero; accesses that are not 4 bytes wide and
//!   4-byte aligned below the config space read as zero and change nothing;
//! - the transport's register state (status, selectors, driver features, every queue's size,
//!   readiness and ring addresses) equals the model after every write: status moves only one
//!   step of the initialisation sequence at a time, FEATURES_OK only for acceptable features,
//!   queue registers change only between FEATURES_OK and DRIVER_OK on a queue that is not
//!   ready, with alignment-checked addresses, and a zero write resets everything;
//! - DRIVER_OK activates the device exactly when every queue is ready and its rings lie in
//!   guest memory, and sets NEEDS_RESET otherwise; acked features are the ones the driver wrote;
//!   NEEDS_RESET appears only at DRIVER_OK or while the device processes queues, and only a
//!   reset clears it;
//! - the interrupt status holds only the two defined bits, and an ACK clears what it names;
//! - when the device processes its queues (what the event loop does on a notification), it
//!   writes guest memory only inside device-writable descriptor buffers and the used rings, and
//!   a net device sends to its backend only as many frames as it counted.

use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress};
use vmm::devices::bus::BusDevice;
use vmm::devices::interrupt::IrqLine;
use vmm::devices::virtio::block::disk::MemDisk;
use vmm::devices::virtio::block::BlockDevice;
use vmm::devices::virtio::mmio::*;
use vmm::devices::virtio::net::{MacAddr, NetDevice};
use vmm::devices::virtio::{status, VirtioDevice, VirtioInterrupt, INT_CONFIG, INT_VRING};
use vmm::persist::Persist;
use vmm::vstate::memory::GuestMemoryMmap;

use crate::backend::{pair, HostEnd};
use crate::driver::{guest_memory, MemSnapshot, HOLE, R0_END, R1_END, R2, R2_END};
use crate::input::Input;

const MAX_OPS: usize = 400;
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const DISK_BYTES: usize = 64 * 1024;

/// Registers the driver touches, to steer offsets toward meaningful ones.
const REGS: &[u64] = &[
    REG_MAGIC,
    REG_VERSION,
    REG_DEVICE_ID,
    REG_VENDOR_ID,
    REG_DEVICE_FEATURES,
    REG_DEVICE_FEATURES_SEL,
    REG_DRIVER_FEATURES,
    REG_DRIVER_FEATURES_SEL,
    REG_QUEUE_SEL,
    REG_QUEUE_NUM_MAX,
    REG_QUEUE_NUM,
    REG_QUEUE_READY,
    REG_QUEUE_NOTIFY,
    REG_INTERRUPT_STATUS,
    REG_INTERRUPT_ACK,
    REG_STATUS,
    REG_QUEUE_DESC_LOW,
    REG_QUEUE_DESC_HIGH,
    REG_QUEUE_DRIVER_LOW,
    REG_QUEUE_DRIVER_HIGH,
    REG_QUEUE_DEVICE_LOW,
    REG_QUEUE_DEVICE_HIGH,
    REG_SHM_SEL,
    REG_SHM_LEN_LOW,
    REG_SHM_LEN_HIGH,
    REG_CONFIG_GENERATION,
    REG_CONFIG,
];

/// Model of one queue's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QModel {
    max: u16,
    size: u16,
    ready: bool,
    desc: u64,
    avail: u64,
    used: u64,
}

impl QModel {
    fn new(max: u16) -> Self {
        Self {
            max,
            size: max,
            ready: false,
            desc: 0,
            avail: 0,
            used: 0,
        }
    }
}

/// Model of the transport registers.
#[derive(Clone, Debug)]
struct Model {
    status: u32,
    dfsel: u32,
    drfsel: u32,
    qsel: u32,
    driver_features: u64,
    queues: Vec<QModel>,
    offered: u64,
}

impl Model {
    fn reset(&mut self) {
        self.status = 0;
        self.dfsel = 0;
        self.drfsel = 0;
        self.qsel = 0;
        self.driver_features = 0;
        for q in &mut self.queues {
            *q = QModel::new(q.max);
        }
    }

    fn setup_window(&self) -> bool {
        self.status & status::FEATURES_OK != 0 && self.status & status::DRIVER_OK == 0
    }

    /// The selected queue, if queue setup is allowed and it is not ready.
    fn setup_queue(&mut self) -> Option<&mut QModel> {
        if !self.setup_window() {
            return None;
        }
        self.queues.get_mut(self.qsel as usize).filter(|q| !q.ready)
    }
}

/// `[addr, addr + len)` lies entirely in guest memory.
fn in_memory(addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    (addr < R1_END && end <= R1_END) || (addr >= R2 && end <= R2_END)
}

fn ring_ok(q: &QModel) -> bool {
    let n = u64::from(q.size);
    q.ready
        && in_memory(q.desc, 16 * n)
        && in_memory(q.avail, 6 + 2 * n)
        && in_memory(q.used, 6 + 8 * n)
}

/// A device as `cfg` says (bit 0: net; blk: bit 1 read-only; net: bits 2-4 TAP offloads,
/// bit 5 MAC), its handle as the transport sees it, and its interrupt state.
fn make_device(cfg: u8) -> (Dev, Arc<Mutex<dyn VirtioDevice>>, Arc<VirtioInterrupt>) {
    let irq = IrqLine::new(5).expect("eventfd");
    if cfg & 1 == 0 {
        let disk = MemDisk::new(DISK_BYTES, cfg & 2 != 0);
        let d = BlockDevice::new(Box::new(disk), *b"mmio-fuzz-serial-000", irq).expect("blk");
        let i = d.interrupt().clone();
        let d = Arc::new(Mutex::new(d));
        (Dev::Blk(d.clone()), d, i)
    } else {
        let (backend, host) = pair(u32::from(cfg >> 2 & 7));
        let mac = (cfg & 0x20 != 0).then_some(MacAddr(MAC));
        let d = NetDevice::new(Box::new(backend), mac, irq).expect("net");
        let i = d.interrupt().clone();
        let d = Arc::new(Mutex::new(d));
        (Dev::Net(d.clone(), host), d, i)
    }
}

/// The device behind the transport.
enum Dev {
    Blk(Arc<Mutex<BlockDevice>>),
    Net(Arc<Mutex<NetDevice>>, HostEnd),
}

struct Run {
    t: MmioTransport,
    cfg: u8,
    dev: Dev,
    interrupt: Arc<VirtioInterrupt>,
    mem: GuestMemoryMmap,
    m: Model,
    device_type: u32,
    /// Host frames sent and device frames received (net).
    sent: u64,
    received: u64,
    capacity_sectors: u64,
}

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let cfg = inp.u8();
    let mem = guest_memory();
    // Guest memory from the input: a block at a chosen place.
    let at = match inp.u8() % 4 {
        0 => 0,
        1 => u64::from(inp.u16()) & !0xf,
        2 => R0_END - 0x800,
        _ => R2,
    };
    let len = usize::from(inp.u16() % 0x1000);
    let fill = inp.bytes(len);
    let _ = mem.write_slice(fill, GuestAddress(at));

    let (dev, vdev, interrupt) = make_device(cfg);
    let device_type = if cfg & 1 == 0 {
        vmm::devices::virtio::TYPE_BLOCK
    } else {
        vmm::devices::virtio::TYPE_NET
    };
    let (offered, maxes) = {
        let g = vdev.lock().expect("lock");
        (g.avail_features(), g.queue_max_sizes().to_vec())
    };
    let capacity_sectors = (DISK_BYTES / 512) as u64;
    let t = MmioTransport::new(mem.clone(), vdev);
    let mut run = Run {
        t,
        cfg,
        dev,
        interrupt,
        mem,
        m: Model {
            status: 0,
            dfsel: 0,
            drfsel: 0,
            qsel: 0,
            driver_features: 0,
            queues: maxes.iter().map(|&m| QModel::new(m)).collect(),
            offered,
        },
        device_type,
        sent: 0,
        received: 0,
        capacity_sectors,
    };
    run.compare_state("initial");
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 17 {
            0..=4 => {
                let off = run.offset(&mut inp);
                let width = width(&mut inp);
                run.read(off, width);
            }
            5..=10 => {
                let off = run.offset(&mut inp);
                let width = width(&mut inp);
                let v = run.value(&mut inp, off);
                run.write(off, width, v);
            }
            11 => run.init(&mut inp),
            12 | 13 => run.process(),
            14 => {
                let addr = match inp.u8() % 4 {
                    0 => u64::from(inp.u16()),
                    1 => u64::from(inp.u32()) % R1_END,
                    2 => R2 + u64::from(inp.u16()),
                    _ => R0_END - 16 + u64::from(inp.u8() % 32),
                };
                let n = usize::from(inp.u8() % 64);
                let b = inp.bytes(n);
                let _ = run.mem.write_slice(b, GuestAddress(addr));
            }
            15 => run.host_frame(&mut inp),
            _ => run.snapshot_restore(),
        }
    }
    run.process();
}

fn width(inp: &mut Input) -> usize {
    match inp.u8() % 8 {
        0..=4 => 4,
        5 => 1,
        6 => 2,
        _ => 8,
    }
}

impl Run {
    fn offset(&mut self, inp: &mut Input) -> u64 {
        match inp.u8() % 8 {
            0..=4 => REGS[usize::from(inp.u8()) % REGS.len()],
            5 => REG_CONFIG + u64::from(inp.u8() % 80),
            6 => u64::from(inp.u16() % 0x200),
            _ => u64::from(inp.u32()),
        }
    }

    /// A value for a write at `off`: mostly what a driver would write there.
    fn value(&mut self, inp: &mut Input, off: u64) -> u32 {
        let sel = inp.u8();
        if sel >= 224 {
            return inp.u32();
        }
        match off {
            REG_STATUS => {
                use status::*;
                const STEPS: [u32; 4] = [ACKNOWLEDGE, DRIVER, FEATURES_OK, DRIVER_OK];
                match sel % 8 {
                    0..=4 => {
                        let next = STEPS.iter().find(|&&b| self.m.status & b == 0);
                        self.m.status | next.copied().unwrap_or(0)
                    }
                    5 => 0,
                    6 => self.m.status | FAILED,
                    _ => u32::from(inp.u8()),
                }
            }
            REG_DRIVER_FEATURES => match sel % 4 {
                0 | 1 => (self.m.offered >> (32 * (self.m.drfsel & 1))) as u32,
                2 => (self.m.offered >> (32 * (self.m.drfsel & 1))) as u32 & inp.u32(),
                _ => inp.u32(),
            },
            REG_DEVICE_FEATURES_SEL | REG_DRIVER_FEATURES_SEL | REG_QUEUE_SEL => u32::from(sel % 3),
            REG_QUEUE_NUM => 1 << (sel % 10),
            REG_QUEUE_READY => u32::from(!sel.is_multiple_of(3)),
            REG_QUEUE_NOTIFY => u32::from(sel % 3),
            REG_INTERRUPT_ACK => u32::from(sel % 4),
            REG_QUEUE_DESC_LOW | REG_QUEUE_DRIVER_LOW | REG_QUEUE_DEVICE_LOW => match sel % 8 {
                0..=4 => u32::from(inp.u8()) * 0x1000 + u32::from(inp.u8() % 16) * 0x100,
                5 => (R0_END - 0x100) as u32,
                6 => (HOLE + 0x100) as u32,
                _ => R2 as u32 + u32::from(inp.u16() & !0xf),
            },
            REG_QUEUE_DESC_HIGH | REG_QUEUE_DRIVER_HIGH | REG_QUEUE_DEVICE_HIGH => {
                if sel.is_multiple_of(4) {
                    u32::from(inp.u8())
                } else {
                    0
                }
            }
            _ => inp.u32(),
        }
    }

    /// A whole, well-behaved driver initialisation with queues in R0 (steps can be cut short).
    fn init(&mut self, inp: &mut Input) {
        let stop = inp.u8() % 8;
        let qsize = 1u32 << (inp.u8() % 9);
        let mut steps = 0;
        let mut w = |r: &mut Run, off: u64, v: u32| {
            if steps < 3 + 8 * u32::from(stop) {
                r.write(off, 4, v);
            }
            steps += 1;
        };
        use status::*;
        w(self, REG_STATUS, 0);
        w(self, REG_STATUS, ACKNOWLEDGE);
        w(self, REG_STATUS, ACKNOWLEDGE | DRIVER);
        for page in 0..2u32 {
            w(self, REG_DEVICE_FEATURES_SEL, page);
            w(self, REG_DRIVER_FEATURES_SEL, page);
            let f = (self.m.offered >> (32 * page)) as u32;
            w(self, REG_DRIVER_FEATURES, f);
        }
        w(self, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        for q in 0..self.m.queues.len() as u32 {
            let base = 0x4000 * u64::from(q);
            w(self, REG_QUEUE_SEL, q);
            w(self, REG_QUEUE_NUM, qsize);
            w(self, REG_QUEUE_DESC_LOW, base as u32);
            w(self, REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
            w(self, REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
            w(self, REG_QUEUE_READY, 1);
        }
        w(
            self,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
    }

    fn read_raw(&mut self, off: u64, width: usize) -> Vec<u8> {
        let mut b = vec![0xcc; width];
        self.t.read(off, &mut b);
        b
    }

    fn read(&mut self, off: u64, width: usize) {
        let before = self.t.save();
        let nr_before = self.interrupt.needs_reset();
        let b = self.read_raw(off, width);
        assert_eq!(
            self.t.save(),
            before,
            "a read at {off:#x} changed the transport state"
        );
        assert_eq!(
            self.interrupt.needs_reset(),
            nr_before,
            "a read changed NEEDS_RESET"
        );
        if off >= REG_CONFIG {
            self.check_config(off - REG_CONFIG, &b);
            return;
        }
        if width != 4 || !off.is_multiple_of(4) {
            assert!(
                b.iter().all(|&x| x == 0),
                "{width}-byte read at {off:#x} returned {b:02x?}, not zeroes"
            );
            return;
        }
        let v = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let q = self.m.queues.get(self.m.qsel as usize);
        let expected = match off {
            REG_MAGIC => Some(MMIO_MAGIC),
            REG_VERSION => Some(MMIO_VERSION),
            REG_DEVICE_ID => Some(self.device_type),
            REG_VENDOR_ID => Some(VENDOR_ID),
            REG_DEVICE_FEATURES => Some(match self.m.dfsel {
                0 => self.m.offered as u32,
                1 => (self.m.offered >> 32) as u32,
                _ => 0,
            }),
            REG_QUEUE_NUM_MAX => Some(q.map_or(0, |q| u32::from(q.max))),
            REG_QUEUE_READY => Some(q.map_or(0, |q| u32::from(q.ready))),
            REG_INTERRUPT_STATUS => {
                assert_eq!(
                    v & !(INT_VRING | INT_CONFIG),
                    0,
                    "undefined interrupt status bits {v:#x}"
                );
                assert_eq!(v, self.interrupt.status(), "interrupt status register");
                None
            }
            REG_STATUS => Some(
                self.m.status
                    | if self.interrupt.needs_reset() {
                        status::NEEDS_RESET
                    } else {
                        0
                    },
            ),
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => Some(u32::MAX),
            REG_CONFIG_GENERATION => Some(0),
            _ => Some(0),
        };
        if let Some(e) = expected {
            assert_eq!(
                v, e,
                "register {off:#x} reads {v:#x}, the model says {e:#x}"
            );
        }
    }

    fn check_config(&mut self, off: u64, b: &[u8]) {
        let expected_cfg: Vec<u8> = match &self.dev {
            Dev::Blk(_) => self.capacity_sectors.to_le_bytes().to_vec(),
            Dev::Net(d, _) => {
                if self.m.offered & (1 << vmm::devices::virtio::net::device::VIRTIO_NET_F_MAC) != 0
                {
                    MAC.to_vec()
                } else {
                    let _ = d;
                    vec![0; 6]
                }
            }
        };
        for (i, &x) in b.iter().enumerate() {
            let Some(o) = off.checked_add(i as u64) else {
                continue;
            };
            if let Some(&e) = usize::try_from(o).ok().and_then(|o| expected_cfg.get(o)) {
                assert_eq!(x, e, "config byte {o}");
            }
            if o >= 0x1000 {
                assert_eq!(x, 0, "config byte {o:#x} past the config space");
            }
        }
    }

    fn write(&mut self, off: u64, width: usize, v: u32) {
        let mut bytes = v.to_le_bytes().to_vec();
        bytes.resize(width, 0);
        let nr_before = self.interrupt.needs_reset();
        let before = self.t.save();
        self.t.write(off, &bytes);
        if off >= REG_CONFIG {
            assert_eq!(
                self.t.save(),
                before,
                "a config write changed the transport registers"
            );
            return;
        }
        if width != 4 || !off.is_multiple_of(4) {
            assert_eq!(
                self.t.save(),
                before,
                "a {width}-byte write at {off:#x} changed state"
            );
            assert_eq!(
                self.interrupt.needs_reset(),
                nr_before,
                "a narrow write changed NEEDS_RESET"
            );
            return;
        }
        let m = &mut self.m;
        let mut driver_ok_now = false;
        match off {
            REG_DEVICE_FEATURES_SEL => m.dfsel = v,
            REG_DRIVER_FEATURES_SEL => m.drfsel = v,
            REG_DRIVER_FEATURES if m.status == status::ACKNOWLEDGE | status::DRIVER => {
                match m.drfsel {
                    0 => m.driver_features = (m.driver_features & !0xffff_ffff) | u64::from(v),
                    1 => {
                        m.driver_features = (m.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                    }
                    _ => {}
                }
            }
            REG_QUEUE_SEL => m.qsel = v,
            REG_QUEUE_NUM => {
                if let Some(q) = m.setup_queue() {
                    if let Ok(s) = u16::try_from(v) {
                        if s != 0 && s.is_power_of_two() && s <= q.max {
                            q.size = s;
                        }
                    }
                }
            }
            REG_QUEUE_READY => {
                if v == 1 {
                    if let Some(q) = m.setup_queue() {
                        q.ready = true;
                    }
                } else if v == 0 && m.setup_window() {
                    if let Some(q) = m.queues.get_mut(m.qsel as usize) {
                        q.ready = false;
                    }
                }
            }
            REG_QUEUE_DESC_LOW
            | REG_QUEUE_DESC_HIGH
            | REG_QUEUE_DRIVER_LOW
            | REG_QUEUE_DRIVER_HIGH
            | REG_QUEUE_DEVICE_LOW
            | REG_QUEUE_DEVICE_HIGH => {
                if let Some(q) = m.setup_queue() {
                    let (field, align) = match off {
                        REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => (&mut q.desc, 16),
                        REG_QUEUE_DRIVER_LOW | REG_QUEUE_DRIVER_HIGH => (&mut q.avail, 2),
                        _ => (&mut q.used, 4),
                    };
                    let high = matches!(
                        off,
                        REG_QUEUE_DESC_HIGH | REG_QUEUE_DRIVER_HIGH | REG_QUEUE_DEVICE_HIGH
                    );
                    let new = if high {
                        (*field & 0xffff_ffff) | (u64::from(v) << 32)
                    } else {
                        (*field & !0xffff_ffff) | u64::from(v)
                    };
                    if new % align == 0 {
                        *field = new;
                    }
                }
            }
            REG_STATUS => {
                use status::*;
                let to = v & !NEEDS_RESET;
                let from = m.status;
                const INIT: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;
                let step = matches!(
                    (from, to),
                    (0, ACKNOWLEDGE) | (ACKNOWLEDGE, 0x3) | (0x3, 0xb) | (0xb, 0xf)
                );
                let fail = from & FAILED == 0 && from & !INIT == 0 && to == from | FAILED;
                if to == 0 {
                    m.reset();
                } else if step || fail {
                    let accept = to & !from != FEATURES_OK || {
                        let f = m.driver_features;
                        f & !m.offered == 0
                            && f & (1 << vmm::devices::virtio::VIRTIO_F_VERSION_1) != 0
                    };
                    if accept {
                        m.status = to;
                        driver_ok_now = to & !from == DRIVER_OK;
                    }
                }
            }
            _ => {}
        }
        self.compare_state(&format!("after writing {v:#x} at {off:#x}"));
        let nr = self.interrupt.needs_reset();
        let active = self.device_active();
        if off == REG_STATUS && v & !status::NEEDS_RESET == 0 {
            assert!(!nr, "reset left NEEDS_RESET set");
            assert!(!active, "reset left the device active");
            assert_eq!(self.interrupt.status(), 0, "reset left interrupt bits set");
        } else if driver_ok_now {
            let ok = self.m.queues.iter().all(ring_ok);
            assert_eq!(
                active,
                ok,
                "DRIVER_OK: device active = {active}, but the queues are {}valid: {:?}",
                if ok { "" } else { "not " },
                self.m.queues
            );
            assert_eq!(
                nr, !ok,
                "DRIVER_OK: NEEDS_RESET = {nr} with queues valid = {ok}"
            );
            if ok {
                let acked = self.acked_features();
                assert_eq!(acked, self.m.driver_features, "features the device acked");
            }
        } else {
            assert_eq!(nr, nr_before, "NEEDS_RESET changed on a write at {off:#x}");
        }
        if active {
            assert!(
                self.m.status & status::DRIVER_OK != 0,
                "device active without DRIVER_OK"
            );
        }
        if off == REG_INTERRUPT_ACK {
            assert_eq!(
                self.interrupt.status() & v,
                0,
                "ACK {v:#x} left those bits set"
            );
        }
    }

    fn device_active(&self) -> bool {
        match &self.dev {
            Dev::Blk(d) => d.lock().expect("lock").is_activated(),
            Dev::Net(d, _) => d.lock().expect("lock").is_activated(),
        }
    }

    fn acked_features(&self) -> u64 {
        match &self.dev {
            Dev::Blk(d) => d.lock().expect("lock").state().acked_features,
            Dev::Net(d, _) => d.lock().expect("lock").state().acked_features,
        }
    }

    fn compare_state(&self, when: &str) {
        let s = self.t.save();
        let m = &self.m;
        assert_eq!(s.device_status, m.status, "{when}: status");
        assert_eq!(s.device_features_sel, m.dfsel, "{when}: DeviceFeaturesSel");
        assert_eq!(s.driver_features_sel, m.drfsel, "{when}: DriverFeaturesSel");
        assert_eq!(s.queue_sel, m.qsel, "{when}: QueueSel");
        assert_eq!(
            s.acked_features, m.driver_features,
            "{when}: driver features"
        );
        assert_eq!(s.config_generation, 0, "{when}: config generation");
        assert_eq!(s.queues.len(), m.queues.len(), "{when}: queue count");
        for (i, (q, mq)) in s.queues.iter().zip(&m.queues).enumerate() {
            let got = QModel {
                max: q.max_size,
                size: q.size,
                ready: q.ready,
                desc: q.desc_table,
                avail: q.avail_ring,
                used: q.used_ring,
            };
            assert_eq!(&got, mq, "{when}: queue {i}");
        }
    }

    /// What the event loop does on notifications: process every queue.
    fn process(&mut self) {
        let active = self.device_active();
        let nr_before = self.interrupt.needs_reset();
        let before = MemSnapshot::take(&self.mem);
        let allowed = if active {
            self.writable_ranges()
        } else {
            Some(Vec::new())
        };
        match &self.dev {
            Dev::Blk(d) => crate::driver::blk_process(&mut d.lock().expect("lock")),
            Dev::Net(d, host) => {
                let mut g = d.lock().expect("lock");
                let tx_before = g.stats().tx_frames;
                g.process_tx();
                g.process_rx();
                let tx = g.stats().tx_frames - tx_before;
                drop(g);
                let mut got = 0;
                while host.recv().is_some() {
                    got += 1;
                }
                self.received += got;
                assert_eq!(
                    got, tx,
                    "frames the backend received vs. frames the device counted as sent"
                );
            }
        }
        let changed = before.changed(&self.mem);
        trace!(
            "mmio process: active {active}, {} bytes of guest memory changed, status {:#x}, isr {:#x}",
            changed.len(),
            self.m.status,
            self.interrupt.status()
        );
        if !active {
            assert!(
                changed.is_empty(),
                "an inactive device wrote guest memory at {:#x}",
                changed[0]
            );
            assert_eq!(
                self.interrupt.needs_reset(),
                nr_before,
                "an inactive device set NEEDS_RESET"
            );
            return;
        }
        if let Some(allowed) = allowed {
            crate::driver::assert_writes_within(&changed, &allowed, "virtio-mmio device");
        }
        if nr_before {
            assert!(
                self.interrupt.needs_reset(),
                "NEEDS_RESET cleared without a reset"
            );
        }
    }

    /// Device-writable descriptor buffers (direct, and one level of indirect tables) of every
    /// queue, plus the used rings: where an active device may write. `None` when one of those
    /// overlaps a descriptor table or ring: then the device's own writes change which buffers
    /// exist while it works, and the set cannot be known in advance.
    fn writable_ranges(&self) -> Option<Vec<(u64, u64)>> {
        let mut r = Vec::new();
        let mut structures = Vec::new();
        for q in &self.m.queues {
            let n = u64::from(q.size);
            r.push((q.used, q.used.saturating_add(6 + 8 * n)));
            structures.push((q.used, q.used.saturating_add(6 + 8 * n)));
            structures.push((q.avail, q.avail.saturating_add(6 + 2 * n)));
            let mut tables = vec![(q.desc, n)];
            let mut i = 0;
            while i < tables.len() && i < 64 {
                let (base, count) = tables[i];
                structures.push((base, base.saturating_add(16 * count)));
                i += 1;
                for k in 0..count.min(4096) {
                    let mut d = [0u8; 16];
                    if self
                        .mem
                        .read_slice(&mut d, GuestAddress(base.wrapping_add(16 * k)))
                        .is_err()
                    {
                        continue;
                    }
                    let addr = u64::from_le_bytes(d[0..8].try_into().expect("8"));
                    let len = u64::from(u32::from_le_bytes(d[8..12].try_into().expect("4")));
                    let flags = u16::from_le_bytes(d[12..14].try_into().expect("2"));
                    if flags & 4 != 0 && i == 1 {
                        tables.push((addr, len / 16));
                    }
                    if flags & 2 != 0 {
                        r.push((addr, addr.saturating_add(len)));
                    }
                }
            }
        }
        let overlaps = |a: &(u64, u64), b: &(u64, u64)| a.0 < b.1 && b.0 < a.1;
        let clash = r.iter().any(|w| structures.iter().any(|s| overlaps(w, s)))
            || structures
                .iter()
                .enumerate()
                .any(|(i, a)| structures[i + 1..].iter().any(|b| overlaps(a, b)));
        (!clash).then_some(r)
    }

    /// Save the transport's state and restore it onto a fresh device of the same kind (what a
    /// snapshot and restore do): the restored transport must report exactly the saved state,
    /// and the device is active exactly when the driver had set DRIVER_OK without NEEDS_RESET.
    fn snapshot_restore(&mut self) {
        let saved = self.t.save();
        let (dev, vdev, interrupt) = make_device(self.cfg);
        if saved.device_status & status::FEATURES_OK != 0 {
            vdev.lock()
                .expect("lock")
                .set_acked_features(saved.acked_features);
        }
        let args = TransportArgs {
            mem: self.mem.clone(),
            device: vdev,
        };
        let t = MmioTransport::restore(args, &saved)
            .unwrap_or_else(|e| panic!("restoring a state the transport saved: {e}\n{saved:?}"));
        assert_eq!(
            t.save(),
            saved,
            "the restored transport differs from the saved one"
        );
        self.t = t;
        self.dev = dev;
        self.interrupt = interrupt;
        let active = saved.device_status & status::DRIVER_OK != 0 && !saved.needs_reset;
        assert_eq!(self.device_active(), active, "device active after restore");
        self.compare_state("after restore");
    }

    /// Send a frame from the host side (net only).
    fn host_frame(&mut self, inp: &mut Input) {
        let len = usize::from(inp.u16() % 2048);
        let b = inp.bytes(len).to_vec();
        if let Dev::Net(_, host) = &self.dev {
            if host.send(&b) {
                self.sent += 1;
            }
        }
    }
}
