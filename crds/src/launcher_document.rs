//! The launcher document: the JSON the operator writes into a launcher pod's
//! [`ANNOTATION_VMI_SPEC`] annotation, which the pod sees as the file
//! `DOCUMENT_DIR/DOCUMENT_FILE` (`/var/run/microvirt/vmi/vmi.json`, named by the env
//! [`DOCUMENT_FILE_ENV`]), and `virt-launcher pod` reads (docs/launcher-pod.md, "The VMI
//! document").
//!
//! One envelope, [`LauncherDocument`], generic over the spec type: the operator renders
//! `LauncherDocument<&VirtualMachineInstanceSpec>` (the CRD's spec, with its defaults), the
//! launcher parses `LauncherDocument<its own lean spec>`, so the envelope's field names exist
//! once. The spec's field names are the CRD's on both sides; the operator's test
//! `pod::launcher_roundtrip` parses what the operator renders with the launcher's parser.
//!
//! Every envelope field is optional when read: the launcher reads plain VMI manifests with the
//! same type (`virt-launcher run`), which carry no `guestMemoryBytes`, `vcpus` or
//! `defaultKernel`; the operator always writes them all ([`LauncherDocument::new`]). Unknown
//! fields are ignored, so the operator may add fields an older launcher does not act on.
//! Fields the spec type requires (a disk's `name`) are errors naming the field when missing.
//!
//! The types derive serde's traits with feature `serde`; the constants need no feature.

/// The document's `apiVersion`.
pub const API_VERSION: &str = "microvirt.io/v1alpha1";
/// The document's `kind`.
pub const KIND: &str = "VirtualMachineInstance";
/// The launcher pod's annotation carrying the document (the pod mounts it through the
/// downward API).
pub const ANNOTATION_VMI_SPEC: &str = "microvirt.io/vmi-spec";
/// The directory the launcher pod mounts the document in.
pub const DOCUMENT_DIR: &str = "/var/run/microvirt/vmi";
/// The document's file name inside [`DOCUMENT_DIR`].
pub const DOCUMENT_FILE: &str = "vmi.json";
/// The launcher's environment variable naming the document's path.
pub const DOCUMENT_FILE_ENV: &str = "MICROVIRT_VMI_FILE";
/// Name of the interface and the network a VMI gets when it declares neither (KubeVirt's
/// `autoattachPodInterface`): the operator renders them into the document; `virt-launcher run`
/// adds them itself.
pub const DEFAULT_NETWORK_NAME: &str = "default";

/// The launcher document: the VMI's identity and spec, and the operator's defaulting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "camelCase")
)]
pub struct LauncherDocument<S> {
    /// [`API_VERSION`] (not checked when read).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub api_version: Option<String>,
    /// [`KIND`]; a reader refuses another ([`LauncherDocument::kind_is_vmi`]).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub kind: Option<String>,
    /// The VMI's name, namespace and uid.
    #[cfg_attr(feature = "serde", serde(default))]
    pub metadata: LauncherMeta,
    /// The VMI spec (presets and the operator's defaults applied).
    #[cfg_attr(feature = "serde", serde(default))]
    pub spec: S,
    /// Guest memory in bytes after the operator's defaulting.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub guest_memory_bytes: Option<u64>,
    /// vCPU count after the operator's defaulting.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub vcpus: Option<u64>,
    /// Present when `spec.domain.firmware.kernelBoot.container` is the operator's default
    /// kernel image, filled in because the VMI names none: the launcher boots the boot disk's
    /// own kernel when it has one, and this one only as a fallback.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub default_kernel: Option<DefaultKernel>,
}

/// The VMI's identity inside [`LauncherDocument`] (`metadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LauncherMeta {
    /// VMI name.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub name: Option<String>,
    /// VMI namespace.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub namespace: Option<String>,
    /// VMI uid.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub uid: Option<String>,
}

/// The document's `defaultKernel`: the operator's default kernel image is a fallback.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "camelCase")
)]
pub struct DefaultKernel {
    /// The operator's `--default-kernel-args` (`root=/dev/vda rw`): the default kernel's
    /// command line when the VMI gives no `kernelArgs` (never written into the spec); its
    /// `root=` is replaced on a partitioned boot disk.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub kernel_args: Option<String>,
}

impl LauncherMeta {
    /// The identity of a VMI read from the API server (all three known).
    pub fn new(name: &str, namespace: &str, uid: &str) -> Self {
        Self {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            uid: Some(uid.to_string()),
        }
    }
}

impl<S> LauncherDocument<S> {
    /// The document as the operator writes it: [`API_VERSION`], [`KIND`] and every field set
    /// (`default_kernel` when the operator filled in its default kernel image).
    pub fn new(
        metadata: LauncherMeta,
        spec: S,
        guest_memory_bytes: u64,
        vcpus: u64,
        default_kernel: Option<DefaultKernel>,
    ) -> Self {
        Self {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            metadata,
            spec,
            guest_memory_bytes: Some(guest_memory_bytes),
            vcpus: Some(vcpus),
            default_kernel,
        }
    }

    /// Whether `kind` is [`KIND`] or absent (a manifest may leave it out); a reader refuses
    /// any other kind.
    pub fn kind_is_vmi(&self) -> bool {
        self.kind.as_deref().is_none_or(|k| k == KIND)
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    /// A stand-in for a spec type: one required field, one optional.
    #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_name: Option<String>,
    }

