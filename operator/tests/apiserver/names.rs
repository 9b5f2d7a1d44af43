//! Names and paths in the CRDs that end up as paths in the launcher pod are refused by the real
//! API server (private etcd + kube-apiserver, CRDs from `crds/`) with a clear message at
//! `kubectl apply`: disk and volume names must be DNS labels, image paths must stay inside
//! their image. The same holds in the VirtualMachine and VirtualMachineInstanceReplicaSet
//! templates.

use crate::common::{apply_in, apply_refused_in, kubectl, shared_cluster, vmi_yaml};
use anyhow::Result;

const NS: &str = "t-names";

#[test]
fn path_bearing_names_and_paths_are_refused_at_apply() -> Result<()> {
    let kc = shared_cluster().kubeconfig_path();
    let _ = kubectl(kc, &["create", "namespace", NS], None)?;
    let good = vmi_yaml("names", "");
    apply_in(kc, NS, &good)?;
    // Paths that only look like `..` are fine.
    let dots = vmi_yaml("dots", "").replace(
        "      image: quay.io/containerdisks/fedora:latest\n",
        "      image: quay.io/containerdisks/fedora:latest\n      path: disk/a..b.img\n",
    );
    apply_in(kc, NS, &dots)?;

    let volume_msg = "a volume name must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters): it becomes a directory name in the launcher pod";
    let disk_msg = "a disk name must be a DNS label";
    let kernel = |field: &str, value: &str| {
        good.replace(
            "  domain:\n",
            &format!(
                "  domain:\n    firmware:\n      kernelBoot:\n        container:\n          image: k\n          {field}: {value}\n"
            ),
        )
    };
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "emptyDisk named ../pvcs/data",
            good.replace("- name: root\n        disk:", "- name: ../pvcs/data\n        disk:")
                .replace(
                    "  - name: root\n    containerDisk:\n      image: quay.io/containerdisks/fedora:latest\n",
                    "  - name: ../pvcs/data\n    emptyDisk: {capacity: 1Gi}\n",
                ),
            vec![
                "spec.volumes[0].name: Invalid value",
                volume_msg,
                "spec.domain.devices.disks[0].name: Invalid value",
                disk_msg,
            ],
        ),
        (
            "upper-case names",
            good.replace("name: root", "name: Root"),
            vec![volume_msg, disk_msg],
        ),
        (
            "a slash in a volume name",
            good.replace("name: root", "name: a/b"),
            vec![volume_msg],
        ),
        (
            "containerDisk.path leaving the image",
            good.replace(
                "      image: quay.io/containerdisks/fedora:latest\n",
                "      image: quay.io/containerdisks/fedora:latest\n      path: disk/../../pvcs/data/disk.img\n",
            ),
            vec!["containerDisk.path must stay inside the image: no '..' component"],
        ),
        (
            "kernelPath leaving the image",
            kernel("kernelPath", "/boot/../../run/secrets/x"),
            vec!["kernelPath must stay inside the image: no '..' component"],
        ),
        (
            "initrdPath leaving the image",
            kernel("initrdPath", ".."),
            vec!["initrdPath must stay inside the image: no '..' component"],
        ),
    ];
    for (what, yaml, wants) in &cases {
        apply_refused_in(kc, NS, what, yaml, wants)?;
    }

    // The templates of VirtualMachine and VirtualMachineInstanceReplicaSet have the same rules.
    let template_spec = |indent: &str| {
        let spec = good
            .split("spec:\n")
            .nth(1)
            .unwrap()
            .replace("name: root", "name: ../x");
        spec.lines()
            .map(|l| format!("{indent}{l}\n"))
            .collect::<String>()
    };
    let vm = format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: badvm}}\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n{}",
        template_spec("    ")
    );
    let rs = format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstanceReplicaSet\nmetadata: {{name: badrs}}\nspec:\n  replicas: 0\n  selector: {{matchLabels: {{app: x}}}}\n  template:\n    metadata: {{labels: {{app: x}}}}\n    spec:\n{}",
        template_spec("    ")
    );
    for (what, yaml) in [
        ("VirtualMachine", vm),
        ("VirtualMachineInstanceReplicaSet", rs),
    ] {
        apply_refused_in(
            kc,
            NS,
            what,
            &yaml,
            &[
                "spec.template.spec.volumes[0].name: Invalid value",
                volume_msg,
            ],
        )?;
    }
    Ok(())
}
