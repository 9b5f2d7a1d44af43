//! virtio-blk and virtio-net attached to a real KVM VM through the public
//! attach API (irqfd + ioeventfds registered with KVM, transport on the MMIO
//! bus, devices on an event loop running on its own thread), driven by a
//! small virtio driver written in this test: it does what a guest driver
//! does through the MMIO bus and guest memory. Real image files; a real TAP
//! moved into a network namespace this test creates, with an AF_PACKET
//! responder inside it.
//!
//! Queue notifications here reach the transport through the bus (no vCPU
//! runs), which forwards them to the same eventfd KVM would signal.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use microvirt_testsupport::TempDir;
use vm_memory::{Bytes, GuestAddress};
use vmm::device_manager::attach::{self, AttachError};
use vmm::device_manager::mmio::MmioDeviceManager;
use vmm::devices::bus::Bus;
use vmm::devices::virtio::testing::Rings;
use vmm::devices::virtio::{self, mmio as regs, status, BlockConfig, NetConfig, VmmEventManager};
use vmm::vstate::memory::GuestMemoryMmap;

mod virtio_common;
use virtio_common::{responder, ScratchNetns, ETH_P};

const MEM: usize = 64 << 20;

struct TestVm {
    _kvm: kvm_ioctls::Kvm,
    vm: kvm_ioctls::VmFd,
    mem: GuestMemoryMmap,
    bus: Arc<Mutex<Bus>>,
    mgr: MmioDeviceManager,
    evmgr: Option<VmmEventManager>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<VmmEventManager>>,
}

impl TestVm {
    fn new() -> Self {
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        vm.create_irq_chip().expect("KVM_CREATE_IRQCHIP");
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
        TestVm {
            _kvm: kvm,
            vm,
            mem,
            bus: Arc::new(Mutex::new(Bus::new())),
            mgr: MmioDeviceManager::new(),
            evmgr: Some(VmmEventManager::new().unwrap()),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    fn attach_block(&mut self, cfg: &str) -> Result<u64, AttachError> {
        let cfg: BlockConfig = cfg.parse().unwrap();
        let mut bus = self.bus.lock().unwrap();
        let ev = self.evmgr.as_mut().expect("attach before start");
        let io = Default::default();
        attach::attach_block(&self.vm, &self.mem, &mut bus, &mut self.mgr, ev, &cfg, io)
            .map(|a| a.slot.addr)
    }

    fn attach_net(&mut self, cfg: &NetConfig) -> u64 {
        let mut bus = self.bus.lock().unwrap();
        let ev = self.evmgr.as_mut().expect("attach before start");
        attach::attach_net(&self.vm, &self.mem, &mut bus, &mut self.mgr, ev, cfg, None)
            .unwrap()
            .slot
            .addr
    }

    /// Run the event loop on its own thread (as the VMM does).
    fn start(&mut self) {
        let mut ev = self.evmgr.take().unwrap();
        let stop = self.stop.clone();
        self.thread = Some(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                ev.run_with_timeout(10).unwrap();
            }
            ev
        }));
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Driver-side split queue in guest memory: the shared ring code and this driver's books.
struct DrvQueue {
    rings: Rings,
    next_desc: u16,
    last_used: u16,
}

/// A virtio-mmio driver over the bus.
struct Driver<'a> {
    vm: &'a TestVm,
    base: u64,
}

impl<'a> Driver<'a> {
    fn rd(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        assert!(self.vm.bus.lock().unwrap().read(self.base + off, &mut b));
        u32::from_le_bytes(b)
    }
    fn wr(&self, off: u64, v: u32) {
        assert!(self
            .vm
            .bus
            .lock()
            .unwrap()
            .write(self.base + off, &v.to_le_bytes()));
    }
    fn config(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.vm
            .bus
            .lock()
            .unwrap()
            .read(self.base + regs::REG_CONFIG + off, &mut b);
        b
    }

