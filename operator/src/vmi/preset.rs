//! Applying VirtualMachineInstancePresets to a VMI spec (pure).
//!
//! Presets whose selector matches the VMI's labels are applied in name order, once, when the
//! operator first sees the VMI (before it writes any status). Each leaf field a preset sets is
//! copied into `spec.domain` when the VMI leaves it unset; when the VMI (or an earlier preset)
//! already has a different value, the field is skipped and reported as a conflict. Lists are
//! leaves (merged whole or not at all).

use std::collections::BTreeMap;

use microvirt_crds::vmi::DomainSpec;
use microvirt_crds::VirtualMachineInstancePreset;
use serde_json::{Map, Value};

use crate::selector;

/// Why presets could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    /// (De)serializing a domain failed.
    #[error("merging preset domain: {0}")]
    Json(#[from] serde_json::Error),
}

/// Result of applying presets.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PresetOutcome {
    /// The merged domain.
    pub domain: DomainSpec,
    /// Names of the presets that matched (in application order).
    pub applied: Vec<String>,
    /// `(preset, field path)` pairs skipped because the VMI already set a different value.
    pub conflicts: Vec<(String, String)>,
}

/// Presets (from `candidates`, any namespace filtering done by the caller) that match `labels`,
/// sorted by name.
pub fn matching<'a>(
    candidates: impl IntoIterator<Item = &'a VirtualMachineInstancePreset>,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a VirtualMachineInstancePreset> {
    let mut v: Vec<_> = candidates
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| selector::matches(&p.spec.selector, labels))
        .collect();
    v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    v
}

fn merge(
    dst: &mut Map<String, Value>,
    src: &Map<String, Value>,
    path: &str,
    conflicts: &mut Vec<String>,
) {
    for (k, v) in src {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match (dst.get_mut(k), v) {
            (None, _) => {
                dst.insert(k.clone(), v.clone());
            }
            (Some(Value::Object(d)), Value::Object(s)) => merge(d, s, &p, conflicts),
            (Some(existing), _) if existing == v => {}
            (Some(_), _) => conflicts.push(p),
        }
    }
}

/// Apply `presets` (already filtered and sorted, see [`matching`]) to `domain`.
pub fn apply(
    domain: &DomainSpec,
    presets: &[&VirtualMachineInstancePreset],
) -> Result<PresetOutcome, PresetError> {
    let mut merged = match serde_json::to_value(domain)? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let mut outcome = PresetOutcome::default();
    for p in presets {
        let name = p.metadata.name.clone().unwrap_or_default();
        outcome.applied.push(name.clone());
        let Some(pd) = &p.spec.domain else { continue };
        if let Value::Object(src) = serde_json::to_value(pd)? {
            let mut conflicts = Vec::new();
            merge(&mut merged, &src, "domain", &mut conflicts);
            outcome
                .conflicts
                .extend(conflicts.into_iter().map(|c| (name.clone(), c)));
        }
    }
    outcome.domain = serde_json::from_value(Value::Object(merged))?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use microvirt_crds::vmi::{Cpu, Memory};
    use microvirt_crds::VirtualMachineInstancePresetSpec;

    fn preset(
        name: &str,
        sel: &[(&str, &str)],
        domain: DomainSpec,
    ) -> VirtualMachineInstancePreset {
        let mut p = VirtualMachineInstancePreset::new(
            name,
            VirtualMachineInstancePresetSpec {
                selector: LabelSelector {
                    match_labels: Some(
                        sel.iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
                domain: Some(domain),
            },
        );
        p.metadata.namespace = Some("ns".into());
        p
    }

    fn mem(q: &str) -> Option<Memory> {
        Some(Memory {
            guest: Some(Quantity(q.into())),
            ..Default::default()
        })
    }

    #[test]
    fn fills_unset_fields_and_reports_conflicts() {
        let small = preset(
            "a-small",
            &[("size", "small")],
            DomainSpec {
                cpu: Some(Cpu {
                    cores: Some(2),
                    ..Default::default()
                }),
                memory: mem("256Mi"),
                ..Default::default()
            },
        );
        let other = preset("b-other", &[("size", "large")], DomainSpec::default());
        let labels = BTreeMap::from([("size".to_string(), "small".to_string())]);
        let all = [small.clone(), other];
        let m = matching(all.iter(), &labels);
        assert_eq!(m.len(), 1);

        let vmi_domain = DomainSpec {
            memory: mem("128Mi"),
            cpu: Some(Cpu {
                sockets: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = apply(&vmi_domain, &m).unwrap();
        assert_eq!(out.applied, vec!["a-small".to_string()]);
        let cpu = out.domain.cpu.clone().unwrap();
        assert_eq!(cpu.cores, Some(2));
        assert_eq!(cpu.sockets, Some(1));
        // The VMI's own memory wins; the preset's value is a conflict.
        assert_eq!(out.domain.memory, mem("128Mi"));
        assert_eq!(
            out.conflicts,
            vec![("a-small".to_string(), "domain.memory.guest".to_string())]
        );
    }

    #[test]
    fn equal_values_are_not_conflicts_and_no_match_changes_nothing() {
        let p = preset(
            "p",
            &[("a", "b")],
            DomainSpec {
                memory: mem("128Mi"),
                ..Default::default()
            },
        );
        let d = DomainSpec {
            memory: mem("128Mi"),
            ..Default::default()
        };
        let out = apply(&d, &[&p]).unwrap();
        assert!(out.conflicts.is_empty());
        assert_eq!(out.domain, d);
        let none = apply(&d, &[]).unwrap();
        assert_eq!(none.domain, d);
        assert!(none.applied.is_empty());
    }
}
