//! The virtio-net device: features (MAC, offloads the TAP supports), config
//! space, activation, and the RX/TX entry points the event handler calls.

use std::os::fd::{AsRawFd, RawFd};

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;

use super::frames::{self, NetStats, RxState};
use super::tap::{FrameIo, Tap, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6};
use super::{MacAddr, NetConfig};
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::common::VirtioCommon;
use crate::devices::virtio::notify::{self, VIRTIO_RING_F_EVENT_IDX};
use crate::devices::virtio::{
    read_config_bytes, VirtioDevice, VirtioError, TYPE_NET, VIRTIO_F_VERSION_1,
};

/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;

pub const VIRTIO_NET_F_CSUM: u32 = 0;
pub const VIRTIO_NET_F_GUEST_CSUM: u32 = 1;
pub const VIRTIO_NET_F_MAC: u32 = 5;
pub const VIRTIO_NET_F_GUEST_TSO4: u32 = 7;
pub const VIRTIO_NET_F_GUEST_TSO6: u32 = 8;
pub const VIRTIO_NET_F_HOST_TSO4: u32 = 11;
pub const VIRTIO_NET_F_HOST_TSO6: u32 = 12;

/// Features offered for a backend supporting the TUN_F_* bits `tun`.
pub fn features_for(tun: u32, mac: bool) -> u64 {
    let mut f = (1u64 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_EVENT_IDX);
    if mac {
        f |= 1 << VIRTIO_NET_F_MAC;
    }
    // Guest -> TAP: a vnet-header TAP accepts partial checksums and GSO.
    f |= (1 << VIRTIO_NET_F_CSUM) | (1 << VIRTIO_NET_F_HOST_TSO4) | (1 << VIRTIO_NET_F_HOST_TSO6);
    // TAP -> guest: only what the TAP can be told to produce.
    if tun & TUN_F_CSUM != 0 {
        f |= 1 << VIRTIO_NET_F_GUEST_CSUM;
        if tun & TUN_F_TSO4 != 0 {
            f |= 1 << VIRTIO_NET_F_GUEST_TSO4;
        }
        if tun & TUN_F_TSO6 != 0 {
            f |= 1 << VIRTIO_NET_F_GUEST_TSO6;
        }
    }
    f
}

/// TUN_F_* bits to enable for the acked feature set.
pub fn tun_offloads_for(acked: u64) -> u32 {
    let has = |b: u32| acked & (1u64 << b) != 0;
    let mut t = 0;
    if has(VIRTIO_NET_F_GUEST_CSUM) {
        t |= TUN_F_CSUM;
        if has(VIRTIO_NET_F_GUEST_TSO4) {
            t |= TUN_F_TSO4;
        }
        if has(VIRTIO_NET_F_GUEST_TSO6) {
            t |= TUN_F_TSO6;
        }
    }
    t
}

/// What the device needs from its backend beyond frame I/O.
pub trait NetBackend: FrameIo {
    /// Fd to poll for incoming frames (edge-triggered).
    fn fd(&self) -> RawFd;
    /// TUN_F_* offloads supported.
    fn supported_offloads(&self) -> u32;
    /// Enable TUN_F_* offloads for received frames.
    fn set_offloads(&mut self, tun: u32) -> Result<(), String>;
}

impl NetBackend for Tap {
    fn fd(&self) -> RawFd {
        self.as_raw_fd()
    }
    fn supported_offloads(&self) -> u32 {
        Tap::supported_offloads(self)
    }
    fn set_offloads(&mut self, tun: u32) -> Result<(), String> {
        self.set_offload(tun).map_err(|e| e.to_string())
    }
}

/// Plain-data device state (for snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetDeviceState {
    pub avail_features: u64,
    pub acked_features: u64,
    pub mac: Option<MacAddr>,
    pub stats: NetStats,
    pub needs_reset: bool,
}

/// A virtio-net device.
pub struct NetDevice {
    backend: Box<dyn NetBackend>,
    mac: Option<MacAddr>,
    common: VirtioCommon,
    config: [u8; 12],
    rx: RxState,
    tx_buf: Vec<u8>,
    stats: NetStats,
}

impl NetDevice {
    /// Open the TAP named in `cfg` and build the device.
    pub fn from_config(cfg: &NetConfig, irq: IrqLine) -> Result<Self, VirtioError> {
        let tap = Tap::open(&cfg.tap)?;
        Self::new(Box::new(tap), cfg.mac, irq)
    }