    fn features(&self) -> u64 {
        self.wr(regs::REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.rd(regs::REG_DEVICE_FEATURES);
        self.wr(regs::REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.rd(regs::REG_DEVICE_FEATURES);
        u64::from(lo) | (u64::from(hi) << 32)
    }

    /// Full initialisation; `queues[i]` = (guest base, size). Returns the queues.
    fn init(&self, accept: u64, queues: &[(u64, u16)]) -> Vec<DrvQueue> {
        assert_eq!(self.rd(regs::REG_MAGIC), 0x7472_6976);
        assert_eq!(self.rd(regs::REG_VERSION), 2);
        self.wr(regs::REG_STATUS, 0);
        self.wr(regs::REG_STATUS, status::ACKNOWLEDGE);
        self.wr(regs::REG_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let f = self.features() & accept;
        self.wr(regs::REG_DRIVER_FEATURES_SEL, 0);
        self.wr(regs::REG_DRIVER_FEATURES, f as u32);
        self.wr(regs::REG_DRIVER_FEATURES_SEL, 1);
        self.wr(regs::REG_DRIVER_FEATURES, (f >> 32) as u32);
        let fo = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        self.wr(regs::REG_STATUS, fo);
        assert_eq!(self.rd(regs::REG_STATUS), fo, "features refused");
        let mut out = Vec::new();
        for (i, &(base, size)) in queues.iter().enumerate() {
            self.wr(regs::REG_QUEUE_SEL, i as u32);
            assert!(self.rd(regs::REG_QUEUE_NUM_MAX) >= u32::from(size));
            let q = DrvQueue::new(&self.vm.mem, base, size);
            self.wr(regs::REG_QUEUE_NUM, u32::from(size));
            self.wr(regs::REG_QUEUE_DESC_LOW, q.rings.desc as u32);
            self.wr(regs::REG_QUEUE_DESC_HIGH, 0);
            self.wr(regs::REG_QUEUE_DRIVER_LOW, q.rings.avail as u32);
            self.wr(regs::REG_QUEUE_DRIVER_HIGH, 0);
            self.wr(regs::REG_QUEUE_DEVICE_LOW, q.rings.used as u32);
            self.wr(regs::REG_QUEUE_DEVICE_HIGH, 0);
            self.wr(regs::REG_QUEUE_READY, 1);
            out.push(q);
        }
        self.wr(regs::REG_STATUS, fo | status::DRIVER_OK);
        assert_eq!(self.rd(regs::REG_STATUS), fo | status::DRIVER_OK);
        out
    }

    fn notify(&self, q: u32) {
        self.wr(regs::REG_QUEUE_NOTIFY, q);
    }

    /// Wait for the next used element of `q`: (head, len).
    fn wait_used(&self, q: &mut DrvQueue) -> (u16, u32) {
        let t = Instant::now();
        loop {
            if let Some(u) = q.pop_used(&self.vm.mem) {
                let isr = self.rd(regs::REG_INTERRUPT_STATUS);
                self.wr(regs::REG_INTERRUPT_ACK, isr);
                return u;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "device did not complete a chain"
            );
            thread::sleep(Duration::from_micros(200));
        }
    }
}

impl DrvQueue {
    fn new(mem: &GuestMemoryMmap, base: u64, size: u16) -> Self {
        let rings = Rings::packed(base, size);
        rings.zero(mem, rings.used_range().1);
        DrvQueue {
            rings,
            next_desc: 0,
            last_used: 0,
        }
    }

    /// Add a chain of (addr, len, device_writable) and publish it.
    fn add(&mut self, mem: &GuestMemoryMmap, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        self.next_desc = self.rings.write_chain(mem, head, descs);
        self.rings.push_avail(mem, head);
        head
    }

    fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Option<(u16, u32)> {
        if self.rings.used_idx(mem) == self.last_used {
            return None;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let (id, len) = self.rings.used_elem(mem, self.last_used);
        self.last_used = self.last_used.wrapping_add(1);
        Some((id as u16, len))
    }
}

// ---------------------------------------------------------------- block

const VERSION_1: u64 = 1 << 32;
const BLK_FEATURES: u64 =
    VERSION_1 | (1 << 9) | (1 << 5) | (1 << 13) | (1 << 14) | (1 << 2) | (1 << 6);
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x20_0000;
const STATUS: u64 = 0x30_0000;

struct Blk<'a> {
    d: Driver<'a>,
    q: DrvQueue,
}

impl<'a> Blk<'a> {
    fn new(vm: &'a TestVm, base: u64, qbase: u64) -> Self {
        let d = Driver { vm, base };
        let mut qs = d.init(BLK_FEATURES, &[(qbase, 16)]);
        Blk { d, q: qs.remove(0) }
    }

    /// One request; returns (status, used len).
    fn req(&mut self, t: u32, sector: u64, data: &[(u64, u32, bool)]) -> (u8, u32) {
        let mem = &self.d.vm.mem;
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&t.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        mem.write_slice(&h, GuestAddress(HDR)).unwrap();
        mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
        let mut descs = vec![(HDR, 16, false)];
        descs.extend_from_slice(data);
        descs.push((STATUS, 1, true));
        let head = self.q.add(mem, &descs);
        self.d.notify(0);
        let (id, len) = self.d.wait_used(&mut self.q);
        assert_eq!(id, head);
        (mem.read_obj(GuestAddress(STATUS)).unwrap(), len)
    }
}

/// An image file `name` in `dir` of `len` bytes, byte `i` being `f(i)`.
fn image(dir: &TempDir, name: &str, len: usize, f: impl Fn(usize) -> u8) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, (0..len).map(f).collect::<Vec<u8>>()).unwrap();
    p
}

#[test]
fn blk_write_flush_read_get_id_ro_and_hostile_on_kvm() {
    let dir = TempDir::new("virtio-kvm-blk");
    let rw = image(&dir, "rw.img", 4 << 20, |_| 0);
    let ro = image(&dir, "ro.img", 1 << 20, |i| (i % 253) as u8);
    let ro_before = fs::read(&ro).unwrap();
    let mut vm = TestVm::new();
    let a = vm
        .attach_block(&format!("path={},id=microvirt-disk-a", rw.display()))
        .unwrap();
    let b = vm
        .attach_block(&format!("path={},ro,id=ro-disk", ro.display()))
        .unwrap();
    assert_eq!(
        vm.mgr.cmdline_entries(),
        vec![
            "virtio_mmio.device=4K@0xc0001000:5",
            "virtio_mmio.device=4K@0xc0002000:6"
        ]
    );
    vm.start();

    let mut d = Blk::new(&vm, a, 0x1000);
    assert_eq!(d.d.rd(regs::REG_DEVICE_ID), 2);
    // capacity in sectors
    assert_eq!(
        u64::from_le_bytes(d.d.config(0, 8).try_into().unwrap()),
        (4 << 20) / 512
    );
    // Write a 64 KiB pattern, FLUSH, read it back.
    let pattern: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    vm.mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
    assert_eq!(d.req(1, 100, &[(DATA, 65536, false)]), (0, 1));
    assert_eq!(d.req(4, 0, &[]), (0, 1));
    assert_eq!(
        &fs::read(&rw).unwrap()[100 * 512..100 * 512 + 65536],
        &pattern[..],
        "data on disk after FLUSH"
    );
    assert_eq!(d.req(0, 100, &[(DATA + 0x8_0000, 65536, true)]), (0, 65537));
    let mut back = vec![0u8; 65536];
    vm.mem
        .read_slice(&mut back, GuestAddress(DATA + 0x8_0000))
        .unwrap();
    assert_eq!(back, pattern);
    // GET_ID.
    assert_eq!(d.req(8, 0, &[(DATA, 20, true)]), (0, 21));
    let mut id = [0u8; 20];
    vm.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..15], b"microvirt-disk-");
    // Hostile: data buffer outside guest memory -> IOERR; the device keeps working.
    assert_eq!(d.req(0, 0, &[(0x7_0000_0000, 4096, true)]).0, 1);
    assert_eq!(d.req(0, 100, &[(DATA, 512, true)]), (0, 513));
    // Discard + write zeroes on the raw file.
    let mut seg = 100u64.to_le_bytes().to_vec();
    seg.extend_from_slice(&8u32.to_le_bytes());
    seg.extend_from_slice(&0u32.to_le_bytes());
    vm.mem.write_slice(&seg, GuestAddress(DATA)).unwrap();
    assert_eq!(d.req(13, 0, &[(DATA, 16, false)]).0, 0);
    assert!(fs::read(&rw).unwrap()[100 * 512..108 * 512]
        .iter()
        .all(|&x| x == 0));

    // Read-only disk: writes refused, file unchanged, reads fine.
    let mut r = Blk::new(&vm, b, 0x8000);
    assert_ne!(r.d.features() & (1 << 5), 0, "VIRTIO_BLK_F_RO offered");
    vm.mem
        .write_slice(&[0x77u8; 4096], GuestAddress(DATA))
        .unwrap();
    assert_eq!(r.req(1, 0, &[(DATA, 4096, false)]).0, 1);
    assert_eq!(r.req(0, 1, &[(DATA, 512, true)]).0, 0);
    let mut s = [0u8; 512];
    vm.mem.read_slice(&mut s, GuestAddress(DATA)).unwrap();
    assert_eq!(&s[..], &ro_before[512..1024]);
    drop(vm);
    assert_eq!(
        fs::read(&ro).unwrap(),
        ro_before,
        "read-only image modified"
    );
}

