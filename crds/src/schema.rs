//! Schema tweaks that bound sizes, so the API server's CEL cost estimator accepts our rules.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::json;

/// Most labels a selector or template may carry.
pub const MAX_LABELS: u64 = 64;
/// Longest label value (Kubernetes' own limit).
pub const MAX_LABEL_VALUE: u64 = 63;

fn bound_map(obj: &mut serde_json::Map<String, serde_json::Value>) {
    obj.insert("maxProperties".into(), json!(MAX_LABELS));
    if let Some(ap) = obj
        .get_mut("additionalProperties")
        .and_then(|v| v.as_object_mut())
    {
        ap.insert("maxLength".into(), json!(MAX_LABEL_VALUE));
    }
}

/// Longest quantity string (`quantity(...)` in CEL rules costs in proportion to it).
pub const MAX_QUANTITY_LEN: u64 = 64;
/// Most entries of a resource map (`requests`, `limits`).
pub const MAX_RESOURCES: u64 = 16;

/// `transform` for a quantity field: at most [`MAX_QUANTITY_LEN`] characters.
pub fn bounded_quantity(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("maxLength".into(), json!(MAX_QUANTITY_LEN));
    }
}

/// `transform` for a resource map (`requests`/`limits`): at most 16 entries, quantities at
/// most [`MAX_QUANTITY_LEN`] characters.
pub fn bounded_quantity_map(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("maxProperties".into(), json!(MAX_RESOURCES));
        if let Some(ap) = obj
            .get_mut("additionalProperties")
            .and_then(|v| v.as_object_mut())
        {
            ap.insert("maxLength".into(), json!(MAX_QUANTITY_LEN));
        }
    }
}

/// `transform` for a label map field: at most 64 entries, values at most 63 characters.
pub fn bounded_labels(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        bound_map(obj);
    }
}

/// `schema_with` for a LabelSelector: Kubernetes' schema with bounded matchLabels and
/// matchExpressions.
pub fn label_selector(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <LabelSelector as JsonSchema>::json_schema(generator);
    if let Some(props) = schema
        .as_object_mut()
        .and_then(|o| o.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    {
        if let Some(ml) = props.get_mut("matchLabels").and_then(|v| v.as_object_mut()) {
            bound_map(ml);
        }
        if let Some(me) = props
            .get_mut("matchExpressions")
            .and_then(|v| v.as_object_mut())
        {
            me.insert("maxItems".into(), json!(16));
        }
    }
    schema
}

/// `schema_with` for a KubeVirt field microvirt refuses (a CEL rule beside it names it and says
/// why): any object is accepted by the schema, so that the refusal, not `unknown field` or
/// pruning, is what the user meets.
pub fn any_object(_: &mut SchemaGenerator) -> Schema {
    serde_json::from_value(json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    }))
    .expect("a valid schema")
}

/// `schema_with` for a list of [`any_object`]s (at most 64).
pub fn any_object_list(_: &mut SchemaGenerator) -> Schema {
    serde_json::from_value(json!({
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        },
    }))
    .expect("a valid schema")
}

/// `transform` for a field that is `#[serde(default)]` in Rust only: no `default` in the
/// schema, so the API server does not fill it in (a validation rule requires it instead).
pub fn no_default(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("default");
    }
}
