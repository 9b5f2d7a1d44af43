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

/// Named points in time since a start, for a one-line breakdown of where the VMM's own start-up
/// time goes (`--log-level debug`).
#[derive(Clone, Debug)]
pub struct Phases {
    start: Instant,
    last: Instant,
    marks: Vec<(&'static str, u64)>,
}

impl Phases {
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            last: start,
            marks: Vec::with_capacity(16),
        }
    }

    /// Records that the step `name` ended now (its duration is the time since the previous mark).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks
            .push((name, now.duration_since(self.last).as_micros() as u64));
        self.last = now;
    }

    /// Microseconds from the start to the last mark.
    pub fn total_us(&self) -> u64 {
        self.last.duration_since(self.start).as_micros() as u64
    }

    /// The recorded steps and their durations in microseconds.
    pub fn steps(&self) -> &[(&'static str, u64)] {
        &self.marks
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (n, us)) in self.marks.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{n}={us}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up() {
        let mut p = Phases::new(Instant::now());
        p.mark("a");
        std::thread::sleep(std::time::Duration::from_millis(2));
        p.mark("b");
        assert_eq!(p.steps().len(), 2);
        assert!(p.steps()[1].1 >= 2000);
        let sum: u64 = p.steps().iter().map(|s| s.1).sum();
        assert!(sum <= p.total_us() && p.total_us() - sum <= 2);
        assert!(p.to_string().starts_with("a="));
        assert!(p.to_string().contains(" b="));
    }
}