#[test]
fn blk_broken_chain_sets_needs_reset_and_reset_recovers() {
    let dir = TempDir::new("virtio-kvm-reset");
    let img = image(&dir, "nr.img", 1 << 20, |_| 0x42);
    let mut vm = TestVm::new();
    let a = vm.attach_block(&format!("path={}", img.display())).unwrap();
    vm.start();
    let d = Blk::new(&vm, a, 0x1000);
    // A descriptor loop: 0 -> 1 -> 0.
    d.q.rings.write_desc(&vm.mem, 0, HDR, 16, 1, 1);
    d.q.rings.write_desc(&vm.mem, 1, DATA, 512, 3, 0);
    d.q.rings.push_avail(&vm.mem, 0);
    d.d.notify(0);
    let t = Instant::now();
    while d.d.rd(regs::REG_STATUS) & status::NEEDS_RESET == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "no NEEDS_RESET");
        thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(d.d.rd(regs::REG_INTERRUPT_STATUS) & virtio::INT_CONFIG, 0);
    // Reset and start over: the device works again.
    let mut d = Blk::new(&vm, a, 0x1000);
    assert_eq!(d.d.rd(regs::REG_STATUS) & status::NEEDS_RESET, 0);
    assert_eq!(d.req(0, 0, &[(DATA, 512, true)]), (0, 513));
}

