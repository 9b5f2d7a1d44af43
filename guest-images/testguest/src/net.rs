//! virtio-net driver exercise (`testguest.scenario=net` / `net-many`).
//!
//! Protocol with the test's responder (ethertype 0x88b5, frames padded to 60 bytes): it answers
//! every `microvirt ping <n>` with `microvirt pong <n>`.
//! * First the guest sends `microvirt ping <n>` to the broadcast address from the config MAC,
//!   n = 1000000, 1000001, ... one per second until a pong for one of them arrives (5 tries).
//! * With `testguest.net_count=K` (or scenario `net-many`, K defaulting to 32) it then sends
//!   pings 0..K-1 back to back, keeping up to 32 unanswered (more than the 8 RX buffers, so the
//!   device has to hold frames back), and expects the pongs 0..K-1 complete and in order. Late
//!   pongs of the first phase (n >= 1000000) are ignored.

use crate::bootinfo::BootInfo;
use crate::smp::tsc_per_ms;
use crate::virtio::{self, read8, write8, Buf, DmaArena, InitError, Mmio, Virtqueue, DEVICE_NET};
use crate::{print, println};

const F_MAC: u64 = 1 << 5;
const ETHERTYPE: u16 = 0x88b5;
/// virtio_net_hdr with VERSION_1 (num_buffers included).
const HDR_LEN: u64 = 12;
const RX_BUFS: u16 = 8;
const RX_BUF_LEN: u64 = 2048;
const PING_TRIES: u64 = 5;
/// Numbers of the first-phase pings start here (the many phase uses 0..K-1).
const PING_BASE: u64 = 1_000_000;
/// Unanswered pings allowed in the many phase.
const WINDOW: u64 = 32;
/// Ethernet minimum frame length (without FCS).
const MIN_FRAME: u64 = 60;
const PING_WAIT_MS: u64 = 1000;
const MANY_WAIT_MS: u64 = 3000;
const DEFAULT_MANY: u64 = 32;
/// Most frames counted in many mode.
const MANY_MAX: u64 = PING_BASE;
const PAYLOAD_MAX: usize = 64;

pub(crate) struct Net {
    pub(crate) mmio: Mmio,
    rx: Virtqueue,
    tx: Virtqueue,
    rx_bufs: u64,
    tx_buf: u64,
    pub(crate) mac: [u8; 6],
    pub(crate) tsc_ms: u64,
}

/// A received frame's payload (first `PAYLOAD_MAX` bytes), for our ethertype only.
pub(crate) struct Frame {
    payload: [u8; PAYLOAD_MAX],
    len: usize,
}

impl Frame {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.payload[..self.len]
    }
    /// The decimal number after the last space (trailing NULs/padding ignored).
    fn number(&self) -> Option<u64> {
        crate::parse::trailing_number(self.bytes())
    }
}

impl Net {
    pub(crate) fn send(&mut self, payload: &[u8]) -> bool {
        let frame = self.tx_buf + HDR_LEN;
        for k in 0..HDR_LEN {
            write8(self.tx_buf + k, 0);
        }
        for k in 0..6 {
            write8(frame + k, 0xff);
            write8(frame + 6 + k, self.mac[k as usize]);
        }
        write8(frame + 12, (ETHERTYPE >> 8) as u8);
        write8(frame + 13, ETHERTYPE as u8);
        let plen = payload.len() as u64;
        for (k, &b) in payload.iter().enumerate() {
            write8(frame + 14 + k as u64, b);
        }
        for k in 14 + plen..MIN_FRAME {
            write8(frame + k, 0);
        }
        let len = (HDR_LEN + MIN_FRAME.max(14 + plen)) as u32;
        if self
            .tx
            .push_chain(
                0,
                &[Buf {
                    addr: self.tx_buf,
                    len,
                    write: false,
                }],
            )
            .is_none()
        {
            return false;
        }
        self.tx.notify();
        let done = self.tx.wait_used(self.tsc_ms * 1000).is_some();
        self.mmio.ack_interrupt();
        done
    }

