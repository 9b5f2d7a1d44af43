//! The committed `crds/*.yaml` must be exactly what `crdgen` generates from the Rust types.

use std::path::Path;

#[test]
fn committed_crd_yaml_matches_generated() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for (file, crd) in microvirt_crds::all_crds() {
        let want = microvirt_crds::render_yaml(&crd).expect("render");
        let have = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        if have != want {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "stale CRD YAML {stale:?}: run `cargo run -p microvirt-crds --bin crdgen` and commit the result"
    );
}

#[test]
fn every_crd_has_its_short_name_and_columns() {
    let want: &[(&str, &str, &[&str])] = &[
        (
            "virtualmachineinstances.microvirt.io",
            "vmi",
            &["Phase", "IP", "NodeName", "Ready", "Age"],
        ),
        (
            "virtualmachines.microvirt.io",
            "vm",
            &["Status", "Ready", "Age"],
        ),
        (
            "virtualmachineinstancereplicasets.microvirt.io",
            "vmirs",
            &["Desired", "Current", "Ready", "Age"],
        ),
        (
            "virtualmachineinstancepresets.microvirt.io",
            "vmipreset",
            &["Age"],
        ),
        (
            "virtualmachinepools.microvirt.io",
            "vmpool",
            &[
                "Desired",
                "Current",
                "Ready",
                "Warm",
                "Snapshot",
                "Claim-P50-ms",
                "Age",
            ],
        ),
        (
            "virtualmachineinstancetypes.microvirt.io",
            "vminstancetype",
            &["Age"],
        ),
        (
            "virtualmachineclusterinstancetypes.microvirt.io",
            "vmclusterinstancetype",
            &["Age"],
        ),
        ("virtualmachinepreferences.microvirt.io", "vmpref", &["Age"]),
        (
            "virtualmachineclusterpreferences.microvirt.io",
            "vmcpref",
            &["Age"],
        ),
    ];
    let crds = microvirt_crds::all_crds();
    assert_eq!(crds.len(), want.len());
    for ((_, crd), (name, short, columns)) in crds.iter().zip(want) {
        assert_eq!(crd.metadata.name.as_deref(), Some(*name));
        assert_eq!(crd.spec.group, "microvirt.io");
        let shorts = crd.spec.names.short_names.clone().unwrap_or_default();
        assert!(
            shorts.iter().any(|s| s == short),
            "{name}: short names {shorts:?}"
        );
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        let cols: Vec<&str> = v
            .additional_printer_columns
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, *columns, "{name}");
    }
    // The replica set and the pool have status and scale subresources wired to the right
    // paths (kubectl scale, HPA, KEDA).
    for i in [2, 4] {
        let v = &crds[i].1.spec.versions[0];
        let sub = v.subresources.as_ref().expect("subresources");
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().expect("scale subresource");
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.labelSelector")
        );
    }
}