#[test]
fn blk_overlay_keeps_base_identical_and_vms_isolated() {
    let dir = TempDir::new("virtio-kvm-overlay");
    let base = image(&dir, "base.img", 2 << 20, |i| (i / 512) as u8);
    let base_before = fs::read(&base).unwrap();
    let (o1, o2) = (dir.join("vm1.ovl"), dir.join("vm2.ovl"));
    let mut vm1 = TestVm::new();
    let mut vm2 = TestVm::new();
    let a = vm1
        .attach_block(&format!("path={},overlay={}", base.display(), o1.display()))
        .unwrap();
    let b = vm2
        .attach_block(&format!("path={},overlay={}", base.display(), o2.display()))
        .unwrap();
    // A third VM cannot take VM 1's overlay, nor write the base.
    let mut vm3 = TestVm::new();
    assert!(vm3
        .attach_block(&format!("path={},overlay={}", base.display(), o1.display()))
        .is_err());
    assert!(vm3
        .attach_block(&format!("path={}", base.display()))
        .is_err());
    assert!(
        vm3.mgr.cmdline_entries().is_empty(),
        "failed attaches leave no cmdline entry"
    );
    vm1.start();
    vm2.start();
    let mut d1 = Blk::new(&vm1, a, 0x1000);
    let mut d2 = Blk::new(&vm2, b, 0x1000);
    vm1.mem
        .write_slice(&[0xa1u8; 8192], GuestAddress(DATA))
        .unwrap();
    vm2.mem
        .write_slice(&[0xb2u8; 4096], GuestAddress(DATA))
        .unwrap();
    assert_eq!(d1.req(1, 10, &[(DATA, 8192, false)]).0, 0);
    assert_eq!(d2.req(1, 12, &[(DATA, 4096, false)]).0, 0);
    assert_eq!(d1.req(4, 0, &[]).0, 0);
    assert_eq!(d2.req(4, 0, &[]).0, 0);
    let read = |d: &mut Blk, vm: &TestVm| {
        assert_eq!(d.req(0, 8, &[(DATA + 0x8_0000, 16 * 512, true)]).0, 0);
        let mut v = vec![0u8; 16 * 512];
        vm.mem
            .read_slice(&mut v, GuestAddress(DATA + 0x8_0000))
            .unwrap();
        v
    };
    let v1 = read(&mut d1, &vm1);
    let v2 = read(&mut d2, &vm2);
    for s in 0..16usize {
        let sec = 8 + s;
        let w1 = if (10..26).contains(&sec) {
            0xa1
        } else {
            sec as u8
        };
        let w2 = if (12..20).contains(&sec) {
            0xb2
        } else {
            sec as u8
        };
        assert!(
            v1[s * 512..(s + 1) * 512].iter().all(|&x| x == w1),
            "vm1 sector {sec}"
        );
        assert!(
            v2[s * 512..(s + 1) * 512].iter().all(|&x| x == w2),
            "vm2 sector {sec}"
        );
    }
    drop(vm1);
    drop(vm2);
    assert_eq!(fs::read(&base).unwrap(), base_before, "base image modified");
}

// ---------------------------------------------------------------- net

struct Net<'a> {
    d: Driver<'a>,
    rx: DrvQueue,
    tx: DrvQueue,
    mac: [u8; 6],
}

const RXBUF: u64 = 0x100_0000;
const TXBUF: u64 = 0x200_0000;

