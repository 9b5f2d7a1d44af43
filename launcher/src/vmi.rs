//! The launcher's view of a VirtualMachineInstance: the fields it acts on, parsed from a VMI
//! manifest (YAML or JSON, `virt-launcher run`) or from the operator's VMI document
//! (`vmi.json`, `virt-launcher pod`, see docs/launcher-pod.md).
//!
//! The envelope (identity, `guestMemoryBytes`, `vcpus`, `defaultKernel`) is the operator's own
//! type, `microvirt_crds::launcher_document::LauncherDocument`. The spec's field names are the
//! CRD's (`crds/src/vmi/`, KubeVirt's names); the operator's test `pod::launcher_roundtrip`
//! parses what the operator renders with [`VmiDocument::parse`]. The launcher keeps its own
//! small serde view of the spec instead of the CRD types so that the per-VM process carries no Kubernetes
//! client code (kube, k8s-openapi, tokio): it never talks to the API server. It uses only the
//! kube-free part of `microvirt-crds` (no default features): quantities are parsed by the same
//! code as in the operator. Unknown fields are ignored, as the operator may add fields the
//! launcher does not act on.

use std::path::Path;

pub use microvirt_crds::launcher_document::{DefaultKernel, LauncherDocument, LauncherMeta};
use microvirt_crds::quantity::{parse_bytes, QuantityError};
use serde::Deserialize;

use crate::paths;

/// Default guest memory when the VMI names none (the operator's default too).
pub const DEFAULT_GUEST_MEMORY: u64 = 128 << 20;

#[derive(Debug, thiserror::Error)]
pub enum VmiError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("parsing {path} as YAML: {detail}")]
    Yaml { path: String, detail: String },
    #[error("parsing {path} as JSON: {detail}")]
    Json { path: String, detail: String },
    #[error("{path}: kind is {kind:?}, expected VirtualMachineInstance")]
    Kind { path: String, kind: String },
    #[error("{origin}: {field} {value:?} {rule}: it names files and directories of the VMI")]
    Name {
        origin: String,
        field: String,
        value: String,
        rule: &'static str,
    },
    #[error("bad quantity {field}: {source}")]
    Quantity {
        field: &'static str,
        source: QuantityError,
    },
}

/// A VMI manifest or the operator's VMI document: the envelope the operator writes
/// ([`LauncherDocument`], shared with it through `microvirt-crds`) around the launcher's own
/// [`Spec`]. Its fields are the envelope's (`doc.spec`, `doc.metadata`, `doc.vcpus`...).
#[derive(Clone, Debug, Default)]
pub struct VmiDocument(pub LauncherDocument<Spec>);

impl std::ops::Deref for VmiDocument {
    type Target = LauncherDocument<Spec>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub domain: Domain,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub networks: Vec<Network>,
    #[serde(default)]
    pub termination_grace_period_seconds: Option<i64>,
    /// The guest's host name (default: the VMI's name).
    #[serde(default)]
    pub hostname: Option<String>,
    /// KubeVirt's `startStrategy`: `Paused` keeps the vCPUs stopped until `unpause`.
    #[serde(default)]
    pub start_strategy: Option<String>,
}

impl Spec {
    /// The interfaces `run --pod-network` attaches: the declared ones, else — no interfaces, no
    /// networks, `autoattachPodInterface` not false — KubeVirt's default, one masquerade
    /// interface named `default` on the pod network (what the operator renders into a launcher
    /// pod's document; pod mode reads that and never adds one).
    pub fn pod_interfaces(&self) -> std::borrow::Cow<'_, [Interface]> {
        let d = &self.domain.devices;
        if !d.interfaces.is_empty()
            || !self.networks.is_empty()
            || d.autoattach_pod_interface == Some(false)
        {
            return std::borrow::Cow::Borrowed(&d.interfaces);
        }
        std::borrow::Cow::Owned(vec![Interface {
            name: microvirt_crds::launcher_document::DEFAULT_NETWORK_NAME.into(),
            masquerade: Some(serde_json::json!({})),
            ..Default::default()
        }])
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    #[serde(default)]
    pub cpu: Option<Cpu>,
    #[serde(default)]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub firmware: Option<Firmware>,
    #[serde(default)]
    pub devices: Devices,
    #[serde(default)]
    pub features: Option<Features>,
}