    /// A device over any backend.
    pub fn new(
        backend: Box<dyn NetBackend>,
        mac: Option<MacAddr>,
        irq: IrqLine,
    ) -> Result<Self, VirtioError> {
        let mut config = [0u8; 12];
        if let Some(m) = mac {
            config[..6].copy_from_slice(&m.0);
        }
        let avail_features = features_for(backend.supported_offloads(), mac.is_some());
        Ok(Self {
            backend,
            mac,
            common: VirtioCommon::new(avail_features, &[QUEUE_SIZE, QUEUE_SIZE], irq)?,
            config,
            rx: RxState::default(),
            tx_buf: Vec::with_capacity(frames::MAX_FRAME_LEN),
            stats: NetStats::default(),
        })
    }

    pub fn state(&self) -> NetDeviceState {
        let c = self.common.state();
        NetDeviceState {
            avail_features: c.avail_features,
            acked_features: c.acked_features,
            mac: self.mac,
            stats: self.stats,
            needs_reset: c.needs_reset,
        }
    }

    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Backend fd (registered edge-triggered with the event loop).
    pub fn backend_fd(&self) -> RawFd {
        self.backend.fd()
    }

    fn finish(&mut self, used: u32, fatal: Option<String>, queue: usize) {
        if !self.common.is_activated() {
            return;
        }
        if used > 0 {
            self.common.interrupt_if_needed(queue);
        }
        if fatal.is_some() {
            self.common.mark_broken();
        }
    }

    /// Deliver frames from the backend to the guest (event-loop thread).
    pub fn process_rx(&mut self) {
        let Some(a) = self.common.running() else {
            return;
        };
        let (mem, rxq) = (&a.mem, &mut a.queues[RX_QUEUE]);
        let (backend, rx, stats) = (self.backend.as_mut(), &mut self.rx, &mut self.stats);
        let mut o = frames::process_rx(rxq, mem, backend, rx, stats);
        // Out of receive buffers with a frame waiting: ask the driver to notify when it adds
        // some (and go on at once if it already did). Otherwise the driver need not notify.
        while rx.pending.is_some() && o.fatal.is_none() {
            match notify::wait_for_driver(rxq, mem) {
                Ok(true) => o += frames::process_rx(rxq, mem, backend, rx, stats),
                Ok(false) => break,
                Err(e) => o.fatal = Some(format!("rx rings unusable: {e}")),
            }
        }
        if rx.pending.is_none() {
            if let Err(e) = rxq.disable_notification(mem) {
                o.fatal = Some(format!("rx rings unusable: {e}"));
            }
        }
        self.finish(o.used, o.fatal, RX_QUEUE);
    }

    /// Send the guest's frames to the backend (event-loop thread).
    pub fn process_tx(&mut self) {
        let Some(a) = self.common.running() else {
            return;
        };
        let (mem, txq) = (&a.mem, &mut a.queues[TX_QUEUE]);
        let (backend, buf, stats) = (self.backend.as_mut(), &mut self.tx_buf, &mut self.stats);
        let o = notify::drain(txq, mem, |q| {
            frames::process_tx(q, mem, backend, buf, stats)
        })
        .unwrap_or_else(|e| frames::PassOutcome {
            used: 0,
            fatal: Some(format!("tx rings unusable: {e}")),
        });
        self.finish(o.used, o.fatal, TX_QUEUE);
    }

    /// A frame is waiting for a receive buffer.
    pub fn rx_pending(&self) -> bool {
        self.rx.pending.is_some()
    }

    /// The frame waiting for a receive buffer.
    pub fn rx_pending_frame(&self) -> Option<&[u8]> {
        self.rx.pending_frame()
    }

    /// Restore: counters and a frame still waiting for a buffer.
    pub(super) fn restore_runtime(&mut self, stats: NetStats, rx_pending: Option<&[u8]>) {
        self.stats = stats;
        if let Some(f) = rx_pending {
            self.rx.set_pending(f);
        }
    }

    pub fn is_broken(&self) -> bool {
        self.common.is_broken()
    }
}

