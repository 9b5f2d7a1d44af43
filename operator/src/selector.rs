//! Label selector matching and rendering (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` match `selector` (matchLabels and matchExpressions; an empty selector
/// matches everything, as in Kubernetes).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .as_ref()
        .is_none_or(|ml| ml.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let exprs_ok = selector.match_expressions.as_ref().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or(&[]);
            let have = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                // Unknown operators match nothing (the apiserver rejects them for built-in types).
                _ => false,
            }
        })
    });
    labels_ok && exprs_ok
}

/// The selector in `kubectl --selector` syntax (for the scale subresource's labelSelector).
pub fn to_selector_string(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(ml) = &selector.match_labels {
        parts.extend(ml.iter().map(|(k, v)| format!("{k}={v}")));
    }
    if let Some(exprs) = &selector.match_expressions {
        for e in exprs {
            let values = e.values.clone().unwrap_or_default().join(",");
            parts.push(match e.operator.as_str() {
                "In" => format!("{} in ({values})", e.key),
                "NotIn" => format!("{} notin ({values})", e.key),
                "Exists" => e.key.clone(),
                "DoesNotExist" => format!("!{}", e.key),
                other => format!("{} {other} ({values})", e.key),
            });
        }
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "legacy".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        assert!(matches(&sel, &labels(&[("app", "web"), ("tier", "a")])));
        assert!(!matches(&sel, &labels(&[("app", "web"), ("tier", "c")])));
        assert!(!matches(&sel, &labels(&[("app", "db"), ("tier", "a")])));
        assert!(!matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "a"), ("legacy", "1")])
        ));
        assert!(matches(&LabelSelector::default(), &labels(&[])));
        assert_eq!(to_selector_string(&sel), "app=web,tier in (a,b),!legacy");
    }
}
