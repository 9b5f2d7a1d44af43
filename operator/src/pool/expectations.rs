//! Expectations: what this operator did to a pool's pods and VMIs that its caches have not
//! shown yet, so that a reconcile running on a stale cache never acts twice (creates a second
//! warm member for the same gap, claims a member again, deletes a VMI twice).
//!
//! Each write the reconciler makes is recorded here; the next reconcile first drops what the
//! caches now show ([`PoolExpectations::observe`]) and what is older than [`EXPECTATION_TTL`]
//! (a write whose watch event never came is not waited for forever), then plans with the rest.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use microvirt_crds::pool::MemberRole;
use microvirt_crds::VirtualMachineInstance;

use super::members::role;

/// How long an unconfirmed write is remembered.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// Unconfirmed writes of one pool (by object name).
#[derive(Debug, Default, Clone)]
pub struct PoolExpectations {
    /// Pods created (builders and warm members) that the cache does not show yet.
    pub pods_created: HashMap<String, Instant>,
    /// Warm pods claimed whose cached copy still says `warm`.
    pub pods_claimed: HashMap<String, Instant>,
    /// Pods deleted that the cache still shows without a deletion timestamp.
    pub pods_deleted: HashMap<String, Instant>,
    /// Pods whose control request (snapshot) the cache does not show yet.
    pub pods_requested: HashMap<String, Instant>,
    /// VMIs created that the cache does not show yet.
    pub vmis_created: HashMap<String, Instant>,
    /// VMIs deleted that the cache still shows without a deletion timestamp.
    pub vmis_deleted: HashMap<String, Instant>,
}

impl PoolExpectations {
    /// Drops every expectation the caches confirm, and every one older than the TTL.
    /// `pods`: the pool's pods in the cache (any role); `vmis`: the namespace's VMIs.
    pub fn observe(&mut self, pods: &[&Pod], vmis: &[&VirtualMachineInstance], now: Instant) {
        let pod = |n: &str| pods.iter().find(|p| p.name_any() == n).copied();
        let vmi = |n: &str| vmis.iter().find(|v| v.name_any() == n).copied();
        let fresh = |t: &Instant| now.duration_since(*t) < EXPECTATION_TTL;
        self.pods_created
            .retain(|n, t| fresh(t) && pod(n).is_none());
        self.pods_claimed
            .retain(|n, t| fresh(t) && pod(n).is_some_and(|p| role(p) == Some(MemberRole::Warm)));
        self.pods_deleted.retain(|n, t| {
            fresh(t) && pod(n).is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        });
        self.pods_requested.retain(|n, t| {
            fresh(t) && pod(n).is_some_and(|p| super::members::control_request_id(p).is_none())
        });
        self.vmis_created
            .retain(|n, t| fresh(t) && vmi(n).is_none());
        self.vmis_deleted.retain(|n, t| {
            fresh(t) && vmi(n).is_some_and(|v| v.metadata.deletion_timestamp.is_none())
        });
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.pods_created.is_empty()
            && self.pods_claimed.is_empty()
            && self.pods_deleted.is_empty()
            && self.pods_requested.is_empty()
            && self.vmis_created.is_empty()
            && self.vmis_deleted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use microvirt_crds::pool::LABEL_POOL_ROLE;
    use std::collections::BTreeMap;

    fn pod(name: &str, role: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(BTreeMap::from([(
            LABEL_POOL_ROLE.to_string(),
            role.to_string(),
        )]));
        p
    }

    fn vmi(name: &str) -> VirtualMachineInstance {
        VirtualMachineInstance::new(name, Default::default())
    }

    #[test]
    fn expectations_clear_when_the_cache_shows_the_write() {
        let t0 = Instant::now();
        let mut e = PoolExpectations::default();
        e.pods_created.insert("w1".into(), t0);
        e.pods_claimed.insert("w2".into(), t0);
        e.pods_deleted.insert("w3".into(), t0);
        e.vmis_created.insert("v1".into(), t0);
        e.vmis_deleted.insert("v2".into(), t0);

        // Stale cache: nothing confirmed yet.
        let (w2, w3) = (pod("w2", "warm"), pod("w3", "warm"));
        let v2 = vmi("v2");
        e.observe(&[&w2, &w3], &[&v2], t0);
        assert_eq!(e.pods_created.len(), 1);
        assert_eq!(e.pods_claimed.len(), 1);
        assert_eq!(e.pods_deleted.len(), 1);
        assert_eq!(e.vmis_created.len(), 1);
        assert_eq!(e.vmis_deleted.len(), 1);

        // The cache caught up.
        let (w1, w2c) = (pod("w1", "warm"), pod("w2", "claimed"));
        let mut w3d = pod("w3", "warm");
        w3d.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let v1 = vmi("v1");
        e.observe(&[&w1, &w2c, &w3d], &[&v1], t0);
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn expectations_expire() {
        let t0 = Instant::now();
        let mut e = PoolExpectations::default();
        e.pods_created.insert("w1".into(), t0);
        e.observe(&[], &[], t0 + EXPECTATION_TTL + Duration::from_millis(1));
        assert!(e.is_empty());
    }
}
