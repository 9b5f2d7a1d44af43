//! Event-loop glue for virtio-net: RX/TX queue ioeventfds and the TAP fd
//! (edge-triggered: RX reads until the TAP is empty or the guest runs out
//! of buffers; an RX queue notification resumes it).

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::device::{NetDevice, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::VirtioDevice;

const RX_EVENT: u32 = 0;
const TX_EVENT: u32 = 1;
const TAP_EVENT: u32 = 2;

impl MutEventSubscriber for NetDevice {
    fn init(&mut self, ops: &mut EventOps) {
        let evs = [
            Events::with_data(&self.queue_events()[RX_QUEUE], RX_EVENT, EventSet::IN),
            Events::with_data(&self.queue_events()[TX_QUEUE], TX_EVENT, EventSet::IN),
            Events::with_data_raw(
                self.backend_fd(),
                TAP_EVENT,
                EventSet::IN | EventSet::EDGE_TRIGGERED,
            ),
        ];
        for e in evs {
            if let Err(err) = ops.add(e) {
                log::error!("virtio-net: cannot register event {}: {err}", e.data());
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            RX_EVENT => {
                let _ = self.queue_events()[RX_QUEUE].read();
                self.process_rx();
            }
            TX_EVENT => {
                let _ = self.queue_events()[TX_QUEUE].read();
                self.process_tx();
            }
            TAP_EVENT => self.process_rx(),
            d => log::warn!("virtio-net: unexpected event data {d}"),
        }
    }
}
