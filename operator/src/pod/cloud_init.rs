//! The Secret with a VMI's inline cloud-init data, and the launcher document's spec without
//! that data (the pod mounts it from the Secret: see `volumes`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use microvirt_crds::vmi::{VirtualMachineInstance, LABEL_VMI_NAME};

use super::{identity, pod_name, PodError, LABEL_MANAGED_BY};

/// Where a cloudInitNoCloud volume's data is mounted: `<dir>/<volume>/userdata/` and
/// `<dir>/<volume>/networkdata/` (files `userdata`/`userData`, `networkdata`/`networkData`).
pub const CLOUD_INIT_DIR: &str = "/var/run/microvirt/cloud-init";

/// Name of the Secret with a VMI's inline cloud-init data.
pub fn cloud_init_secret_name(vmi_name: &str) -> String {
    format!("{}-cloud-init", pod_name(vmi_name))
}

/// Keys of the inline cloud-init data in that Secret.
pub(super) fn user_data_key(volume: &str) -> String {
    format!("{volume}.userdata")
}
pub(super) fn network_data_key(volume: &str) -> String {
    format!("{volume}.networkdata")
}

/// The Secret holding the inline cloud-init data (`userData`, `userDataBase64`,
/// `networkData`) of the VMI's cloudInitNoCloud volumes, owned by the VMI; `None` when there is
/// none. User data often holds secrets: it must not sit in a pod annotation that anyone who may
/// read pods can see.
pub fn cloud_init_secret(vmi: &VirtualMachineInstance) -> Result<Option<Secret>, PodError> {
    let (name, namespace, owner) = identity(vmi)?;
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    for v in &vmi.spec.volumes {
        let Some(ci) = &v.cloud_init_no_cloud else {
            continue;
        };
        if let Some(u) = &ci.user_data {
            data.insert(user_data_key(&v.name), ByteString(u.as_bytes().to_vec()));
        }
        // ByteString's JSON form is base64: this decodes and checks it.
        let decode = |field: &'static str, b: &str| -> Result<ByteString, PodError> {
            serde_json::from_value(serde_json::Value::String(b.trim().to_string())).map_err(|_| {
                PodError::Base64 {
                    volume: v.name.clone(),
                    field,
                }
            })
        };
        if let Some(b) = &ci.user_data_base64 {
            data.insert(user_data_key(&v.name), decode("userDataBase64", b)?);
        }
        if let Some(n) = &ci.network_data {
            data.insert(network_data_key(&v.name), ByteString(n.as_bytes().to_vec()));
        }
        if let Some(b) = &ci.network_data_base64 {
            data.insert(network_data_key(&v.name), decode("networkDataBase64", b)?);
        }
    }
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(Secret {
        metadata: ObjectMeta {
            name: Some(cloud_init_secret_name(name)),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (LABEL_VMI_NAME.to_string(), name.to_string()),
                (
                    LABEL_MANAGED_BY.to_string(),
                    crate::config::FIELD_MANAGER.to_string(),
                ),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }))
}

