//! Counts KubeVirt's own example documents of microvirt's kinds (VMI, VM, VMIRS, preset, pool)
//! that the API server accepts with only the apiVersion changed, and lists each refusal with
//! its message. Runs against a private etcd + kube-apiserver with microvirt's CRDs.
//!
//! ```sh
//! cargo run -p microvirt-operator --example count_kubevirt_examples -- <kubevirt>/examples
//! ```
//!
//! KubeVirt's instancetype and preference documents (`instancetype.kubevirt.io`) are counted
//! apart, with their own tally, so that the count of the five kinds stays comparable.
//!
//! A bare VMI with KubeVirt's sidecar-hook annotation is counted as refused: the API server
//! admits it (a CRD's rules cannot see annotations) and the operator fails it (`InvalidSpec`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use common::{kubectl, shared_cluster};
use microvirt_crds::refusals;

fn main() -> Result<()> {
    let dir = std::env::args().nth(1).context(
        "usage: count_kubevirt_examples DIR (a directory of KubeVirt's example manifests)",
    )?;
    let kinds = [
        "VirtualMachineInstance",
        "VirtualMachine",
        "VirtualMachineInstanceReplicaSet",
        "VirtualMachineInstancePreset",
        "VirtualMachinePool",
    ];
    let instancetype_kinds = [
        "VirtualMachineInstancetype",
        "VirtualMachineClusterInstancetype",
        "VirtualMachinePreference",
        "VirtualMachineClusterPreference",
    ];
    let kc = shared_cluster().kubeconfig_path();
    let ns = "t-kubevirt-examples";
    let _ = kubectl(kc, &["create", "namespace", ns], None)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
    files.sort();
    let (mut total, mut accepted) = (0, 0);
    let mut refused = Vec::new();
    let (mut it_total, mut it_accepted) = (0, 0);
    let mut it_refused = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path)?;
        for doc in text.split("\n---") {
            let kind = doc
                .lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .map(str::trim);
            let api = doc
                .lines()
                .find_map(|l| l.strip_prefix("apiVersion: "))
                .map(str::trim);
            let (Some(kind), Some(api)) = (kind, api) else {
                continue;
            };
            let is_it = instancetype_kinds.contains(&kind);
            if !(kinds.contains(&kind) || is_it) || !api.contains("kubevirt.io/") {
                continue;
            }
            let doc = doc.replace(
                &format!("apiVersion: {api}"),
                "apiVersion: microvirt.io/v1alpha1",
            );
            let (ok, _, err) = kubectl(
                kc,
                &["-n", ns, "create", "--dry-run=server", "-f", "-"],
                Some(&doc),
            )?;
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if is_it {
                it_total += 1;
                if ok {
                    it_accepted += 1;
                    println!("accepted  {name} ({kind})");
                } else {
                    it_refused.push(format!("{name} ({kind}): {}", err.trim()));
                }
                continue;
            }
            total += 1;
            let hooks = doc.contains(refusals::ANNOTATION_HOOK_SIDECARS)
                && kind == "VirtualMachineInstance";
            if ok && !hooks {
                accepted += 1;
                println!("accepted  {name} ({kind})");
            } else if ok {
                refused.push(format!(
                    "{name} ({kind}): admitted, then Failed by the operator (InvalidSpec): {}",
                    refusals::HOOK_SIDECARS
                ));
            } else {
                refused.push(format!("{name} ({kind}): {}", err.trim()));
            }
        }
    }
    println!(
        "\n{accepted} of {total} accepted; {} refused:",
        refused.len()
    );
    for r in &refused {
        println!("refused   {r}");
    }
    println!(
        "\ninstancetypes and preferences: {it_accepted} of {it_total} accepted; {} refused:",
        it_refused.len()
    );
    for r in &it_refused {
        println!("refused   {r}");
    }
    Ok(())
}
