//! Expectations: the creations and deletions a controller has done but its VMI cache may not
//! show yet (client-go's and KubeVirt's `ControllerExpectations`).
//!
//! The VMIRS and VM controllers decide from their VMI cache. Right after they created or
//! deleted a VMI, that cache can still show the old state; a reconcile that ran on it would
//! count a deleted VMI as still active and delete another one (or count a created one as
//! missing). So each create or delete records the uid it expects to appear or go, and until the
//! cache shows all of them (or [`Expectations::ttl`] passes, in case an event was lost) the
//! controller only reports status and takes no further action. Deletes are also conditioned on
//! the uid the decision saw (a `Preconditions` uid), so a name that now belongs to a newer VMI is
//! never deleted by a stale decision.
//!
//! Observation is checked against the cache when the controller runs (not counted from watch
//! events): a created uid is observed once the cache holds it, a deleted uid once the cache no
//! longer holds it or holds it with a deletion timestamp.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use microvirt_crds::VirtualMachineInstance;

/// KubeVirt's (and client-go's) expectations timeout.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Pending {
    creations: BTreeSet<String>,
    deletions: BTreeSet<String>,
    since: Instant,
}

/// Pending expectations per controller key (e.g. `vmirs/<namespace>/<name>`).
#[derive(Debug)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
    ttl: Duration,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::new(DEFAULT_TTL)
    }
}

impl Expectations {
    /// Expectations that expire after `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// How long an unobserved expectation blocks its controller.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Pending>) -> R) -> R {
        let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    fn entry<'a>(map: &'a mut HashMap<String, Pending>, key: &str) -> &'a mut Pending {
        map.entry(key.to_string()).or_insert_with(|| Pending {
            creations: BTreeSet::new(),
            deletions: BTreeSet::new(),
            since: Instant::now(),
        })
    }

    /// `key` created a VMI with `uid`.
    pub fn expect_creation(&self, key: &str, uid: &str) {
        self.with(|m| {
            let p = Self::entry(m, key);
            p.creations.insert(uid.to_string());
            p.since = Instant::now();
        });
    }

    /// `key` deleted the VMI with `uid`.
    pub fn expect_deletion(&self, key: &str, uid: &str) {
        self.with(|m| {
            let p = Self::entry(m, key);
            p.deletions.insert(uid.to_string());
            p.since = Instant::now();
        });
    }

    /// Whether `cache` shows everything `key` waits for. Observed expectations are dropped;
    /// expectations older than the ttl are dropped with a warning.
    pub fn satisfied<'a>(
        &self,
        key: &str,
        cache: impl IntoIterator<Item = &'a VirtualMachineInstance>,
    ) -> bool {
        self.with(|m| {
            let Some(p) = m.get_mut(key) else {
                return true;
            };
            let seen: HashMap<&str, bool> = cache
                .into_iter()
                .filter_map(|v| {
                    let uid = v.metadata.uid.as_deref()?;
                    Some((uid, v.metadata.deletion_timestamp.is_some()))
                })
                .collect();
            p.creations.retain(|uid| !seen.contains_key(uid.as_str()));
            p.deletions
                .retain(|uid| seen.get(uid.as_str()).is_some_and(|deleting| !deleting));
            if p.creations.is_empty() && p.deletions.is_empty() {
                m.remove(key);
                return true;
            }
            if p.since.elapsed() >= self.ttl {
                tracing::warn!(
                    key,
                    creations = ?p.creations,
                    deletions = ?p.deletions,
                    "expectations not observed within {:?}; going on without them",
                    self.ttl
                );
                m.remove(key);
                return true;
            }
            false
        })
    }

    /// Drop everything recorded for `key` (its controller object is gone).
    pub fn forget(&self, key: &str) {
        self.with(|m| {
            m.remove(key);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn vmi(uid: &str, deleting: bool) -> VirtualMachineInstance {
        let mut v = VirtualMachineInstance::new(uid, Default::default());
        v.metadata.uid = Some(uid.into());
        if deleting {
            v.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        }
        v
    }

    #[test]
    fn deletions_are_observed_when_gone_or_deleting() {
        let e = Expectations::default();
        assert!(e.satisfied("k", []), "nothing expected");
        e.expect_deletion("k", "a");
        e.expect_deletion("k", "b");
        let stale = [vmi("a", false), vmi("b", false)];
        assert!(!e.satisfied("k", &stale));
        let half = [vmi("a", true), vmi("b", false)];
        assert!(!e.satisfied("k", &half));
        // "a" was observed deleting; it need not be seen again once it is gone.
        assert!(!e.satisfied("k", &[vmi("b", false)]));
        assert!(e.satisfied("k", &[vmi("c", false)]));
        assert!(
            e.satisfied("k", &stale),
            "satisfied expectations are dropped"
        );
    }

    #[test]
    fn creations_are_observed_when_present_and_keys_are_separate() {
        let e = Expectations::default();
        e.expect_creation("k", "new");
        assert!(!e.satisfied("k", &[vmi("old", false)]));
        assert!(e.satisfied("other", &[vmi("old", false)]));
        assert!(e.satisfied("k", &[vmi("old", false), vmi("new", false)]));
        e.expect_creation("k", "x");
        e.forget("k");
        assert!(e.satisfied("k", []));
    }

    #[test]
    fn expectations_expire() {
        let e = Expectations::new(Duration::from_millis(10));
        e.expect_deletion("k", "a");
        assert!(!e.satisfied("k", &[vmi("a", false)]));
        std::thread::sleep(Duration::from_millis(20));
        assert!(e.satisfied("k", &[vmi("a", false)]));
    }
}
