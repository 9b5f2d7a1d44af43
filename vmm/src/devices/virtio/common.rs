//! The part every virtio device shares ([`VirtioCommon`]): the features it offers and the ones
//! the driver accepted, its queues' maximum sizes and notification eventfds, the interrupt
//! state it shares with the transport, the queues while the driver has the device running
//! (activation state), and the broken (DEVICE_NEEDS_RESET) flag. A device embeds one and hands
//! it out through [`VirtioDevice::common`](super::VirtioDevice::common); the trait's default
//! methods answer the transport from it (features, queues, activation, reset, live queues), so
//! a new device writes only what is its own: config space, what its reset adds, and queue
//! processing. The common part of its snapshot is `persist.rs`'s [`CommonState`].
//!
//! The transport (`mmio/`) keeps the register state (device status, selectors, the queues
//! while the driver sets them up, config generation): one implementation for every device.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::mmio::QueueSnapshot;
use super::notify;
use super::persist::CommonState;
use super::{ActivateError, VirtioError, INT_CONFIG, INT_VRING};
use crate::devices::interrupt::IrqLine;
use crate::vstate::memory::GuestMemoryMmap;

/// Interrupt state shared by the transport (vCPU threads) and the device
/// (event-loop thread).
#[derive(Debug)]
pub struct VirtioInterrupt {
    status: AtomicU32,
    needs_reset: AtomicBool,
    irq: IrqLine,
}

impl VirtioInterrupt {
    pub fn new(irq: IrqLine) -> Self {
        Self {
            status: AtomicU32::new(0),
            needs_reset: AtomicBool::new(false),
            irq,
        }
    }

    /// Report used-ring updates to the guest.
    pub fn signal_used_queue(&self) {
        self.raise(INT_VRING);
    }

    /// Report a configuration change (also used to announce NEEDS_RESET).
    pub fn signal_config(&self) {
        self.raise(INT_CONFIG);
    }

    /// Sets `bit` in InterruptStatus and triggers the IRQ line.
    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        if let Err(e) = self.irq.trigger() {
            crate::guest_log!(
                log::Level::Error,
                "virtio: cannot trigger irq {}: {e}",
                self.irq.gsi()
            );
        }
    }

    /// Mark the device broken by the driver (virtio 1.2, 2.1.2): the driver
    /// sees DEVICE_NEEDS_RESET in the status register and must reset it.
    pub fn set_needs_reset(&self) {
        if !self.needs_reset.swap(true, Ordering::SeqCst) {
            self.signal_config();
        }
    }

    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::SeqCst)
    }

    /// Current InterruptStatus register value.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Restores InterruptStatus and NEEDS_RESET without raising the interrupt (the interrupt
    /// controllers' own saved state says whether one is pending).
    pub fn restore(&self, status: u32, needs_reset: bool) {
        self.status.store(status, Ordering::SeqCst);
        self.needs_reset.store(needs_reset, Ordering::SeqCst);
    }

    /// InterruptACK register write.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Clear everything on device reset.
    pub fn reset(&self) {
        self.status.store(0, Ordering::SeqCst);
        self.needs_reset.store(false, Ordering::SeqCst);
    }

    pub fn irq(&self) -> &IrqLine {
        &self.irq
    }
}

/// A device's queues between activation and reset, and the guest memory they live in.
#[derive(Debug)]
pub struct ActiveQueues {
    pub mem: GuestMemoryMmap,
    /// One per device queue, in the device's order; their ring positions are the live ones.
    pub queues: Vec<Queue>,
}

/// State every virtio device holds, with the behaviour that goes with it.
#[derive(Debug)]
pub struct VirtioCommon {
    avail_features: u64,
    acked_features: u64,
    queue_max_sizes: Vec<u16>,
    queue_evts: Vec<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    active: Option<ActiveQueues>,
    broken: bool,
}

