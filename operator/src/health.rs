//! What `/readyz` reports: the replica's role, as a state machine with checked transitions.
//!
//! Readiness does not depend on leadership: a standby that reaches the API server is Ready (it
//! can take over at any moment), so a Deployment with two replicas completes a rolling update.
//! The leader is Ready once its caches are filled. A replica that is shutting down is not Ready.
//!
//! ```text
//! Starting ──▶ Standby ──▶ Leading ──▶ Stopping
//!    │                        ▲            ▲
//!    └────────────────────────┘ (no leader election), and any state ──▶ Stopping
//! ```

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

/// The replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// Not yet talked to the API server.
    Starting = 0,
    /// Another replica holds the Lease; this one is ready to take over.
    Standby = 1,
    /// Running the controllers.
    Leading = 2,
    /// Shutting down.
    Stopping = 3,
}

impl Role {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Starting,
            1 => Self::Standby,
            2 => Self::Leading,
            _ => Self::Stopping,
        }
    }
}

/// Whether `from → to` is a valid role change.
pub fn valid_transition(from: Role, to: Role) -> bool {
    use Role::*;
    matches!(
        (from, to),
        (Starting, Standby) | (Starting, Leading) | (Standby, Leading) | (_, Stopping)
    ) || from == to
}

/// Shared health state: the role and whether the controllers' caches are filled.
#[derive(Debug, Default)]
pub struct Health {
    role: AtomicU8,
    caches_filled: Arc<AtomicBool>,
}

impl Health {
    /// A replica that is starting.
    pub fn new() -> Self {
        Self::default()
    }

    /// The flag the controllers set once their caches are filled (see `controller::run::run`).
    pub fn caches_filled(&self) -> Arc<AtomicBool> {
        self.caches_filled.clone()
    }

    /// The current role.
    pub fn role(&self) -> Role {
        Role::from_u8(self.role.load(Ordering::SeqCst))
    }

    /// Move to `to`; an invalid change is refused (logged) and leaves the role as it is.
    pub fn set_role(&self, to: Role) -> bool {
        let mut cur = self.role.load(Ordering::SeqCst);
        loop {
            let from = Role::from_u8(cur);
            if !valid_transition(from, to) {
                tracing::debug!("ignoring role change {from:?} -> {to:?}");
                return false;
            }
            match self
                .role
                .compare_exchange(cur, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// `Ok(reason)` when ready, `Err(reason)` when not.
    pub fn readiness(&self) -> Result<&'static str, &'static str> {
        match self.role() {
            Role::Starting => Err("starting: the API server has not answered yet"),
            Role::Standby => Ok("standing by for leadership"),
            Role::Leading if self.caches_filled.load(Ordering::SeqCst) => Ok("leading"),
            Role::Leading => Err("leading, caches not filled yet"),
            Role::Stopping => Err("shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions() {
        use Role::*;
        let all = [Starting, Standby, Leading, Stopping];
        for from in all {
            for to in all {
                let want = from == to
                    || to == Stopping
                    || matches!(
                        (from, to),
                        (Starting, Standby) | (Starting, Leading) | (Standby, Leading)
                    );
                assert_eq!(valid_transition(from, to), want, "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn readiness_follows_role_and_caches() {
        let h = Health::new();
        assert!(h.readiness().is_err());
        assert!(h.set_role(Role::Standby));
        assert_eq!(h.readiness(), Ok("standing by for leadership"));
        assert!(h.set_role(Role::Leading));
        assert!(h.readiness().is_err());
        h.caches_filled().store(true, Ordering::SeqCst);
        assert_eq!(h.readiness(), Ok("leading"));
        assert!(
            !h.set_role(Role::Standby),
            "a leader never goes back to standby"
        );
        assert!(h.set_role(Role::Stopping));
        assert!(!h.set_role(Role::Leading));
        assert_eq!(h.readiness(), Err("shutting down"));
    }
}
