//! Event-loop glue for virtio-blk: the queue ioeventfd drives
//! [`BlockDevice::process_queue`] on the VMM thread.

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::device::BlockDevice;
use crate::devices::virtio::VirtioDevice;

const QUEUE_EVENT: u32 = 0;

impl MutEventSubscriber for BlockDevice {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::with_data(
            &self.queue_events()[0],
            QUEUE_EVENT,
            EventSet::IN,
        )) {
            log::error!("virtio-blk: cannot register the queue event: {e}");
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            QUEUE_EVENT => {
                // A failed read means a spurious wakeup; process anyway.
                let _ = self.queue_events()[0].read();
                self.process_queue();
            }
            d => log::warn!("virtio-blk: unexpected event data {d}"),
        }
    }
}
