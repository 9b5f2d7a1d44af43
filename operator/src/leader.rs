//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Every replica tries to become the holder; only the holder runs controllers. The holder renews
//! the lease every `renew_every`; another replica takes it over when `renewTime` is older than
//! `leaseDurationSeconds`. Updates carry the read `resourceVersion`, so two replicas racing for
//! the lease cannot both win. A holder that fails to renew within the lease duration stops
//! ([`LeaderElector::hold`] returns) and the process exits, to be restarted as a standby.

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
    /// Renewing failed for longer than the lease duration.
    #[error("lost the lease {0}: not renewed within its duration")]
    Lost(String),
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

/// Settings of leader election.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
}

/// Acquires and holds a Lease.
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
        let duration_s = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(15);
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

    /// Wait until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "acquired leadership");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("leader election: {e}"),
            }
            tokio::time::sleep(self.cfg.renew_every).await;
        }
    }

    /// Renew forever; returns the error that ended leadership.
    pub async fn hold(&self) -> LeaderError {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => return LeaderError::Lost(self.cfg.name.clone()),
                Err(e) => {
                    tracing::warn!("renewing lease: {e}");
                    if last_ok.elapsed() >= self.cfg.lease_duration {
                        return LeaderError::Lost(self.cfg.name.clone());
                    }
                }
            }
        }
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
}
