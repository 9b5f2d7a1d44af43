//! Event-loop glue for virtio-blk, on the VMM thread: the queue ioeventfd drives
//! [`BlockDevice::process_queue`] (requests go to the device's I/O thread), the I/O thread's
//! completion eventfd drives [`BlockDevice::process_completions`].

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::device::BlockDevice;
use crate::devices::virtio::VirtioDevice;

const QUEUE_EVENT: u32 = 0;
const COMPLETION_EVENT: u32 = 1;

impl MutEventSubscriber for BlockDevice {
    fn init(&mut self, ops: &mut EventOps) {
        for (evt, data, what) in [
            (&self.queue_events()[0], QUEUE_EVENT, "queue"),
            (self.completion_event(), COMPLETION_EVENT, "completion"),
        ] {
            if let Err(e) = ops.add(Events::with_data(evt, data, EventSet::IN)) {
                log::error!("virtio-blk: cannot register the {what} event: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            QUEUE_EVENT => {
                // A failed read means a spurious wakeup; process anyway.
                let _ = self.queue_events()[0].read();
                self.process_queue();
            }
            COMPLETION_EVENT => {
                let _ = self.completion_event().read();
                self.process_completions();
            }
            d => log::warn!("virtio-blk: unexpected event data {d}"),
        }
    }
}
