//! Event-loop glue for virtio-rng: the queue ioeventfd and the rate limit's timer drive
//! [`RngDevice::process_queue`] on the VMM thread.

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use std::os::fd::AsRawFd;

use super::device::RngDevice;
use crate::devices::virtio::VirtioDevice;

const QUEUE_EVENT: u32 = 0;
const TIMER_EVENT: u32 = 1;

impl MutEventSubscriber for RngDevice {
    fn init(&mut self, ops: &mut EventOps) {
        let evs = [
            Events::with_data(&self.queue_events()[0], QUEUE_EVENT, EventSet::IN),
            Events::with_data_raw(self.timer().as_raw_fd(), TIMER_EVENT, EventSet::IN),
        ];
        for e in evs {
            if let Err(err) = ops.add(e) {
                log::error!("virtio-rng: cannot register event {}: {err}", e.data());
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            QUEUE_EVENT => {
                let _ = self.queue_events()[0].read();
                self.process_queue();
            }
            TIMER_EVENT => self.timer_fired(),
            d => log::warn!("virtio-rng: unexpected event data {d}"),
        }
    }
}