impl<'a> Net<'a> {
    fn new(vm: &'a TestVm, base: u64, rx_size: u16) -> Self {
        let d = Driver { vm, base };
        // VERSION_1 + MAC (no offloads: plain frames).
        let mut qs = d.init(VERSION_1 | (1 << 5), &[(0x1000, rx_size), (0x8000, 64)]);
        let tx = qs.pop().unwrap();
        let rx = qs.pop().unwrap();
        let mac: [u8; 6] = d.config(0, 6).try_into().unwrap();
        let mut n = Net { d, rx, tx, mac };
        for i in 0..rx_size {
            n.give_rx(i);
        }
        n.d.notify(0);
        n
    }
    fn give_rx(&mut self, slot: u16) {
        let addr = RXBUF + u64::from(slot) * 0x1000;
        self.rx.add(&self.d.vm.mem, &[(addr, 1526 + 12, true)]);
    }
    fn send_ping(&mut self, n: u32, slot: u64) {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&ETH_P.to_be_bytes());
        f.extend_from_slice(format!("microvirt ping {n}").as_bytes());
        f.resize(12 + 60, 0);
        let addr = TXBUF + (slot % 64) * 0x1000;
        self.d.vm.mem.write_slice(&f, GuestAddress(addr)).unwrap();
        self.tx
            .add(&self.d.vm.mem, &[(addr, f.len() as u32, false)]);
    }
    /// Next received 0x88b5 frame's payload (after the vnet and Ethernet
    /// headers), re-posting each buffer. Other frames the kernel sends on
    /// the TAP (IPv6 neighbour discovery...) are skipped.
    fn recv(&mut self) -> Vec<u8> {
        loop {
            let (head, len) = self.d.wait_used(&mut self.rx);
            let addr = RXBUF + u64::from(head) * 0x1000;
            let mut f = vec![0u8; len as usize];
            self.d
                .vm
                .mem
                .read_slice(&mut f, GuestAddress(addr))
                .unwrap();
            self.rx.add(&self.d.vm.mem, &[(addr, 1526 + 12, true)]);
            self.d.notify(0);
            assert!(len as usize >= 12 + 14, "short frame");
            if f[24..26] != ETH_P.to_be_bytes() {
                continue;
            }
            assert_eq!(&f[12..18], &self.mac, "frame addressed to our MAC");
            return f[26..].to_vec();
        }
    }
}

fn pong_number(p: &[u8]) -> u32 {
    let rest = p.strip_prefix(b"microvirt pong ").expect("a pong");
    let digits: Vec<u8> = rest
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).unwrap().parse().unwrap()
}

#[test]
fn net_ping_pong_through_a_tap_in_a_netns_and_in_order_with_a_small_ring() {
    let id = std::process::id() % 100_000;
    let ns = ScratchNetns::new("virtio");
    let tap = format!("mvtap{id}");
    let cfg: NetConfig = format!("tap={tap},mac=52:54:00:12:34:56").parse().unwrap();
    let mut vm = TestVm::new();
    let base = vm.attach_net(&cfg);
    // Move the TAP (our fd stays attached) into the namespace and bring it up.
    assert!(std::process::Command::new("ip")
        .args(["link", "set", &tap, "netns", ns.name()])
        .status()
        .unwrap()
        .success());
    ns.ip(&["link", "set", &tap, "up"]);
    let stop = Arc::new(AtomicBool::new(false));
    let resp = responder(&ns, &tap, stop.clone());
    vm.start();

    // Small RX ring: 4 buffers.
    let mut n = Net::new(&vm, base, 4);
    assert_eq!(n.mac, [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
    // One ping, one pong.
    n.send_ping(0, 0);
    n.d.notify(1);
    assert_eq!(pong_number(&n.recv()), 0);
    // Many frames at once: the guest sends K pings back to back, the responder
    // answers each; with only 4 RX buffers the device must hold frames back
    // (back-pressure) and deliver all K, complete and in order.
    const K: u32 = 300;
    let mut sent = 1u32;
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < K as usize {
        // Keep the TX ring fed.
        while sent <= K && (sent as u64) < got.len() as u64 + 60 {
            n.send_ping(sent, u64::from(sent));
            sent += 1;
        }
        n.d.notify(1);
        // Reap TX completions.
        while n.tx.pop_used(&vm.mem).is_some() {}
        got.push(pong_number(&n.recv()));
        assert!(t.elapsed() < Duration::from_secs(60));
    }
    let want: Vec<u32> = (1..=K).collect();
    assert_eq!(got, want, "pongs lost, duplicated or reordered");
    stop.store(true, Ordering::SeqCst);
    assert_eq!(resp.join().unwrap(), K + 1);
}