impl VirtioDevice for NetDevice {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }
    fn common(&self) -> &VirtioCommon {
        &self.common
    }
    fn common_mut(&mut self) -> &mut VirtioCommon {
        &mut self.common
    }
    /// Also tells the TAP which offloads to produce for the guest.
    fn set_acked_features(&mut self, features: u64) {
        self.common.set_acked_features(features);
        let tun = tun_offloads_for(self.common.acked_features());
        if let Err(e) = self.backend.set_offloads(tun) {
            crate::guest_log!(
                log::Level::Error,
                "virtio-net: cannot enable TAP offloads {tun:#x}: {e}"
            );
        }
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    // activate: VirtioCommon's (its queue kick also picks up frames that arrived before
    // activation and chains queued early).
    fn reset(&mut self) {
        if self.rx.pending.is_some() {
            self.stats.rx_dropped_reset += 1;
        }
        self.rx.clear();
        self.common.reset();
        if let Err(e) = self.backend.set_offloads(0) {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-net: cannot clear TAP offloads: {e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::net::tap::TUN_F_CSUM;
    use crate::devices::virtio::test_utils::{mem, TestQueue};

    /// A backend holding queued frames.
    struct Frames(std::collections::VecDeque<Vec<u8>>);

    impl FrameIo for Frames {
        fn read_frame(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let f = self.0.pop_front().ok_or(std::io::ErrorKind::WouldBlock)?;
            buf[..f.len()].copy_from_slice(&f);
            Ok(f.len())
        }
        fn write_frame(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
    }

    impl NetBackend for Frames {
        fn fd(&self) -> RawFd {
            -1
        }
        fn supported_offloads(&self) -> u32 {
            0
        }
        fn set_offloads(&mut self, _: u32) -> Result<(), String> {
            Ok(())
        }
    }

    /// Found by the `net_rxtx` fuzz target: a frame held back for lack of receive buffers was
    /// thrown away by a device reset without being counted anywhere.
    #[test]
    fn reset_counts_the_frame_it_drops() {
        let m = mem();
        let frames = Frames(vec![vec![0u8; 60]].into());
        let mut d = NetDevice::new(Box::new(frames), None, IrqLine::new(5).unwrap()).unwrap();
        let (rx, tx) = (
            TestQueue::new(&m, 0x1000, 16),
            TestQueue::new(&m, 0x4000, 16),
        );
        d.activate(m.clone(), vec![rx.queue(), tx.queue()]).unwrap();
        d.process_rx(); // no receive buffers: the frame waits
        assert!(d.rx_pending());
        assert_eq!(d.stats().rx_dropped(), 0);
        d.reset();
        assert!(!d.rx_pending());
        assert_eq!(d.stats().rx_dropped_reset, 1);
        assert_eq!(d.stats().rx_dropped(), 1);
    }

    #[test]
    fn offered_features_follow_tap_support_and_mac() {
        let bit = |b: u32| 1u64 << b;
        let none = features_for(0, false);
        assert_eq!(none & bit(VIRTIO_NET_F_MAC), 0);
        assert_eq!(none & bit(VIRTIO_NET_F_GUEST_CSUM), 0);
        assert_ne!(none & bit(VIRTIO_F_VERSION_1), 0);
        let all = features_for(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6, true);
        for b in [
            VIRTIO_NET_F_MAC,
            VIRTIO_NET_F_GUEST_CSUM,
            VIRTIO_NET_F_GUEST_TSO4,
            VIRTIO_NET_F_GUEST_TSO6,
        ] {
            assert_ne!(all & bit(b), 0, "bit {b}");
        }
        // TSO without checksum offload is never offered.
        assert_eq!(
            features_for(TUN_F_TSO4, false) & bit(VIRTIO_NET_F_GUEST_TSO4),
            0
        );
        // Acked guest offloads map onto TUN_F_*; TSO only with CSUM.
        assert_eq!(tun_offloads_for(all), TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6);
        assert_eq!(tun_offloads_for(bit(VIRTIO_NET_F_GUEST_TSO4)), 0);
        assert_eq!(tun_offloads_for(bit(VIRTIO_NET_F_GUEST_CSUM)), TUN_F_CSUM);
    }

    /// Needs root and /dev/net/tun.
    #[test]
    fn device_over_a_real_tap_negotiates_offloads() {
        let name = format!("mvd{}", std::process::id() % 100_000);
        let tap = Tap::open(&name).unwrap();
        let mac = Some(MacAddr([0x52, 0x54, 0, 1, 2, 3]));
        let mut d = NetDevice::new(Box::new(tap), mac, IrqLine::new(5).unwrap()).unwrap();
        let f = d.avail_features();
        assert_ne!(
            f & (1 << VIRTIO_NET_F_GUEST_TSO4),
            0,
            "Linux TAPs support TSO4"
        );
        d.set_acked_features(f);
        assert_eq!(d.state().acked_features, f);
        let mut m = [0u8; 6];
        d.read_config(0, &mut m);
        assert_eq!(m, [0x52, 0x54, 0, 1, 2, 3]);
        d.reset();
        assert_eq!(d.state().acked_features, 0);
    }
}