    /// Next frame of our ethertype within `ms`; other frames are dropped. Buffers are
    /// re-posted as soon as they are read.
    pub(crate) fn recv(&mut self, ms: u64) -> Option<Frame> {
        let t0 = crate::io::rdtsc();
        let limit = self.tsc_ms.saturating_mul(ms);
        loop {
            let left = limit.saturating_sub(crate::io::rdtsc().wrapping_sub(t0));
            if left == 0 {
                return None;
            }
            let (id, len) = self.rx.wait_used(left)?;
            self.mmio.ack_interrupt();
            let frame = if id < u32::from(RX_BUFS) {
                let buf = self.rx_bufs + u64::from(id) * RX_BUF_LEN;
                let f = self.parse(buf, u64::from(len).min(RX_BUF_LEN));
                self.rx.make_available(id as u16);
                self.rx.notify();
                f
            } else {
                None
            };
            if frame.is_some() {
                return frame;
            }
        }
    }

    fn parse(&self, buf: u64, len: u64) -> Option<Frame> {
        if len < HDR_LEN + 14 {
            return None;
        }
        let eth = buf + HDR_LEN;
        let ty = (u16::from(read8(eth + 12)) << 8) | u16::from(read8(eth + 13));
        if ty != ETHERTYPE {
            return None;
        }
        let plen = ((len - HDR_LEN - 14) as usize).min(PAYLOAD_MAX);
        let mut f = Frame {
            payload: [0; PAYLOAD_MAX],
            len: plen,
        };
        for (k, b) in f.payload[..plen].iter_mut().enumerate() {
            *b = read8(eth + 14 + k as u64);
        }
        Some(f)
    }
}

impl Net {
    /// Sends a whole Ethernet frame (at most a page minus the virtio-net header).
    pub(crate) fn send_raw(&mut self, frame: &[u8]) -> bool {
        let len = frame.len().min(4096 - HDR_LEN as usize);
        for k in 0..HDR_LEN {
            write8(self.tx_buf + k, 0);
        }
        // SAFETY: tx_buf is a page of identity-mapped RAM from the DMA arena that the device
        // does not use while no TX chain is outstanding (`send*` waits for completion).
        unsafe {
            core::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                (self.tx_buf + HDR_LEN) as usize as *mut u8,
                len,
            )
        };
        let b = Buf {
            addr: self.tx_buf,
            len: (HDR_LEN as usize + len) as u32,
            write: false,
        };
        if self.tx.push_chain(0, &[b]).is_none() {
            return false;
        }
        self.tx.notify();
        let done = self.tx.wait_used(self.tsc_ms * 1000).is_some();
        self.mmio.ack_interrupt();
        done
    }

    /// Copies the next received frame (any type, without the virtio-net header) into `out`
    /// within `ms`; returns its length (cut to `out.len()`). The buffer is re-posted at once.
    pub(crate) fn recv_raw(&mut self, ms: u64, out: &mut [u8]) -> Option<usize> {
        let (id, len) = self.rx.wait_used(self.tsc_ms.saturating_mul(ms).max(1))?;
        self.mmio.ack_interrupt();
        if id >= u32::from(RX_BUFS) {
            return None;
        }
        let buf = self.rx_bufs + u64::from(id) * RX_BUF_LEN;
        let total = u64::from(len).min(RX_BUF_LEN);
        let n = (total.saturating_sub(HDR_LEN) as usize).min(out.len());
        // SAFETY: the device returned buffer `id` (the used ring read fences), so its bytes
        // are ours until it is re-posted below; it lies in identity-mapped RAM of the DMA arena
        // and `HDR_LEN + n <= RX_BUF_LEN`.
        unsafe {
            core::ptr::copy_nonoverlapping(
                (buf + HDR_LEN) as usize as *const u8,
                out.as_mut_ptr(),
                n,
            )
        };
        self.rx.make_available(id as u16);
        self.rx.notify();
        Some(n)
    }
}

/// Brings up the first virtio-net device on the command line.
pub(crate) fn open(bi: &BootInfo) -> Result<Net, &'static str> {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let base = addrs[..n]
        .iter()
        .copied()
        .find(|&a| Mmio { base: a }.probe() == Some(DEVICE_NET))
        .ok_or("no device")?;
    let mut arena = DmaArena::new(bi).ok_or("no RAM for DMA buffers")?;
    init(Mmio { base }, &mut arena, tsc_per_ms().max(1)).map_err(|_| "init failed")
}