/// Platform features: only `acpi` matters (`enabled: false` builds the VM without ACPI
/// tables, so the soft stop sends Ctrl-Alt-Del); the others are accepted without effect.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Features {
    #[serde(default)]
    pub acpi: Option<FeatureState>,
}

/// A feature that is on when present, unless `enabled: false`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct FeatureState {
    #[serde(default)]
    pub enabled: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Cpu {
    #[serde(default)]
    pub cores: Option<u32>,
    #[serde(default)]
    pub sockets: Option<u32>,
    #[serde(default)]
    pub threads: Option<u32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Memory {
    #[serde(default)]
    pub guest: Option<Quantity>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub requests: Option<std::collections::BTreeMap<String, Quantity>>,
    #[serde(default)]
    pub limits: Option<std::collections::BTreeMap<String, Quantity>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    #[serde(default)]
    pub kernel_boot: Option<KernelBoot>,
    /// The machine's UUID: the cloud-init `instance-id` (no SMBIOS in a microVM).
    #[serde(default)]
    pub uuid: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    #[serde(default)]
    pub kernel_args: Option<String>,
    #[serde(default)]
    pub container: Option<KernelBootContainer>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub kernel_path: Option<String>,
    #[serde(default)]
    pub initrd_path: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Devices {
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// KubeVirt's `autoattachPodInterface` (default true): a VMI without interfaces and
    /// networks gets the pod network. The operator renders that interface into the launcher
    /// document; `run` applies it itself ([`Spec::pod_interfaces`]).
    #[serde(default, rename = "autoattachPodInterface")]
    pub autoattach_pod_interface: Option<bool>,
    /// `rng: {}`: a virtio-rng device.
    #[serde(default)]
    pub rng: Option<Rng>,
}

/// The random number generator device (no settings).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Rng {}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Disk {
    pub name: String,
    #[serde(default)]
    pub disk: Option<DiskTarget>,
    #[serde(default)]
    pub serial: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct DiskTarget {
    #[serde(default)]
    pub bus: Option<String>,
    #[serde(default)]
    pub readonly: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub masquerade: Option<serde_json::Value>,
    #[serde(default)]
    pub bridge: Option<serde_json::Value>,
    #[serde(default)]
    pub mac_address: Option<String>,
    #[serde(default)]
    pub ports: Vec<Port>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Port {
    /// `TCP` (default) or `UDP`.
    #[serde(default)]
    pub protocol: Option<String>,
    pub port: i32,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Network {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    #[serde(default)]
    pub container_disk: Option<ContainerDisk>,
    #[serde(default)]
    pub persistent_volume_claim: Option<PersistentVolumeClaim>,
    #[serde(default)]
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    #[serde(default)]
    pub empty_disk: Option<EmptyDisk>,
    #[serde(default)]
    pub container_rootfs: Option<ContainerRootfs>,
}

/// A root file system from an OCI image, with the image's entrypoint as the workload
/// (docs/oci-images.md). The overrides are a Pod container's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRootfs {
    #[serde(default)]
    pub image: Option<String>,
    /// Run mode: a local directory with the image's files in `rootfs/` and its OCI image
    /// configuration in `config.json` (optional).
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub working_dir: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ContainerDisk {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaim {
    pub claim_name: String,
    #[serde(default)]
    pub read_only: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloud {
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub user_data_base64: Option<String>,
    #[serde(default)]
    pub network_data: Option<String>,
    #[serde(default)]
    pub network_data_base64: Option<String>,
    /// A Secret with the user data (pod mode: mounted by the operator).
    #[serde(default)]
    pub secret_ref: Option<SecretRef>,
    /// A Secret with the network data (pod mode: mounted by the operator).
    #[serde(default)]
    pub network_data_secret_ref: Option<SecretRef>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SecretRef {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct EmptyDisk {
    pub capacity: Quantity,
}

/// A Kubernetes quantity as written (`128Mi`, `1G`, `1048576`); YAML may give a bare number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            U(u64),
        }
        Ok(match Raw::deserialize(d)? {
            Raw::S(s) => Quantity(s),
            Raw::U(n) => Quantity(n.to_string()),
        })
    }
}

impl Quantity {
    /// The quantity in bytes (Kubernetes' grammar; fractional bytes round up).
    pub fn bytes(&self, field: &'static str) -> Result<u64, VmiError> {
        parse_bytes(&self.0).map_err(|source| VmiError::Quantity { field, source })
    }
}

impl VmiDocument {
    /// Parses a VMI manifest; JSON when it starts with `{`, else YAML.
    pub fn parse(text: &str, origin: &str) -> Result<Self, VmiError> {
        let doc: LauncherDocument<Spec> = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| VmiError::Json {
                path: origin.to_string(),
                detail: e.to_string(),
            })?
        } else {
            serde_saphyr::from_str(text).map_err(|e| VmiError::Yaml {
                path: origin.to_string(),
                detail: e.to_string(),
            })?
        };
        if !doc.kind_is_vmi() {
            return Err(VmiError::Kind {
                path: origin.to_string(),
                kind: doc.kind.unwrap_or_default(),
            });
        }
        let doc = VmiDocument(doc);
        doc.check_names(origin)?;
        Ok(doc)
    }

    /// Names that become paths: the VMI name a DNS subdomain, disk and volume names DNS labels
    /// (as the CRD requires; checked again because the launcher also reads local YAML).
    fn check_names(&self, origin: &str) -> Result<(), VmiError> {
        let bad = |field: String, value: &str, rule| VmiError::Name {
            origin: origin.to_string(),
            field,
            value: value.to_string(),
            rule,
        };
        if let Some(n) = &self.metadata.name {
            if !paths::is_dns_subdomain(n) {
                return Err(bad(
                    "metadata.name".into(),
                    n,
                    "must be a DNS subdomain (lowercase letters, digits, '-' and '.')",
                ));
            }
        }
        for (i, d) in self.spec.domain.devices.disks.iter().enumerate() {
            if !paths::is_dns_label(&d.name) {
                return Err(bad(
                    format!("spec.domain.devices.disks[{i}].name"),
                    &d.name,
                    paths::DNS_LABEL_RULE,
                ));
            }
        }
        for (i, v) in self.spec.volumes.iter().enumerate() {
            if !paths::is_dns_label(&v.name) {
                return Err(bad(
                    format!("spec.volumes[{i}].name"),
                    &v.name,
                    paths::DNS_LABEL_RULE,
                ));
            }
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Self, VmiError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| VmiError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// The VMI's name (`vmi` when it has none).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("vmi")
    }

    /// The guest's host name (DHCP, cloud-init `local-hostname`): `spec.hostname`, else the
    /// VMI's name.
    pub fn hostname(&self) -> &str {
        self.spec
            .hostname
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| self.name())
    }

    /// cloud-init's `instance-id`: `firmware.uuid` (KubeVirt's choice: stable when a VM gives
    /// every VMI the same one), else the VMI's uid, else its name.
    pub fn instance_id(&self) -> &str {
        self.spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.uuid.as_deref())
            .filter(|u| !u.is_empty())
            .or(self.metadata.uid.as_deref())
            .unwrap_or_else(|| self.name())
    }

    /// Guest memory in bytes: the operator's `guestMemoryBytes`, else `domain.memory.guest`,
    /// else `domain.resources.requests.memory`, else 128 MiB.
    pub fn guest_memory_bytes(&self) -> Result<u64, VmiError> {
        if let Some(b) = self.guest_memory_bytes {
            return Ok(b);
        }
        let d = &self.spec.domain;
        if let Some(q) = d.memory.as_ref().and_then(|m| m.guest.as_ref()) {
            return q.bytes("domain.memory.guest");
        }
        if let Some(q) = d
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
        {
            return q.bytes("domain.resources.requests.memory");
        }
        Ok(DEFAULT_GUEST_MEMORY)
    }

    /// vCPUs: the operator's `vcpus`, else cores × sockets × threads (each default 1),
    /// saturating (a product too large for 64 bits must not wrap around to a small count);
    /// without any of the three, KubeVirt's rule (the operator's too): the CPU limit, else the
    /// CPU request, rounded up to whole CPUs, else 1.
    pub fn vcpus(&self) -> Result<u64, VmiError> {
        if let Some(v) = self.vcpus {
            return Ok(v);
        }
        let topology = self
            .spec
            .domain
            .cpu
            .as_ref()
            .filter(|c| c.cores.is_some() || c.sockets.is_some() || c.threads.is_some());
        if let Some(c) = topology {
            return Ok([c.cores, c.sockets, c.threads]
                .into_iter()
                .map(|v| u64::from(v.unwrap_or(1)))
                .fold(1, u64::saturating_mul));
        }
        let res = self.spec.domain.resources.as_ref();
        let cpu = |m: Option<&std::collections::BTreeMap<String, Quantity>>| {
            m.and_then(|m| m.get("cpu")).cloned()
        };
        if let Some(q) = cpu(res.and_then(|r| r.limits.as_ref())) {
            return Ok(q.bytes("domain.resources.limits.cpu")?.max(1));
        }
        if let Some(q) = cpu(res.and_then(|r| r.requests.as_ref())) {
            return Ok(q.bytes("domain.resources.requests.cpu")?.max(1));
        }
        Ok(1)
    }

    /// Whether the VM starts paused (`startStrategy: Paused`).
    pub fn start_paused(&self) -> bool {
        self.spec.start_strategy.as_deref() == Some("Paused")
    }

    /// Seconds the guest gets to shut down after SIGTERM (default 30, as in Kubernetes).
    pub fn grace_period_seconds(&self) -> u64 {
        self.spec
            .termination_grace_period_seconds
            .map_or(30, |s| s.max(0) as u64)
    }

    /// Whether the VM gets ACPI: on unless `domain.features.acpi.enabled` is false (KubeVirt's
    /// field; an absent `acpi` feature keeps the VMM's default, on).
    pub fn acpi(&self) -> bool {
        let f = self.spec.domain.features.as_ref();
        f.and_then(|f| f.acpi.as_ref())
            .and_then(|a| a.enabled)
            .unwrap_or(true)
    }

    pub fn kernel_boot(&self) -> Option<&KernelBoot> {
        self.spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.kernel_boot.as_ref())
    }
}

#[cfg(test)]
mod tests {

    fn spec(yaml: &str) -> Spec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_vmi_without_interfaces_gets_the_pod_network_by_default() {
        let s = spec("domain: {devices: {disks: [{name: root}]}}");
        let i = s.pod_interfaces();
        assert_eq!(i.len(), 1);
        assert_eq!(i[0].name, "default");
        assert!(i[0].masquerade.is_some() && i[0].bridge.is_none());
        // Turned off, or networks given without interfaces: no NIC.
        let off = spec("domain: {devices: {autoattachPodInterface: false}}");
        assert!(off.pod_interfaces().is_empty());
        let nets = spec("networks: [{name: default}]\ndomain: {}");
        assert!(nets.pod_interfaces().is_empty());
        // Declared interfaces are taken as they are.
        let b = spec("domain: {devices: {interfaces: [{name: x, bridge: {}}]}}");
        let i = b.pod_interfaces();
        assert_eq!((i.len(), i[0].name.as_str()), (1, "x"));
        assert!(i[0].bridge.is_some());
    }

    use super::*;

    #[test]
    fn quantities_use_the_operators_parser() {
        let q = |s: &str| Quantity(s.into()).bytes("f");
        assert_eq!(q("128Mi").unwrap(), 128 << 20);
        assert_eq!(q("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(q("1e9").unwrap(), 1_000_000_000);
        for bad in ["1K", "12Qi", " 1Mi", "-1Mi", "99999999999Ei"] {
            let e = q(bad).unwrap_err().to_string();
            assert!(e.starts_with("bad quantity f: "), "{e}");
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn acpi_feature() {
        let acpi = |features: &str| {
            VmiDocument::parse(
                &format!(
                    "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\n\
                     metadata: {{name: a}}\nspec:\n  domain: {{{features}}}\n"
                ),
                "t",
            )
            .unwrap()
            .acpi()
        };
        assert!(acpi(""));
        assert!(acpi("features: {}"));
        assert!(acpi("features: {acpi: {}}"));
        assert!(acpi("features: {acpi: {enabled: true}}"));
        assert!(!acpi("features: {acpi: {enabled: false}}"));
    }

    #[test]
    fn yaml_manifest() {
        let doc = VmiDocument::parse(
            r#"
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: demo
spec:
  terminationGracePeriodSeconds: 5
  domain:
    cpu: {cores: 2}
    memory: {guest: 64Mi}
    devices:
      disks:
        - name: root
          disk: {bus: virtio, readonly: true}
          serial: abc
  volumes:
    - name: root
      containerDisk: {image: x, path: /tmp/img}
    - name: scratch
      emptyDisk: {capacity: 1048576}
"#,
            "t",
        )
        .unwrap();
        assert_eq!(doc.name(), "demo");
        assert_eq!(doc.vcpus().unwrap(), 2);
        assert_eq!(doc.guest_memory_bytes().unwrap(), 64 << 20);
        assert_eq!(doc.grace_period_seconds(), 5);
        assert_eq!(doc.spec.volumes.len(), 2);
        let cap = &doc.spec.volumes[1].empty_disk.as_ref().unwrap().capacity;
        assert_eq!(cap.bytes("c").unwrap(), 1 << 20);
        assert_eq!(
            doc.spec.domain.devices.disks[0].serial.as_deref(),
            Some("abc")
        );
    }

    #[test]
    fn vcpus_from_cpu_limit_else_request_without_a_topology() {
        let v = |y: &str| VmiDocument::parse(y, "t").unwrap().vcpus();
        assert_eq!(v("spec: {domain: {}}").unwrap(), 1);
        assert_eq!(
            v("spec: {domain: {resources: {requests: {cpu: 1500m}}}}").unwrap(),
            2
        );
        assert_eq!(
            v("spec: {domain: {resources: {requests: {cpu: 1}, limits: {cpu: 3}}}}").unwrap(),
            3
        );
        assert_eq!(
            v("spec: {domain: {resources: {requests: {cpu: 10m}}}}").unwrap(),
            1
        );
        assert_eq!(
            v("spec: {domain: {cpu: {threads: 2}, resources: {requests: {cpu: 8}}}}").unwrap(),
            2
        );
        assert!(v("spec: {domain: {resources: {limits: {cpu: lots}}}}").is_err());
    }

    /// Found by the `vmi_document` fuzz target: 2^22 × 2^21 × 2^21 wrapped around to 0 vCPUs
    /// (a panic in debug builds).
    #[test]
    fn vcpu_product_saturates() {
        let doc = VmiDocument::parse(
            "spec: {domain: {cpu: {cores: 4194304, sockets: 2097152, threads: 2097152}}}",
            "t",
        )
        .unwrap();
        assert_eq!(doc.vcpus().unwrap(), u64::MAX);
        let doc = VmiDocument::parse("spec: {domain: {cpu: {cores: 3, threads: 2}}}", "t").unwrap();
        assert_eq!(doc.vcpus().unwrap(), 6);
    }

    #[test]
    fn operator_document_wins_over_spec() {
        let doc = VmiDocument::parse(
            r#"{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstance",
                "metadata":{"name":"a","namespace":"ns","uid":"u-1"},
                "spec":{"domain":{"cpu":{"cores":4},"memory":{"guest":"1Gi"}},"extra":1},
                "guestMemoryBytes":134217728,"vcpus":1}"#,
            "vmi.json",
        )
        .unwrap();
        assert_eq!(doc.guest_memory_bytes().unwrap(), 128 << 20);
        assert_eq!(doc.vcpus().unwrap(), 1);
        assert_eq!(doc.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(doc.instance_id(), "u-1");
        assert_eq!(doc.grace_period_seconds(), 30);
        let doc = VmiDocument::parse(
            "{\"metadata\":{\"uid\":\"u-1\"},\"spec\":{\"domain\":{\"firmware\":{\"uuid\":\"5d30\"}}}}",
            "vmi.json",
        )
        .unwrap();
        assert_eq!(doc.instance_id(), "5d30");
        assert_eq!(doc.hostname(), "vmi");
        let doc = VmiDocument::parse(
            "{\"metadata\":{\"name\":\"a\"},\"spec\":{\"hostname\":\"web-1\"}}",
            "vmi.json",
        )
        .unwrap();
        assert_eq!((doc.name(), doc.hostname()), ("a", "web-1"));
        assert_eq!(
            VmiDocument::parse("{}", "vmi.json").unwrap().instance_id(),
            "vmi"
        );
        assert!(VmiDocument::parse("{\"kind\":\"Pod\"}", "x").is_err());
        for (doc, field) in [
            (
                "{\"spec\":{\"volumes\":[{\"name\":\"../pvcs/data\",\"emptyDisk\":{\"capacity\":\"1Mi\"}}]}}",
                "spec.volumes[0].name",
            ),
            (
                "{\"spec\":{\"domain\":{\"devices\":{\"disks\":[{\"name\":\"ok\"},{\"name\":\"a/b\"}]}}}}",
                "spec.domain.devices.disks[1].name",
            ),
            ("{\"metadata\":{\"name\":\"../../etc\"}}", "metadata.name"),
        ] {
            let e = VmiDocument::parse(doc, "vmi.json").unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("must be a DNS"), "{e}");
        }
        assert!(VmiDocument::parse("spec: [", "x").is_err());
    }
}