impl VirtioCommon {
    /// A device offering `avail_features`, with one queue (and one non-blocking notification
    /// eventfd) per entry of `queue_max_sizes`, interrupting through `irq`.
    pub fn new(
        avail_features: u64,
        queue_max_sizes: &[u16],
        irq: IrqLine,
    ) -> Result<Self, VirtioError> {
        let queue_evts = queue_max_sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioError::EventFd))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            avail_features,
            acked_features: 0,
            queue_max_sizes: queue_max_sizes.to_vec(),
            queue_evts,
            interrupt: Arc::new(VirtioInterrupt::new(irq)),
            active: None,
            broken: false,
        })
    }

    /// The part of a snapshot every device saves.
    pub fn state(&self) -> CommonState {
        CommonState {
            avail_features: self.avail_features,
            acked_features: self.acked_features,
            needs_reset: self.broken,
        }
    }

    /// Features the device offers.
    pub fn avail_features(&self) -> u64 {
        self.avail_features
    }

    /// Features the driver accepted (always a subset of the offered ones).
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Records the driver's features, keeping only offered bits.
    pub fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }

    /// Maximum size of each queue.
    pub fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_max_sizes
    }

    /// One notification eventfd per queue.
    pub fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    /// The interrupt state shared with the transport.
    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    /// Whether a fatal guest error stopped the device (until the driver resets it).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Sets the broken flag without telling the driver (restore: the saved interrupt state
    /// already says so).
    pub fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }

    /// A fatal guest error: stop the device and show the driver DEVICE_NEEDS_RESET.
    pub fn mark_broken(&mut self) {
        self.broken = true;
        self.interrupt.set_needs_reset();
    }

    /// The driver set DRIVER_OK: keeps `queues` (one per device queue, else refused), clears
    /// the broken flag and kicks every queue ([`VirtioCommon::kick_queues`]).
    pub fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != self.queue_max_sizes.len() {
            return Err(ActivateError::QueueCount {
                expected: self.queue_max_sizes.len(),
                got: queues.len(),
            });
        }
        self.active = Some(ActiveQueues { mem, queues });
        self.broken = false;
        self.kick_queues()
    }

    /// True between [`VirtioCommon::activate`] and [`VirtioCommon::reset`].
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The queues while active.
    pub fn active(&self) -> Option<&ActiveQueues> {
        self.active.as_ref()
    }

    /// The queues while active.
    pub fn active_mut(&mut self) -> Option<&mut ActiveQueues> {
        self.active.as_mut()
    }

    /// The queues to process: active and not broken.
    pub fn running(&mut self) -> Option<&mut ActiveQueues> {
        if self.broken {
            return None;
        }
        self.active.as_mut()
    }

    /// While active: the live queues' state (snapshots).
    pub fn live_queues(&self) -> Option<Vec<QueueSnapshot>> {
        self.active
            .as_ref()
            .map(|a| a.queues.iter().map(QueueSnapshot::from).collect())
    }

    /// New used-ring entries on queue `index`: interrupts the guest unless the driver
    /// suppressed it ([`notify::needs_interrupt`]). Nothing while inactive.
    pub fn interrupt_if_needed(&mut self, index: usize) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if let Some(q) = a.queues.get_mut(index) {
            if notify::needs_interrupt(q, &a.mem) {
                self.interrupt.signal_used_queue();
            }
        }
    }

    /// Signals every queue's eventfd once, so the event loop looks at what the driver queued
    /// before activation (and a backend's input that arrived meanwhile).
    pub fn kick_queues(&self) -> Result<(), ActivateError> {
        for e in &self.queue_evts {
            e.write(1).map_err(ActivateError::EventFd)?;
        }
        Ok(())
    }

    /// The driver reset the device: its queues are dropped, features and the broken flag go
    /// back to power-on. (The interrupt state is the transport's to clear.)
    pub fn reset(&mut self) {
        self.active = None;
        self.broken = false;
        self.acked_features = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::VIRTIO_F_VERSION_1;
    use virtio_queue::QueueT;

    fn common(sizes: &[u16]) -> VirtioCommon {
        VirtioCommon::new(
            (1 << VIRTIO_F_VERSION_1) | 1,
            sizes,
            IrqLine::new(5).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn acked_features_keep_only_offered_bits_and_reset_clears_them() {
        let mut c = common(&[8]);
        c.set_acked_features(u64::MAX);
        assert_eq!(c.acked_features(), (1 << VIRTIO_F_VERSION_1) | 1);
        c.mark_broken();
        assert!(c.is_broken());
        assert!(c.interrupt().needs_reset());
        c.reset();
        assert_eq!(c.acked_features(), 0);
        assert!(!c.is_broken());
    }

    #[test]
    fn activation_checks_the_queue_count_keeps_the_queues_and_kicks_every_queue() {
        let m = crate::devices::virtio::test_utils::mem();
        let mut c = common(&[8, 4]);
        assert_eq!(c.queue_events().len(), 2);
        let q = |s| Queue::new(s).unwrap();
        let e = c
            .activate(m.clone(), vec![q(8)])
            .expect_err("one queue accepted");
        assert_eq!(e.to_string(), "wrong number of queues: expected 2, got 1");
        assert!(!c.is_activated());
        c.set_broken(true);
        c.activate(m.clone(), vec![q(8), q(4)]).unwrap();
        assert!(c.is_activated());
        assert!(!c.is_broken());
        let live = c.live_queues().unwrap();
        assert_eq!((live[0].max_size, live[1].max_size), (8, 4));
        for e in c.queue_events() {
            assert_eq!(e.read().unwrap(), 1);
        }
        assert!(c.running().is_some());
        c.set_broken(true);
        assert!(c.running().is_none());
        c.reset();
        assert!(!c.is_activated());
        assert!(c.live_queues().is_none());
    }
}
