//! Claim latency: from the pool reconcile that claims a warm member to the moment the VMI
//! controller writes the claimed VMI's `Ready=True`. Kept in memory (the last
//! [`WINDOW`] claims per pool) and reported in the pool's `status.claimLatency`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use microvirt_crds::pool::ClaimLatency;

/// Claims the figures are computed from, per pool.
pub const WINDOW: usize = 100;
/// A claim whose VMI is not Ready after this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Claims in flight and recent latencies.
#[derive(Debug, Default)]
pub struct LatencyTracker {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `namespace/vmi` → (`namespace/pool`, claim start).
    started: HashMap<String, (String, Instant)>,
    /// `namespace/pool` → recent latencies in ms, newest last.
    done: HashMap<String, VecDeque<i64>>,
}

impl LatencyTracker {
    /// A claim of VMI `ns/vmi` for pool `ns/pool` starts now.
    pub fn claim_started(&self, ns: &str, pool: &str, vmi: &str, at: Instant) {
        let Ok(mut g) = self.inner.lock() else { return };
        g.started
            .retain(|_, (_, t)| at.duration_since(*t) < FORGET_AFTER);
        g.started
            .insert(format!("{ns}/{vmi}"), (format!("{ns}/{pool}"), at));
    }

    /// VMI `ns/vmi` turned Ready at `at`; records its latency if it was a claim of ours.
    pub fn ready(&self, ns: &str, vmi: &str, at: Instant) -> Option<Duration> {
        let mut g = self.inner.lock().ok()?;
        let (pool, start) = g.started.remove(&format!("{ns}/{vmi}"))?;
        let took = at.saturating_duration_since(start);
        let w = g.done.entry(pool).or_default();
        w.push_back(i64::try_from(took.as_millis()).unwrap_or(i64::MAX));
        while w.len() > WINDOW {
            w.pop_front();
        }
        Some(took)
    }

    /// When the oldest claim of pool `ns/pool` whose VMI is not Ready yet started.
    pub fn oldest_in_flight(&self, ns: &str, pool: &str) -> Option<Instant> {
        let g = self.inner.lock().ok()?;
        let key = format!("{ns}/{pool}");
        g.started
            .values()
            .filter(|(p, _)| *p == key)
            .map(|(_, t)| *t)
            .min()
    }

    /// The figures for pool `ns/pool` (None before its first claim).
    pub fn summary(&self, ns: &str, pool: &str) -> Option<ClaimLatency> {
        let g = self.inner.lock().ok()?;
        summarize(g.done.get(&format!("{ns}/{pool}"))?)
    }

    /// Forgets pool `ns/pool` (deleted).
    pub fn forget_pool(&self, ns: &str, pool: &str) {
        if let Ok(mut g) = self.inner.lock() {
            let key = format!("{ns}/{pool}");
            g.done.remove(&key);
            g.started.retain(|_, (p, _)| *p != key);
        }
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(w: &VecDeque<i64>) -> Option<ClaimLatency> {
    let last = *w.back()?;
    let mut v: Vec<i64> = w.iter().copied().collect();
    v.sort_unstable();
    Some(ClaimLatency {
        samples: i32::try_from(v.len()).unwrap_or(i32::MAX),
        last_ms: last,
        p50_ms: percentile(&v, 50.0),
        p95_ms: percentile(&v, 95.0),
        max_ms: *v.last().unwrap_or(&0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_are_tracked_per_pool() {
        let t = LatencyTracker::default();
        let t0 = Instant::now();
        assert!(t.summary("ns", "p").is_none());
        for i in 0..20u64 {
            let vmi = format!("p-{i}");
            t.claim_started("ns", "p", &vmi, t0);
            let took = t
                .ready("ns", &vmi, t0 + Duration::from_millis(10 + i))
                .unwrap();
            assert_eq!(took, Duration::from_millis(10 + i));
        }
        // A VMI that was not claimed (cold) is not counted.
        assert!(t.ready("ns", "cold", t0).is_none());
        // Ready twice counts once.
        assert!(t.ready("ns", "p-3", t0).is_none());
        let s = t.summary("ns", "p").unwrap();
        assert_eq!(s.samples, 20);
        assert_eq!(s.last_ms, 29);
        assert_eq!(s.p50_ms, 19);
        assert_eq!(s.p95_ms, 28);
        assert_eq!(s.max_ms, 29);
        assert!(t.summary("ns", "other").is_none());
        t.forget_pool("ns", "p");
        assert!(t.summary("ns", "p").is_none());
    }

    #[test]
    fn the_oldest_claim_in_flight_is_per_pool_and_ends_with_ready() {
        let t = LatencyTracker::default();
        let t0 = Instant::now();
        assert_eq!(t.oldest_in_flight("ns", "p"), None);
        t.claim_started("ns", "p", "a", t0 + Duration::from_millis(5));
        t.claim_started("ns", "p", "b", t0);
        t.claim_started("ns", "q", "c", t0);
        t.claim_started("other", "p", "d", t0);
        assert_eq!(t.oldest_in_flight("ns", "p"), Some(t0));
        t.ready("ns", "b", t0 + Duration::from_millis(7));
        assert_eq!(
            t.oldest_in_flight("ns", "p"),
            Some(t0 + Duration::from_millis(5))
        );
        t.ready("ns", "a", t0 + Duration::from_millis(9));
        assert_eq!(t.oldest_in_flight("ns", "p"), None);
        assert_eq!(t.oldest_in_flight("ns", "q"), Some(t0));
    }

    #[test]
    fn the_window_keeps_the_latest_claims() {
        let t = LatencyTracker::default();
        let t0 = Instant::now();
        for i in 0..(WINDOW as u64 + 50) {
            let vmi = format!("v{i}");
            t.claim_started("ns", "p", &vmi, t0);
            t.ready("ns", &vmi, t0 + Duration::from_millis(i));
        }
        let s = t.summary("ns", "p").unwrap();
        assert_eq!(s.samples as usize, WINDOW);
        assert_eq!(s.max_ms, WINDOW as i64 + 49);
        assert_eq!(percentile(&[5], 95.0), 5);
    }
}