    fn spec(name: &str) -> Spec {
        Spec {
            name: name.into(),
            host_name: Some("h".into()),
        }
    }

    fn operator_document() -> LauncherDocument<Spec> {
        LauncherDocument::new(
            LauncherMeta::new("vm1", "ns", "uid-1"),
            spec("root"),
            128 << 20,
            2,
            Some(DefaultKernel {
                kernel_args: Some("root=/dev/vda rw".into()),
            }),
        )
    }

    #[test]
    fn the_operators_document_has_the_wire_format() {
        let json = serde_json::to_string(&operator_document()).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstance","#,
                r#""metadata":{"name":"vm1","namespace":"ns","uid":"uid-1"},"#,
                r#""spec":{"name":"root","hostName":"h"},"guestMemoryBytes":134217728,"#,
                r#""vcpus":2,"defaultKernel":{"kernelArgs":"root=/dev/vda rw"}}"#
            )
        );
        // Without a default kernel the field is left out, not null.
        let mut doc = operator_document();
        doc.default_kernel = None;
        let json = serde_json::to_string(&doc).unwrap();
        assert!(json.ends_with(r#""vcpus":2}"#), "{json}");
        // A borrowed spec renders the same as an owned one (the operator borrows its spec).
        let owned = operator_document();
        let borrowed = LauncherDocument::new(
            owned.metadata.clone(),
            &owned.spec,
            128 << 20,
            2,
            owned.default_kernel.clone(),
        );
        assert_eq!(
            serde_json::to_string(&borrowed).unwrap(),
            serde_json::to_string(&owned).unwrap()
        );
    }

    #[test]
    fn round_trip() {
        let doc = operator_document();
        let back: LauncherDocument<Spec> =
            serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!(back, doc);
        assert!(back.kind_is_vmi());
        let bare = LauncherDocument {
            spec: spec("x"),
            ..Default::default()
        };
        let back: LauncherDocument<Spec> =
            serde_json::from_str(&serde_json::to_string(&bare).unwrap()).unwrap();
        assert_eq!(back, bare);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let doc: LauncherDocument<Spec> = serde_json::from_str(
            r#"{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstance",
                "metadata":{"name":"a","labels":{"x":"y"},"uid":"u"},
                "spec":{"name":"root","extra":[1,2]},
                "status":{},"guestMemoryBytes":1,"vcpus":1,"futureField":true,
                "defaultKernel":{"kernelArgs":"quiet","initrd":"x"}}"#,
        )
        .unwrap();
        assert_eq!(
            doc.metadata,
            LauncherMeta {
                name: Some("a".into()),
                namespace: None,
                uid: Some("u".into()),
            }
        );
        assert_eq!(doc.spec.name, "root");
        assert_eq!((doc.guest_memory_bytes, doc.vcpus), (Some(1), Some(1)));
        assert_eq!(
            doc.default_kernel.and_then(|k| k.kernel_args).as_deref(),
            Some("quiet")
        );
    }

    #[test]
    fn a_manifest_leaves_the_operators_fields_out() {
        // A plain VMI manifest (`virt-launcher run`): no operator fields, no kind even.
        let doc: LauncherDocument<Spec> =
            serde_json::from_str(r#"{"spec":{"name":"root"}}"#).unwrap();
        assert_eq!(doc.api_version, None);
        assert!(doc.kind_is_vmi());
        assert_eq!(doc.metadata, LauncherMeta::default());
        assert_eq!(
            (doc.guest_memory_bytes, doc.vcpus, doc.default_kernel),
            (None, None, None)
        );
        // No spec at all: the spec type's default.
        let doc: LauncherDocument<Spec> = serde_json::from_str("{}").unwrap();
        assert_eq!(doc.spec, Spec::default());
        let pod: LauncherDocument<Spec> = serde_json::from_str(r#"{"kind":"Pod"}"#).unwrap();
        assert!(!pod.kind_is_vmi());
    }

    #[test]
    fn bad_documents_give_errors_naming_the_problem() {
        let err = |text: &str| {
            serde_json::from_str::<LauncherDocument<Spec>>(text)
                .unwrap_err()
                .to_string()
        };
        // A field the spec type requires.
        let e = err(r#"{"spec":{"hostName":"h"}}"#);
        assert!(e.contains("missing field `name`"), "{e}");
        // Envelope fields of the wrong type.
        let e = err(r#"{"guestMemoryBytes":"128Mi"}"#);
        assert!(
            e.contains("invalid type: string \"128Mi\", expected u64"),
            "{e}"
        );
        let e = err(r#"{"vcpus":-1}"#);
        assert!(
            e.contains("invalid value: integer `-1`, expected u64"),
            "{e}"
        );
        let e = err(r#"{"metadata":{"name":7}}"#);
        assert!(
            e.contains("invalid type: integer `7`, expected a string"),
            "{e}"
        );
        let e = err(r#"{"defaultKernel":"root=/dev/vda"}"#);
        assert!(e.contains("expected struct DefaultKernel"), "{e}");
    }

    #[test]
    fn the_document_path_is_the_pods_mount() {
        assert_eq!(
            format!("{DOCUMENT_DIR}/{DOCUMENT_FILE}"),
            "/var/run/microvirt/vmi/vmi.json"
        );
    }
}
