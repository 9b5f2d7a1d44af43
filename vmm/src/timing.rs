//! Clocks for boot-time measurement.

use std::time::Instant;

/// A start point: wall-clock instant and process CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub wall: Instant,
    pub cpu_us: u64,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            wall: Instant::now(),
            cpu_us: cpu_time_us(),
        }
    }
}

/// CPU time (user + system) consumed by this process, in microseconds.
pub fn cpu_time_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// CLOCK_MONOTONIC in nanoseconds (system-wide, comparable across processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
