//! POST-code port 0x80: guests write phase markers there (the test guest writes
//! one as its first instruction). The first write's time since VMM start is
//! recorded for the start-to-guest benchmark; each write is logged at debug.

use std::sync::{Arc, Mutex};

use crate::devices::bus::BusDevice;
use crate::timing::Clock;

pub struct DebugPort {
    start: Clock,
    first_write_us: Arc<Mutex<Option<u64>>>,
}

impl DebugPort {
    pub fn new(start: Clock, first_write_us: Arc<Mutex<Option<u64>>>) -> Self {
        Self {
            start,
            first_write_us,
        }
    }
}

impl BusDevice for DebugPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        let us = self.start.wall.elapsed().as_micros() as u64;
        let mut first = self.first_write_us.lock().expect("debug port lock");
        if first.is_none() {
            *first = Some(us);
        }
        log::debug!(
            "guest debug port: {:#x} at {} us",
            data.first().copied().unwrap_or(0),
            us
        );
    }
}
