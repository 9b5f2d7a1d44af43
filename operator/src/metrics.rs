//! Prometheus metrics of the operator.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label set naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `vmi`, `vm` or `vmirs`.
    pub controller: &'static str,
}

/// Label set of the error counter: the controller and the kind of failure
/// (`controller::Error::kind`: `conflict`, `not_found`, `forbidden`, `invalid`, `api`,
/// `connection`, `pod_spec`, `preset`, `json`, `missing_meta`, `finalizer`, `timeout`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `vmi`, `vm`, `vmirs` or `pool`.
    pub controller: &'static str,
    /// The kind of failure.
    pub kind: &'static str,
}

/// Label set naming a VMI phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase entered.
    pub phase: &'static str,
}

/// All metrics, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Reconciles started, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that returned an error, per controller and kind of failure.
    pub errors: Family<ErrorLabels, Counter>,
    /// Reconcile durations in seconds, per controller.
    pub durations: Family<ControllerLabels, Histogram>,
    /// Seconds from VMI creation until the operator recorded each phase.
    pub phase_transitions: Family<PhaseLabels, Histogram>,
    /// Seconds from a VM pool's claim of a warm member to the claimed VMI's Ready=True.
    pub pool_claims: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Create and register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("microvirt_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let phase_transitions = Family::<PhaseLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.01, 2.0, 16))
        });
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that returned an error, by kind of failure",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles",
            durations.clone(),
        );
        registry.register(
            "vmi_phase_transition_seconds",
            "Seconds from VMI creation until the operator recorded the phase",
            phase_transitions.clone(),
        );
        let pool_claims = Histogram::new(exponential_buckets(0.002, 2.0, 14));
        registry.register(
            "pool_claim_seconds",
            "Seconds from a VM pool's claim of a warm member to the claimed VMI's Ready",
            pool_claims.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            durations,
            phase_transitions,
            pool_claims,
        }
    }

    /// Record one finished reconcile; `failed` is the kind of its error, if it failed.
    pub fn reconciled(
        &self,
        controller: &'static str,
        took: Duration,
        failed: Option<&'static str>,
    ) {
        let l = ControllerLabels { controller };
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
        if let Some(kind) = failed {
            self.errors
                .get_or_create(&ErrorLabels { controller, kind })
                .inc();
        }
    }

    /// Record that a VMI entered `phase` `since_creation` after it was created.
    pub fn phase_entered(&self, phase: &'static str, since_creation: Duration) {
        self.phase_transitions
            .get_or_create(&PhaseLabels { phase })
            .observe(since_creation.as_secs_f64());
    }

    /// Record one claim of a warm member, from the claim to the VMI's Ready.
    pub fn claimed(&self, took: Duration) {
        self.pool_claims.observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_recorded_values() {
        let m = Metrics::new();
        m.reconciled("vmi", Duration::from_millis(3), None);
        m.reconciled("vmi", Duration::from_millis(5), Some("conflict"));
        m.reconciled("vmi", Duration::from_millis(5), Some("conflict"));
        m.reconciled("vm", Duration::from_millis(5), Some("timeout"));
        m.phase_entered("Running", Duration::from_millis(250));
        m.claimed(Duration::from_millis(30));
        let text = m.encode();
        assert!(
            text.contains("microvirt_operator_pool_claim_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("microvirt_operator_reconciles_total{controller=\"vmi\"} 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "microvirt_operator_reconcile_errors_total{controller=\"vmi\",kind=\"conflict\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "microvirt_operator_reconcile_errors_total{controller=\"vm\",kind=\"timeout\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains(
            "microvirt_operator_vmi_phase_transition_seconds_count{phase=\"Running\"} 1"
        ));
    }
}