/// The VMI spec as the launcher document carries it: inline cloud-init data removed (it is in
/// the Secret of [`cloud_init_secret`], mounted into the pod).
pub(super) fn spec_without_cloud_init_data(
    spec: &microvirt_crds::VirtualMachineInstanceSpec,
) -> microvirt_crds::VirtualMachineInstanceSpec {
    let mut spec = spec.clone();
    for v in &mut spec.volumes {
        if let Some(ci) = v.cloud_init_no_cloud.as_mut() {
            ci.user_data = None;
            ci.user_data_base64 = None;
            ci.network_data = None;
            ci.network_data_base64 = None;
        }
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes};
    use super::*;
    use crate::config::Config;
    use microvirt_crds::vmi::Volume as VmiVolume;

    #[test]
    fn inline_cloud_init_data_goes_to_a_secret_not_the_pod() {
        use microvirt_crds::vmi::{CloudInitNoCloudSource, SecretRef};
        let mut sp = spec(Some("64Mi"), None);
        sp.volumes.push(VmiVolume {
            name: "seed".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                user_data: Some("#cloud-config\npassword: hunter2\n".into()),
                network_data: Some("version: 2\n".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        sp.volumes.push(VmiVolume {
            name: "other".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                secret_ref: Some(SecretRef {
                    name: "my-user-data".into(),
                }),
                user_data: None,
                ..Default::default()
            }),
            ..Default::default()
        });
        let v = vmi(sp);
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let pod_json = serde_json::to_string(&pod).unwrap();
        assert!(!pod_json.contains("hunter2"), "{pod_json}");
        assert!(!pod_json.contains("version: 2"), "{pod_json}");
        let secret = cloud_init_secret(&v).unwrap().expect("a secret");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("virt-launcher-vm1-cloud-init")
        );
        assert_eq!(
            secret.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let data = secret.data.as_ref().unwrap();
        assert_eq!(
            data["seed.userdata"].0,
            b"#cloud-config\npassword: hunter2\n"
        );
        assert_eq!(data["seed.networkdata"].0, b"version: 2\n");
        assert_eq!(data.len(), 2, "the referenced Secret is not copied");
        let vols = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        let secret_of = |n: &str| {
            vols.iter()
                .find(|v| v.name == n)
                .and_then(|v| v.secret.clone())
                .unwrap_or_else(|| panic!("no secret volume {n}"))
        };
        let s = secret_of("vol-2-userdata");
        assert_eq!(
            s.secret_name.as_deref(),
            Some("virt-launcher-vm1-cloud-init")
        );
        assert_eq!(s.items.as_ref().unwrap()[0].key, "seed.userdata");
        assert_eq!(s.items.as_ref().unwrap()[0].path, "userdata");
        assert_eq!(
            secret_of("vol-2-networkdata").items.as_ref().unwrap()[0].key,
            "seed.networkdata"
        );
        let s = secret_of("vol-3-userdata");
        assert_eq!(s.secret_name.as_deref(), Some("my-user-data"));
        assert!(s.items.is_none());
        assert!(!vols.iter().any(|v| v.name == "vol-3-networkdata"));
        let mounts: Vec<(String, Option<bool>)> = container(&pod)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.mount_path.clone(), m.read_only))
            .collect();
        for p in [
            "/var/run/microvirt/cloud-init/seed/userdata",
            "/var/run/microvirt/cloud-init/seed/networkdata",
            "/var/run/microvirt/cloud-init/other/userdata",
        ] {
            assert!(
                mounts.contains(&(p.to_string(), Some(true))),
                "{p}: {mounts:?}"
            );
        }
        // base64 user data is decoded into the Secret; garbage is an error.
        let mut sp = spec(Some("64Mi"), None);
        sp.volumes.push(VmiVolume {
            name: "b64".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                user_data_base64: Some("aGk=".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let s = cloud_init_secret(&vmi(sp.clone())).unwrap().unwrap();
        assert_eq!(s.data.unwrap()["b64.userdata"].0, b"hi");
        sp.volumes[2]
            .cloud_init_no_cloud
            .as_mut()
            .unwrap()
            .user_data_base64 = Some("not base64!".into());
        assert!(matches!(
            cloud_init_secret(&vmi(sp.clone())),
            Err(PodError::Base64 {
                field: "userDataBase64",
                ..
            })
        ));
        // So is base64 network data.
        let ci = sp.volumes[2].cloud_init_no_cloud.as_mut().unwrap();
        ci.user_data_base64 = None;
        ci.network_data_base64 = Some("dmVyc2lvbjogMgo=".into());
        let s = cloud_init_secret(&vmi(sp.clone())).unwrap().unwrap();
        assert_eq!(s.data.unwrap()["b64.networkdata"].0, b"version: 2\n");
        let pod = desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap();
        let pod_json = serde_json::to_string(&pod).unwrap();
        assert!(!pod_json.contains("dmVyc2lvbjogMgo="), "{pod_json}");
        assert!(pod_json.contains("b64.networkdata"), "{pod_json}");
        sp.volumes[2]
            .cloud_init_no_cloud
            .as_mut()
            .unwrap()
            .network_data_base64 = Some("%%%".into());
        assert!(matches!(
            cloud_init_secret(&vmi(sp)),
            Err(PodError::Base64 {
                field: "networkDataBase64",
                ..
            })
        ));
        assert!(cloud_init_secret(&vmi(spec(None, None))).unwrap().is_none());
    }
}
