//! The part every virtio device shares ([`VirtioCommon`]): the features it offers and the ones
//! the driver accepted, its queues' maximum sizes and notification eventfds, the interrupt
//! state it shares with the transport, and the broken (DEVICE_NEEDS_RESET) flag. A device
//! embeds one and hands it out through [`VirtioDevice::common`](super::VirtioDevice::common);
//! the trait's default methods answer the transport from it, so a new device writes only
//! what is its own (config space, activation of its queues, processing).
//!
//! The transport (`mmio.rs`) keeps the register state (device status, selectors, the queues
//! while the driver sets them up, config generation): one implementation for every device.

use std::sync::Arc;

use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::persist_error::PersistError;
use super::{ActivateError, VirtioError, VirtioInterrupt};
use crate::devices::interrupt::IrqLine;

/// State every virtio device holds, with the behaviour that goes with it.
#[derive(Debug)]
pub struct VirtioCommon {
    avail_features: u64,
    acked_features: u64,
    queue_max_sizes: Vec<u16>,
    queue_evts: Vec<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
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
            broken: false,
        })
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

    /// The driver set DRIVER_OK: checks that it handed over one queue per device queue and
    /// clears the broken flag. The device keeps the queues, then calls
    /// [`VirtioCommon::kick_queues`].
    pub fn activate<const N: usize>(
        &mut self,
        queues: Vec<Queue>,
    ) -> Result<[Queue; N], ActivateError> {
        let queues: [Queue; N] =
            queues
                .try_into()
                .map_err(|q: Vec<Queue>| ActivateError::QueueCount {
                    expected: N,
                    got: q.len(),
                })?;
        self.broken = false;
        Ok(queues)
    }

    /// Signals every queue's eventfd once, so the event loop looks at what the driver queued
    /// before activation (and a backend's input that arrived meanwhile).
    pub fn kick_queues(&self) -> Result<(), ActivateError> {
        for e in &self.queue_evts {
            e.write(1).map_err(ActivateError::EventFd)?;
        }
        Ok(())
    }

    /// The driver reset the device: features and the broken flag go back to power-on. (The
    /// interrupt state is the transport's to clear.)
    pub fn reset(&mut self) {
        self.broken = false;
        self.acked_features = 0;
    }

    /// Restore: the saved acked features must be offered by this device (`what` names it in
    /// the error).
    pub fn check_saved_features(&self, what: &str, acked: u64) -> Result<(), PersistError> {
        if acked & !self.avail_features != 0 {
            return Err(PersistError::Features {
                what: what.to_string(),
                acked,
                offered: self.avail_features,
            });
        }
        Ok(())
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
    fn activation_checks_the_queue_count_and_kicks_every_queue() {
        let mut c = common(&[8, 4]);
        assert_eq!(c.queue_events().len(), 2);
        let q = |s| Queue::new(s).unwrap();
        let e = c.activate::<2>(vec![q(8)]).expect_err("one queue accepted");
        assert_eq!(e.to_string(), "wrong number of queues: expected 2, got 1");
        c.set_broken(true);
        let [a, b] = c.activate::<2>(vec![q(8), q(4)]).unwrap();
        assert_eq!((a.max_size(), b.max_size()), (8, 4));
        assert!(!c.is_broken());
        c.kick_queues().unwrap();
        for e in c.queue_events() {
            assert_eq!(e.read().unwrap(), 1);
        }
    }

    #[test]
    fn saved_features_must_be_offered() {
        let c = common(&[8]);
        c.check_saved_features("dev", 1 << VIRTIO_F_VERSION_1)
            .unwrap();
        let e = c.check_saved_features("dev", 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "dev does not offer features 0x2 the guest acked (offers {:#x})",
                (1u64 << VIRTIO_F_VERSION_1) | 1
            )
        );
    }
}
