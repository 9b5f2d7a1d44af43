//! One quantity grammar everywhere: the CRD's CEL rules (the API server's own `isQuantity` and
//! `quantity`) accept exactly the quantities that `microvirt_crds::quantity::parse_bytes` — the
//! parser of the operator and of the launcher — turns into an in-range number of bytes, and both
//! order them the same way at the bounds (16Mi for guest memory, 0 and 1Ei for emptyDisk).

use crate::common::*;
use anyhow::Result;
use kube::api::PostParams;
use kube::Api;
use microvirt_crds::quantity::parse_bytes;
use microvirt_crds::VirtualMachineInstance;
use serde_json::{json, Value};

/// Strings a user might write, valid and not (apimachinery's grammar decides).
const CASES: &[&str] = &[
    "1Gi",
    "128Mi",
    "1.5Gi",
    "500M",
    "1e9",
    "1E9",
    "1e+9",
    "2.5e3",
    "1k",
    "1500m",
    "500u",
    "1n",
    "+16Mi",
    "0016Mi",
    "16.Mi",
    ".5Ki",
    "1E",
    "1Ei",
    "1.0000001Ei",
    "1152921504606846976",
    "1152921504606846977",
    "1152921504606846975.5",
    "0.5",
    "0",
    "-0",
    "0Mi",
    "Mi",
    ".",
    "+",
    "-1Mi",
    "-0.5",
    "15Ei",
    "1e20",
    "1e4294967296",
    "",
    " 1Gi",
    "1Gi ",
    "1K",
    "1kb",
    "1mi",
    "1e",
    "1e3e",
    "1Ki3",
    "0x10",
    "1_000",
    "1,5Gi",
    "--1",
    "1 Mi",
    "1GiB",
    "one",
];

/// Guest memory around the 16Mi floor, written in different notations.
const MEMORY_CASES: &[&str] = &[
    "16Mi",
    "16777216",
    "16777215",
    "16384Ki",
    "16383Ki",
    "0.015625Gi",
    "0.0156249Gi",
    "16.777216M",
    "16.777215M",
    "1.6777216e7",
    "1.6777215e7",
    "16777216000m",
    "1Ei",
    "1.0000001Ei",
];

fn vmi(memory: &str, capacity: Value) -> Result<VirtualMachineInstance> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "q"},
        "spec": {
            "domain": {"memory": {"guest": memory}},
            "volumes": [{"name": "scratch", "emptyDisk": {"capacity": capacity}}],
        },
    }))?)
}

/// Whether the API server accepts the VMI (server-side dry run: validation and CEL rules run,
/// nothing is stored). Any answer but 201 or 422 is an error of the test.
async fn accepted(api: &Api<VirtualMachineInstance>, v: &VirtualMachineInstance) -> Result<bool> {
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&pp, v).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

const EI: u64 = 1 << 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_rules_and_the_shared_parser_agree_on_quantities() -> Result<()> {
    let kc = tokio::task::block_in_place(shared_cluster).kubeconfig_path();
    let (ok, _, err) = kubectl(kc, &["create", "namespace", "t-quantities"], None)?;
    assert!(ok, "{err}");
    let api: Api<VirtualMachineInstance> = Api::namespaced(client_for(kc).await?, "t-quantities");

    let mut disagreements = Vec::new();
    // emptyDisk.capacity: more than 0, at most 1Ei.
    for s in CASES {
        let server = accepted(&api, &vmi("128Mi", json!(s))?).await?;
        let ours = parse_bytes(s);
        let parser = ours.as_ref().is_ok_and(|&b| b > 0 && b <= EI);
        if server != parser {
            disagreements.push(format!(
                "capacity {s:?}: API server {server}, parser {ours:?}"
            ));
        }
    }
    // domain.memory.guest: from 16Mi to 1Ei, compared exactly by the API server.
    for s in MEMORY_CASES.iter().chain(CASES) {
        let server = accepted(&api, &vmi(s, json!("1Gi"))?).await?;
        let ours = parse_bytes(s);
        let parser = ours.as_ref().is_ok_and(|&b| (16 << 20..=EI).contains(&b));
        if server != parser {
            disagreements.push(format!(
                "memory {s:?}: API server {server}, parser {ours:?}"
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "the CRD and the shared parser disagree:\n{}",
        disagreements.join("\n")
    );
    // An integer in the manifest is a quantity too.
    assert!(accepted(&api, &vmi("128Mi", json!(1048576))?).await?);
    assert!(!accepted(&api, &vmi("128Mi", json!(0))?).await?);

    // A fractional number of bytes: the parser rounds up (as `Quantity.Value()` does), the API
    // server compares the exact value. Only a value below the floor by less than a byte differs,
    // and the API server refuses it, so the operator and the launcher never see it.
    for s in ["16777215.5", "16777215999m"] {
        assert!(!accepted(&api, &vmi(s, json!("1Gi"))?).await?, "{s}");
        assert_eq!(parse_bytes(s), Ok(16 << 20), "{s}");
    }
    Ok(())
}
