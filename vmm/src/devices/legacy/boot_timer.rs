//! Boot-timer device (Firecracker's method): when the guest writes
//! [`BOOT_TIMER_MAGIC`] to offset 0, the VMM logs the wall-clock and CPU time
//! elapsed since it started building the VM, and reports the event.
//!
//! A byte written at [`EXIT_STATUS_OFFSET`] is the exit status of the guest's workload (the
//! init of a VM booted from an OCI image writes its entrypoint's status there right before it
//! powers off, docs/oci-images.md); the last one written is kept.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use microvirt_crds::workload::EXIT_STATUS_OFFSET;

use crate::arch::x86_64::layout::BOOT_TIMER_MAGIC;
use crate::devices::bus::BusDevice;
use crate::timing::{cpu_time_us, Clock};

/// What the VMM learns when the guest says it booted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootTime {
    pub wall_us: u64,
    pub cpu_us: u64,
}

/// What the guest signalled through the page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestSignals {
    /// The first boot marker.
    pub boot: Option<BootTime>,
    /// The last workload exit status.
    pub exit_status: Option<u8>,
}

pub struct BootTimer {
    start: Clock,
    notify: Option<Sender<BootTime>>,
    first: Arc<Mutex<GuestSignals>>,
}

impl BootTimer {
    /// `start` is the time VM building began; `notify` receives the first boot event,
    /// which is also kept in `first`, with the workload's exit status.
    pub fn new(
        start: Clock,
        notify: Option<Sender<BootTime>>,
        first: Arc<Mutex<GuestSignals>>,
    ) -> Self {
        Self {
            start,
            notify,
            first,
        }
    }
}

impl BusDevice for BootTimer {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == EXIT_STATUS_OFFSET {
            if let Some(&status) = data.first() {
                crate::guest_log!(log::Level::Info, "guest workload exit status {status}");
                self.first.lock().expect("boot timer lock").exit_status = Some(status);
            }
            return;
        }
        if offset != 0 || data.first() != Some(&BOOT_TIMER_MAGIC) {
            return;
        }
        let t = BootTime {
            wall_us: self.start.wall.elapsed().as_micros() as u64,
            cpu_us: cpu_time_us().saturating_sub(self.start.cpu_us),
        };
        crate::guest_log!(
            log::Level::Info,
            "boot-time-ms={} cpu-ms={}",
            t.wall_us / 1000,
            t.cpu_us / 1000
        );
        let mut first = self.first.lock().expect("boot timer lock");
        if first.boot.is_none() {
            first.boot = Some(t);
            if let Some(tx) = &self.notify {
                let _ = tx.send(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_magic_byte_at_offset_zero_fires_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        let slot = Arc::new(Mutex::new(GuestSignals::default()));
        let mut t = BootTimer::new(Clock::now(), Some(tx), slot.clone());
        t.write(0, &[1]);
        t.write(4, &[BOOT_TIMER_MAGIC]);
        assert!(rx.try_recv().is_err());
        t.write(0, &[BOOT_TIMER_MAGIC]);
        let got = rx.try_recv().unwrap();
        assert!(got.wall_us < 10_000_000);
        assert_eq!(slot.lock().unwrap().boot, Some(got));
        t.write(0, &[BOOT_TIMER_MAGIC]);
        assert!(rx.try_recv().is_err(), "reported once");
        assert_eq!(slot.lock().unwrap().exit_status, None);
    }

    #[test]
    fn the_last_exit_status_written_is_kept() {
        let slot = Arc::new(Mutex::new(GuestSignals::default()));
        let mut t = BootTimer::new(Clock::now(), None, slot.clone());
        t.write(EXIT_STATUS_OFFSET, &[3]);
        t.write(EXIT_STATUS_OFFSET, &[0]);
        t.write(EXIT_STATUS_OFFSET + 1, &[9]);
        assert_eq!(slot.lock().unwrap().exit_status, Some(0));
        assert_eq!(slot.lock().unwrap().boot, None, "not a boot marker");
    }

    #[test]
    fn a_guest_writing_the_timer_in_a_loop_cannot_flood_the_log() {
        let mut t = BootTimer::new(
            Clock::now(),
            None,
            Arc::new(Mutex::new(GuestSignals::default())),
        );
        let lines = crate::logging::capture::lines_of(|| {
            for _ in 0..5000 {
                t.write(0, &[BOOT_TIMER_MAGIC]);
            }
        });
        // At most one burst (fewer when another test used this call site's budget meanwhile).
        assert!(
            !lines.is_empty() && lines.len() <= crate::logging::BURST as usize,
            "{lines:?}"
        );
        assert!(lines[0].starts_with("boot-time-ms="), "{lines:?}");
    }
}
