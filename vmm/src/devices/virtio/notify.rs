//! Notification and interrupt suppression (virtio 1.2, 2.7.7 and 2.7.10): pure queue logic over
//! `virtio_queue::Queue`, no device and no event loop, unit-tested on hand-built rings.
//!
//! Every guest→device notification (a QueueNotify write) and every device→guest interrupt (an
//! irqfd, then InterruptStatus/InterruptACK accesses that each exit to the VMM) costs VM exits.
//! Both directions can be suppressed:
//! - **with `VIRTIO_RING_F_EVENT_IDX`** (offered by blk and net, set on the queues by the
//!   transport when the driver accepts it): the device publishes `avail_event` (the available index
//!   it wants to be told about) only when it goes idle, so a driver adding chains while the device
//!   is busy does not notify; the driver publishes `used_event` and the device interrupts only
//!   when its used index crosses it ([`needs_interrupt`]);
//! - **without it**: the device sets `VRING_USED_F_NO_NOTIFY` while it works and honours the
//!   driver's `VRING_AVAIL_F_NO_INTERRUPT`.
//!
//! The state this adds to a queue is `Queue::event_idx_enabled` (part of `QueueState`, plain and
//! serialisable like the rest of the queue) — nothing is kept here.

use std::ops::AddAssign;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Feature bit: the driver and the device publish `used_event` / `avail_event`.
pub const VIRTIO_RING_F_EVENT_IDX: u32 = 29;
/// Available-ring flag: the driver does not want interrupts now (only without EVENT_IDX).
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Result of one processing pass over a queue, summed over passes by [`drain`].
pub trait PassResult: Default + AddAssign {
    /// Stop draining (the device is broken, or the backend cannot take more).
    fn stop(&self) -> bool;
}

/// Runs `pass` (which processes every chain it can) until no chain is left, with driver
/// notifications suppressed while it works. Before returning, notifications are re-enabled
/// (with EVENT_IDX: `avail_event` = the next chain the device will look at) and the ring is
/// checked once more, so a chain the driver made available in between — without notifying,
/// because notifications were off — is processed, not left waiting.
pub fn drain<M, R, F>(q: &mut Queue, mem: &M, mut pass: F) -> Result<R, virtio_queue::Error>
where
    M: GuestMemory,
    R: PassResult,
    F: FnMut(&mut Queue) -> R,
{
    let mut total = R::default();
    loop {
        q.disable_notification(mem)?;
        let r = pass(q);
        let stop = r.stop();
        total += r;
        if stop {
            // Leave notifications on: whoever resumes the queue relies on them.
            q.enable_notification(mem)?;
            return Ok(total);
        }
        if !q.enable_notification(mem)? {
            return Ok(total);
        }
    }
}

/// Re-enables driver notifications for a queue the device is waiting on (e.g. RX without
/// buffers). Returns true when chains are already available (the device should not wait).
pub fn wait_for_driver<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
) -> Result<bool, virtio_queue::Error> {
    q.enable_notification(mem)
}