/// Formats `prefix <n>` into `buf`, returning the used part.
fn message<'a>(buf: &'a mut [u8; 40], prefix: &[u8], n: u64) -> &'a [u8] {
    let mut len = prefix.len().min(20);
    buf[..len].copy_from_slice(&prefix[..len]);
    let mut digits = [0u8; 20];
    let mut d = 0;
    let mut v = n;
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        buf[len] = digits[d];
        len += 1;
    }
    &buf[..len]
}

pub(crate) fn init(mmio: Mmio, arena: &mut DmaArena, tsc_ms: u64) -> Result<Net, InitError> {
    mmio.begin_init(F_MAC)?;
    let mut rx = mmio.setup_queue(0, arena)?;
    let tx = mmio.setup_queue(1, arena)?;
    let rx_bufs = arena
        .alloc(RX_BUF_LEN * u64::from(RX_BUFS) / 4096)
        .ok_or(InitError::NoMemory)?;
    let tx_buf = arena.alloc(1).ok_or(InitError::NoMemory)?;
    for i in 0..RX_BUFS.min(rx.size) {
        let b = Buf {
            addr: rx_bufs + u64::from(i) * RX_BUF_LEN,
            len: RX_BUF_LEN as u32,
            write: true,
        };
        rx.push_chain(i, &[b]);
    }
    mmio.finish_init();
    rx.notify();
    let mut mac = [0u8; 6];
    for (k, m) in mac.iter_mut().enumerate() {
        *m = mmio.config8(k as u64);
    }
    Ok(Net {
        mmio,
        rx,
        tx,
        rx_bufs,
        tx_buf,
        mac,
        tsc_ms,
    })
}

/// Runs the network checks on the first virtio-net device on the command line.
pub fn run(bi: &BootInfo, many_default: bool) {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    let Some(base) = addrs[..n]
        .iter()
        .copied()
        .find(|&a| Mmio { base: a }.probe() == Some(DEVICE_NET))
    else {
        println!("net: no device");
        return;
    };
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("net: no RAM for DMA buffers");
        return;
    };
    let mut net = match init(Mmio { base }, &mut arena, tsc_per_ms().max(1)) {
        Ok(n) => n,
        Err(e) => {
            println!("net: init failed: {:?}", e);
            return;
        }
    };
    let m = net.mac;
    print!(
        "net: mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} ",
        m[0], m[1], m[2], m[3], m[4], m[5]
    );
    let mut ok = false;
    let mut sent = 0;
    let mut buf = [0u8; 40];
    'ping: for seq in PING_BASE..PING_BASE + PING_TRIES {
        if !net.send(message(&mut buf, b"microvirt ping ", seq)) {
            break;
        }
        sent += 1;
        let t0 = crate::io::rdtsc();
        while crate::io::rdtsc().wrapping_sub(t0) < net.tsc_ms * PING_WAIT_MS {
            let Some(f) = net.recv(PING_WAIT_MS) else {
                break;
            };
            if f.bytes().starts_with(b"microvirt pong ")
                && f.number().is_some_and(|v| (PING_BASE..=seq).contains(&v))
            {
                ok = true;
                break 'ping;
            }
        }
    }
    if ok {
        println!("tx/rx ok");
    } else {
        println!("no pong (sent {} pings)", sent);
        return;
    }

    let count = match bi.param("testguest.net_count") {
        Some(v) => virtio::parse_num(v).map(|k| k.min(MANY_MAX)),
        None if many_default => Some(DEFAULT_MANY),
        None => None,
    };
    let Some(k) = count else { return };
    let mut next_send = 0u64;
    let mut next = 0u64;
    while next < k {
        while next_send < k && next_send < next + WINDOW {
            if !net.send(message(&mut buf, b"microvirt ping ", next_send)) {
                println!("net: ping {} not sent", next_send);
                return;
            }
            next_send += 1;
        }
        let Some(f) = net.recv(MANY_WAIT_MS) else {
            println!("net: received {} of {} (timeout)", next, k);
            return;
        };
        if !f.bytes().starts_with(b"microvirt pong ") {
            continue;
        }
        match f.number() {
            Some(v) if v >= PING_BASE => {} // late answer to a first-phase ping
            Some(v) if v == next => next += 1,
            Some(v) => {
                println!("net: gap: expected {} got {}", next, v);
                return;
            }
            None => {
                print!("net: unexpected frame: ");
                crate::serial::write_bytes_escaped(f.bytes());
                println!();
                return;
            }
        }
    }
    println!("net: received {} in order", k);
}
