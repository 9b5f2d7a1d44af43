//! The virtio-rng device: one request queue, no configuration space, no feature bits besides
//! VERSION_1. Requests are filled on the event-loop thread (`getrandom` never blocks once the
//! host booted); the rate limit's timer resumes a throttled queue.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;
use vmm_sys_util::timerfd::TimerFd;

use super::queue::{self, TokenBucket};
use super::{BURST_BYTES, BYTES_PER_SEC};
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::common::VirtioCommon;
use crate::devices::virtio::{VirtioDevice, VirtioError, TYPE_RNG, VIRTIO_F_VERSION_1};

/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;
/// A throttled queue is resumed once this many bytes can be handed out.
const RESUME_BYTES: u64 = 4096;

/// Where the device's random bytes come from.
pub type EntropySource = Box<dyn FnMut(&mut [u8]) -> std::io::Result<()> + Send>;

/// Plain-data device state (for snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngDeviceState {
    pub acked_features: u64,
    pub needs_reset: bool,
}

/// A virtio-rng device.
pub struct RngDevice {
    common: VirtioCommon,
    bucket: TokenBucket,
    timer: TimerFd,
    timer_armed: bool,
    /// Random bytes handed to the guest.
    bytes: u64,
    source: EntropySource,
}

impl RngDevice {
    /// A device drawing from the host's `getrandom`.
    pub fn new(irq: IrqLine) -> Result<Self, VirtioError> {
        Self::with_source(irq, Box::new(queue::getrandom))
    }

    /// A device drawing from `source` (tests).
    pub fn with_source(irq: IrqLine, source: EntropySource) -> Result<Self, VirtioError> {
        Ok(Self {
            common: VirtioCommon::new(1 << VIRTIO_F_VERSION_1, &[QUEUE_SIZE], irq)?,
            bucket: TokenBucket::new(BURST_BYTES, BYTES_PER_SEC, Instant::now()),
            timer: TimerFd::new().map_err(|e| VirtioError::EventFd(e.into()))?,
            timer_armed: false,
            bytes: 0,
            source,
        })
    }

    /// Plain-data state.
    pub fn state(&self) -> RngDeviceState {
        let c = self.common.state();
        RngDeviceState {
            acked_features: c.acked_features,
            needs_reset: c.needs_reset,
        }
    }

    /// Random bytes handed to the guest so far.
    pub fn bytes_served(&self) -> u64 {
        self.bytes
    }

    /// The timer that fires when a throttled queue may go on.
    pub fn timer(&self) -> &TimerFd {
        &self.timer
    }

    /// The timer fired.
    pub fn timer_fired(&mut self) {
        let _ = self.timer.wait();
        self.timer_armed = false;
        self.process_queue();
    }

    /// Fills what the guest queued (event-loop thread), as far as the rate limit allows.
    pub fn process_queue(&mut self) {
        if self.timer_armed {
            return;
        }
        let Some(a) = self.common.running() else {
            return;
        };
        let (mem, q) = (&a.mem, &mut a.queues[0]);
        let now = Instant::now();
        let out = queue::process_queue(q, mem, &mut self.bucket, now, &mut self.source);
        self.bytes += out.bytes;
        if out.used > 0 && q.needs_notification(mem).unwrap_or(true) {
            self.common.interrupt().signal_used_queue();
        }
        if out.fatal.is_some() {
            self.common.mark_broken();
            return;
        }
        if out.throttled {
            let wait = self
                .bucket
                .wait_for(RESUME_BYTES, now)
                .max(Duration::from_millis(1));
            match self.timer.reset(wait, None) {
                Ok(()) => self.timer_armed = true,
                Err(e) => log::error!("virtio-rng: cannot arm the rate-limit timer: {e}"),
            }
        }
    }
}

impl VirtioDevice for RngDevice {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }
    fn common(&self) -> &VirtioCommon {
        &self.common
    }
    fn common_mut(&mut self) -> &mut VirtioCommon {
        &mut self.common
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, TestQueue};
    use crate::devices::virtio::{INT_VRING, TYPE_RNG};
    use std::os::fd::AsRawFd;
    use vm_memory::Bytes;

    #[test]
    fn identity_features_and_empty_config() {
        let d = RngDevice::new(IrqLine::new(5).unwrap()).unwrap();
        assert_eq!(d.device_type(), TYPE_RNG);
        assert_eq!(d.avail_features(), 1 << VIRTIO_F_VERSION_1);
        let mut c = [0xffu8; 8];
        d.read_config(0, &mut c);
        assert_eq!(c, [0; 8]);
        assert_eq!(d.queue_max_sizes(), &[QUEUE_SIZE]);
    }

    #[test]
    fn a_throttled_queue_is_resumed_by_the_timer() {
        let m = mem();
        let mut d = RngDevice::with_source(
            IrqLine::new(5).unwrap(),
            Box::new(|b: &mut [u8]| {
                b.fill(0x5a);
                Ok(())
            }),
        )
        .unwrap();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        d.set_acked_features(1 << VIRTIO_F_VERSION_1);
        d.activate(m.clone(), vec![tq.queue()]).unwrap();
        // Three chains of 32 KiB: the burst (64 KiB) covers two.
        for i in 0..3u64 {
            tq.add_chain(&[(0x100000 + i * 0x10000, 32 << 10, true)]);
        }
        d.process_queue();
        assert_eq!(tq.used_idx(), 2);
        assert_eq!(d.bytes_served(), BURST_BYTES);
        assert_ne!(d.interrupt().status() & INT_VRING, 0);
        assert!(d.timer().is_armed().unwrap());
        // A notification meanwhile does not bypass the limit.
        d.process_queue();
        assert_eq!(tq.used_idx(), 2);
        let mut p = libc::pollfd {
            fd: d.timer().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(
            unsafe { libc::poll(&mut p, 1, 10_000) },
            1,
            "timer never fired"
        );
        d.timer_fired();
        assert_eq!(tq.used_idx(), 3);
        let third = tq.used(2).1 as u64;
        assert!((RESUME_BYTES..=32 << 10).contains(&third), "{third}");
        let mut back = vec![0u8; third as usize];
        m.read_slice(&mut back, vm_memory::GuestAddress(0x120000))
            .unwrap();
        assert!(back.iter().all(|&b| b == 0x5a));
    }
}