/// Should the device interrupt the driver after adding used chains since the last call?
/// With EVENT_IDX: when the used index crossed the driver's `used_event`; without: unless the
/// driver set `VRING_AVAIL_F_NO_INTERRUPT`. Unreadable rings answer true (interrupting is
/// always safe).
pub fn needs_interrupt<M: GuestMemory>(q: &mut Queue, mem: &M) -> bool {
    if q.event_idx_enabled() {
        return q.needs_notification(mem).unwrap_or(true);
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    match mem.read_obj::<u16>(GuestAddress(q.avail_ring())) {
        Ok(flags) => u16::from_le(flags) & VRING_AVAIL_F_NO_INTERRUPT == 0,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, TestQueue};
    use crate::vstate::memory::GuestMemoryMmap;
    use virtio_queue::QueueOwnedT;

    const VRING_USED_F_NO_NOTIFY: u16 = 1;

    #[derive(Default, Debug)]
    struct Count {
        used: u32,
        broken: bool,
    }
    impl AddAssign for Count {
        fn add_assign(&mut self, o: Self) {
            self.used += o.used;
            self.broken |= o.broken;
        }
    }
    impl PassResult for Count {
        fn stop(&self) -> bool {
            self.broken
        }
    }

    /// Completes every available chain with length 0.
    fn complete_all(q: &mut Queue, m: &GuestMemoryMmap) -> Count {
        let mut c = Count::default();
        loop {
            let head = match q.iter(m).unwrap().next() {
                Some(chain) => chain.head_index(),
                None => return c,
            };
            q.add_used(m, head, 0).unwrap();
            c.used += 1;
        }
    }

    fn used_flags(tq: &TestQueue) -> u16 {
        tq.mem.read_obj(GuestAddress(tq.used)).unwrap()
    }
    fn avail_event(tq: &TestQueue) -> u16 {
        tq.mem
            .read_obj(GuestAddress(tq.used + 4 + 8 * u64::from(tq.size)))
            .unwrap()
    }
    fn set_used_event(tq: &TestQueue, v: u16) {
        tq.mem
            .write_obj(v, GuestAddress(tq.avail + 4 + 2 * u64::from(tq.size)))
            .unwrap();
    }
    fn set_avail_flags(tq: &TestQueue, v: u16) {
        tq.mem.write_obj(v, GuestAddress(tq.avail)).unwrap();
    }

    #[test]
    fn event_idx_publishes_avail_event_after_draining() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        q.set_event_idx(true);
        for _ in 0..3 {
            tq.add_chain(&[(0x8000, 16, false)]);
        }
        let c = drain(&mut q, &m, |q| complete_all(q, &m)).unwrap();
        assert_eq!(c.used, 3);
        assert_eq!(tq.used_idx(), 3);
        // The driver is asked to notify when it makes chain #3 available, i.e. the next one.
        assert_eq!(avail_event(&tq), 3);
        // No used-ring flag is used with EVENT_IDX.
        assert_eq!(used_flags(&tq), 0);
    }

    #[test]
    fn chain_added_while_notifications_were_off_is_not_missed() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        tq.add_chain(&[(0x8000, 16, false)]);
        let mut passes = 0;
        let c = drain(&mut q, &m, |q| {
            passes += 1;
            let c = complete_all(q, &m);
            if passes == 1 {
                // The driver adds a chain after the device looked, before it re-enabled
                // notifications, and sees NO_NOTIFY set: it does not notify.
                assert_eq!(used_flags(&tq) & VRING_USED_F_NO_NOTIFY, 1);
                tq.add_chain(&[(0x9000, 16, false)]);
            }
            c
        })
        .unwrap();
        assert_eq!(passes, 2);
        assert_eq!(c.used, 2);
        // Notifications are back on when the device goes idle.
        assert_eq!(used_flags(&tq) & VRING_USED_F_NO_NOTIFY, 0);
    }

    #[test]
    fn a_stopping_pass_ends_the_drain_with_notifications_on() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        q.set_event_idx(true);
        tq.add_chain(&[(0x8000, 16, false)]);
        tq.add_chain(&[(0x8000, 16, false)]);
        let mut passes = 0;
        let c = drain(&mut q, &m, |_| {
            passes += 1;
            Count {
                used: 0,
                broken: true,
            }
        })
        .unwrap();
        assert!(c.broken);
        assert_eq!(
            passes, 1,
            "chains are still available, but the pass said stop"
        );
        assert_eq!(avail_event(&tq), 0);
    }

    #[test]
    fn event_idx_interrupts_only_when_crossing_used_event() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        q.set_event_idx(true);
        for _ in 0..6 {
            tq.add_chain(&[(0x8000, 16, false)]);
        }
        // The driver wants to hear about used entry #2 (after it saw 0 and 1).
        set_used_event(&tq, 2);
        let head = |q: &mut Queue| q.iter(&m).unwrap().next().unwrap().head_index();
        let complete = |q: &mut Queue| {
            let h = head(q);
            q.add_used(&m, h, 0).unwrap();
        };
        complete(&mut q); // used idx 1
        assert!(!needs_interrupt(&mut q, &m));
        complete(&mut q); // used idx 2
        assert!(!needs_interrupt(&mut q, &m));
        complete(&mut q); // used idx 3: entry #2 is now used
        assert!(needs_interrupt(&mut q, &m));
        // Several completions at once that jump over used_event also interrupt, once.
        set_used_event(&tq, 4);
        complete(&mut q);
        complete(&mut q);
        assert!(needs_interrupt(&mut q, &m));
        assert!(!needs_interrupt(&mut q, &m), "nothing new since");
    }

    #[test]
    fn without_event_idx_no_interrupt_flag_is_honoured() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        tq.add_chain(&[(0x8000, 16, false)]);
        let h = q.iter(&m).unwrap().next().unwrap().head_index();
        q.add_used(&m, h, 0).unwrap();
        assert!(needs_interrupt(&mut q, &m));
        set_avail_flags(&tq, VRING_AVAIL_F_NO_INTERRUPT);
        assert!(!needs_interrupt(&mut q, &m));
        set_avail_flags(&tq, 0);
        assert!(needs_interrupt(&mut q, &m));
    }

    #[test]
    fn waiting_for_the_driver_reports_chains_already_there() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 8);
        let mut q = tq.queue();
        q.set_event_idx(true);
        assert!(!wait_for_driver(&mut q, &m).unwrap());
        assert_eq!(avail_event(&tq), 0);
        tq.add_chain(&[(0x8000, 16, false)]);
        assert!(wait_for_driver(&mut q, &m).unwrap());
    }

    #[test]
    fn unreadable_avail_ring_interrupts() {
        let m = mem();
        let mut q = Queue::new(8).unwrap();
        q.set_avail_ring_address(Some(0xffff_0000), Some(0x7f));
        assert!(needs_interrupt(&mut q, &m));
    }
}
