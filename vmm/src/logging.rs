//! Rate limiting for log lines a guest can trigger.
//!
//! A guest that writes a bad register in a loop, hands the device broken descriptors or keeps
//! writing the boot timer must not be able to fill the host's logs (or spend the VMM's time
//! formatting them). Every such line goes through [`guest_log!`]: each call site may log
//! [`BURST`] lines per [`PERIOD`]; further lines in that period are counted, and the first line
//! of a later period says how many were suppressed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines one call site may log per [`PERIOD`].
pub const BURST: u32 = 10;
/// Length of a rate-limiting period.
pub const PERIOD: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct State {
    period_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

/// The budget of one call site.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

impl Limiter {
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(State {
                period_start: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number of lines suppressed since
    /// the last one that was logged, or `None` to drop this one.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`Limiter::admit`] at time `now`.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let expired = s
            .period_start
            .is_none_or(|start| now.saturating_duration_since(start) >= PERIOD);
        if expired {
            s.period_start = Some(now);
            s.logged = 0;
        }
        if s.logged < BURST {
            s.logged += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed += 1;
            None
        }
    }
}

/// `log::log!` for lines a guest can trigger, rate-limited per call site (see the module
/// documentation).
#[macro_export]
macro_rules! guest_log {
    ($lvl:expr, $($arg:tt)+) => {{
        static LIMITER: $crate::logging::Limiter = $crate::logging::Limiter::new();
        let lvl = $lvl;
        if log::log_enabled!(lvl) {
            match LIMITER.admit() {
                Some(0) => log::log!(lvl, $($arg)+),
                Some(n) => log::log!(
                    lvl,
                    "{} ({} more like this suppressed)",
                    format_args!($($arg)+),
                    n
                ),
                None => {}
            }
        }
    }};
}

#[cfg(test)]
pub(crate) mod capture {
    //! A logger for tests that keeps the lines each thread logged.

    use std::sync::{Mutex, OnceLock};

    struct Capture(Mutex<Vec<(std::thread::ThreadId, String)>>);

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, r: &log::Record) {
            self.0
                .lock()
                .unwrap()
                .push((std::thread::current().id(), r.args().to_string()));
        }
        fn flush(&self) {}
    }

    fn logger() -> &'static Capture {
        static L: OnceLock<&'static Capture> = OnceLock::new();
        L.get_or_init(|| {
            let l: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
            log::set_logger(l).expect("no other logger in the unit tests");
            log::set_max_level(log::LevelFilter::Trace);
            l
        })
    }

    /// Runs `f` and returns the lines it logged on this thread.
    pub fn lines_of(f: impl FnOnce()) -> Vec<String> {
        let l = logger();
        let me = std::thread::current().id();
        l.0.lock().unwrap().retain(|(t, _)| *t != me);
        f();
        l.0.lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t == me)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_period_then_the_suppressed_count() {
        let l = Limiter::new();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(l.admit_at(t0), Some(0));
        }
        for i in 0..25 {
            assert_eq!(l.admit_at(t0 + Duration::from_millis(i)), None);
        }
        // Next period: the first line carries the count, then a fresh burst.
        let t1 = t0 + PERIOD;
        assert_eq!(l.admit_at(t1), Some(25));
        for _ in 1..BURST {
            assert_eq!(l.admit_at(t1), Some(0));
        }
        assert_eq!(l.admit_at(t1), None);
    }

    #[test]
    fn the_macro_limits_each_call_site() {
        let lines = capture::lines_of(|| {
            for i in 0..1000 {
                crate::guest_log!(log::Level::Warn, "guest did thing {i}");
            }
            crate::guest_log!(log::Level::Warn, "another call site");
        });
        assert_eq!(lines.len(), BURST as usize + 1, "{lines:?}");
        assert_eq!(lines[0], "guest did thing 0");
        assert_eq!(lines[BURST as usize], "another call site");
    }
}
