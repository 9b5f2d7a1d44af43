//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Every replica tries to become the holder; only the holder runs controllers. client-go's
//! timing: the holder tries to renew every `retry_period`; each attempt, and the time since the
//! last successful one, is bounded by `renew_deadline`, which is shorter than the lease duration:
//! a holder whose renewals hang or fail gives up leadership ([`LeaderElector::hold`] returns, the
//! controllers stop, the process exits to be restarted as a standby) before another replica may
//! take the lease over, which happens once `renewTime` is older than `leaseDurationSeconds`.
//! Updates carry the read `resourceVersion`, so two replicas racing for the lease cannot both
//! win. On an orderly shutdown the holder releases the lease (clears the holder), so a standby
//! takes over at once instead of after the lease duration.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;

/// Leader election errors.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API server refused or failed a request.
    #[error("lease {name}: {source}")]
    Kube {
        /// Lease name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
    /// Renewing failed (or hung) for longer than the renew deadline.
    #[error("lost the lease {name}: not renewed within the renew deadline of {deadline:?}")]
    Lost {
        /// Lease name.
        name: String,
        /// The renew deadline.
        deadline: Duration,
    },
    /// Another replica holds the lease now.
    #[error("lost the lease {0}: another replica holds it")]
    TakenOver(String),
    /// A request did not answer in time.
    #[error("lease {0}: the API server did not answer in time")]
    Timeout(String),
    /// The timing settings are inconsistent.
    #[error("leader election: {0}")]
    Config(&'static str),
}

/// What to do about a lease, given its current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No lease exists: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Another holder's lease expired: take it over.
    TakeOver,
    /// Another holder is live: wait.
    Wait,
}

/// Decide, purely, what `identity` should do about `lease` at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::TakeOver,
        Some(_) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            let last = spec
                .renew_time
                .as_ref()
                .or(spec.acquire_time.as_ref())
                .map(|t| t.0);
            match last {
                Some(t) if t + SignedDuration::from_secs(duration) > now => Decision::Wait,
                _ => Decision::TakeOver,
            }
        }
    }
}

/// Settings of leader election (client-go's names and defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a lease is valid without renewal (others wait this long before taking over).
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal (< `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the holder renews and a standby retries (< `renew_deadline`).
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Default timing for `name`/`namespace`/`identity`.
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Check that a holder gives up before others may take over, and retries before giving up.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.renew_deadline >= self.lease_duration {
            return Err(LeaderError::Config(
                "the renew deadline must be shorter than the lease duration",
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(LeaderError::Config(
                "the retry period must be more than 0 and shorter than the renew deadline",
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(LeaderError::Config(
                "the lease duration must be at least 1 s",
            ));
        }
        Ok(())
    }
}

/// Acquires, holds and releases a Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderConfig,
}

impl LeaderElector {
    /// An elector for `cfg`.
    pub fn new(client: Client, cfg: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LeaderConfig {
        &self.cfg
    }

    fn err(&self) -> impl FnOnce(kube::Error) -> LeaderError + '_ {
        move |source| LeaderError::Kube {
            name: self.cfg.name.clone(),
            source,
        }
    }

    /// One attempt: returns whether we hold the lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, LeaderError> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.cfg.name).await.map_err(self.err())?;
        let decision = decide(current.as_ref(), &self.cfg.identity, now);
        let duration_s = i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(15);
        let result = match (decision, current) {
            (Decision::Wait, _) => return Ok(false),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.cfg.identity.clone()),
                        lease_duration_seconds: Some(duration_s),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (d, Some(mut lease)) => {
                let mut spec = lease.spec.take().unwrap_or_default();
                if d == Decision::TakeOver {
                    spec.holder_identity = Some(self.cfg.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(duration_s);
                spec.renew_time = Some(MicroTime(now));
                lease.spec = Some(spec);
                // `replace` sends the resourceVersion we read: a concurrent writer makes it fail.
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
            }
            (_, None) => return Ok(false),
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.err()(e)),
        }
    }

    /// One attempt bounded by `limit`.
    async fn attempt(&self, limit: Duration) -> Result<bool, LeaderError> {
        tokio::time::timeout(limit, self.try_acquire_or_renew())
            .await
            .unwrap_or_else(|_| Err(LeaderError::Timeout(self.cfg.name.clone())))
    }

    /// Wait until this replica holds the lease. `standing_by` is called each time the API
    /// server answered that another replica holds it.
    pub async fn acquire(&self, standing_by: impl Fn()) {
        loop {
            match self.attempt(self.cfg.renew_deadline).await {
                Ok(true) => {
                    tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "acquired leadership");
                    return;
                }
                Ok(false) => standing_by(),
                Err(e) => tracing::warn!("leader election: {e}"),
            }
            tokio::time::sleep(self.cfg.retry_period).await;
        }
    }

    /// Renew until leadership ends; returns why it ended. Each attempt is bounded by what is
    /// left of the renew deadline, counted from the start of the last successful attempt (the
    /// `renewTime` it wrote), so the holder stops before any other replica may take over.
    pub async fn hold(&self) -> LeaderError {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            let started = Instant::now();
            let left = (last_ok + self.cfg.renew_deadline).saturating_duration_since(started);
            if left.is_zero() {
                return self.lost();
            }
            match self.attempt(left).await {
                Ok(true) => last_ok = started,
                Ok(false) => return LeaderError::TakenOver(self.cfg.name.clone()),
                Err(e) => {
                    tracing::warn!("renewing lease: {e}");
                    if last_ok.elapsed() >= self.cfg.renew_deadline {
                        return self.lost();
                    }
                }
            }
        }
    }

    fn lost(&self) -> LeaderError {
        LeaderError::Lost {
            name: self.cfg.name.clone(),
            deadline: self.cfg.renew_deadline,
        }
    }

    /// Give the lease up (holder cleared, duration 1 s) if we still hold it, as client-go's
    /// `ReleaseOnCancel` does, so a standby takes over at once. Bounded by `limit`.
    pub async fn release(&self, limit: Duration) -> Result<(), LeaderError> {
        let release = async {
            let Some(mut lease) = self.api.get_opt(&self.cfg.name).await.map_err(self.err())?
            else {
                return Ok(());
            };
            let mut spec = lease.spec.take().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
                return Ok(());
            }
            let now = MicroTime(Timestamp::now());
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            lease.spec = Some(spec);
            match self
                .api
                .replace(&self.cfg.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(()),
                // Someone else wrote it meanwhile: it is not ours to release any more.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(self.err()(e)),
            }
        };
        tokio::time::timeout(limit, release)
            .await
            .unwrap_or_else(|_| Err(LeaderError::Timeout(self.cfg.name.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_s: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed_s).unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Create);
        assert_eq!(
            decide(Some(&lease("a", 990, 15)), "a", now),
            Decision::Renew
        );
        assert_eq!(decide(Some(&lease("b", 990, 15)), "a", now), Decision::Wait);
        assert_eq!(
            decide(Some(&lease("b", 980, 15)), "a", now),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&lease("", 999, 15)), "a", now),
            Decision::TakeOver
        );
    }

    #[test]
    fn timing_is_checked() {
        let ok = LeaderConfig::new("l", "ns", "a");
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.retry_period = c.renew_deadline;
        assert!(c.validate().is_err());
        let mut c = ok;
        c.retry_period = Duration::ZERO;
        assert!(c.validate().is_err());
    }
}
