//! The host facts a memory snapshot depends on (CPU vendor, family, model, stepping; kernel
//! release), read on this node and published on its Node object as
//! `microvirt.io/host-facts`. The pool controller only restores a snapshot on a node that
//! still reports the facts the snapshot was taken with (the VMM checks the CPU again, in more
//! detail, when it restores).

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use microvirt_crds::pool::{HostFacts, ANNOTATION_HOST_FACTS};
use serde_json::json;

/// Why the facts could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostFactsError {
    /// Not an x86-64 host.
    #[error("host facts are only known on x86-64 hosts")]
    Arch,
    /// The kernel release could not be read.
    #[error("reading the kernel release: {0}")]
    Kernel(#[source] std::io::Error),
    /// The Node could not be annotated.
    #[error("annotating node {node}: {source}")]
    Publish {
        /// The node.
        node: String,
        /// Cause.
        source: kube::Error,
    },
}

/// Display family and model from CPUID leaf 1 EAX (Intel's and AMD's rule: the extended
/// family is added for family 0xf, the extended model is prepended for families 6 and 0xf).
pub fn family_model_stepping(eax: u32) -> (u32, u32, u32) {
    let stepping = eax & 0xf;
    let base_model = (eax >> 4) & 0xf;
    let base_family = (eax >> 8) & 0xf;
    let ext_model = (eax >> 16) & 0xf;
    let ext_family = (eax >> 20) & 0xff;
    let family = if base_family == 0xf {
        base_family + ext_family
    } else {
        base_family
    };
    let model = if base_family == 0x6 || base_family == 0xf {
        (ext_model << 4) | base_model
    } else {
        base_model
    };
    (family, model, stepping)
}

/// The 12-byte vendor string from CPUID leaf 0 (EBX, EDX, ECX).
pub fn vendor(ebx: u32, edx: u32, ecx: u32) -> String {
    let mut b = Vec::with_capacity(12);
    for r in [ebx, edx, ecx] {
        b.extend_from_slice(&r.to_le_bytes());
    }
    String::from_utf8_lossy(&b)
        .trim_matches(char::from(0))
        .trim()
        .to_string()
}

/// This host's facts.
#[cfg(target_arch = "x86_64")]
pub fn detect() -> Result<HostFacts, HostFactsError> {
    use std::arch::x86_64::__cpuid;
    // CPUID exists on every x86-64 CPU; leaves 0 and 1 are always valid.
    let (l0, l1) = (__cpuid(0), __cpuid(1));
    let (family, model, stepping) = family_model_stepping(l1.eax);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(HostFactsError::Kernel)?
        .trim()
        .to_string();
    Ok(HostFacts {
        cpu_vendor: vendor(l0.ebx, l0.edx, l0.ecx),
        cpu_family: family,
        cpu_model: model,
        cpu_stepping: stepping,
        kernel,
    })
}

/// This host's facts (not known off x86-64).
#[cfg(not(target_arch = "x86_64"))]
pub fn detect() -> Result<HostFacts, HostFactsError> {
    Err(HostFactsError::Arch)
}

/// Sets the `microvirt.io/host-facts` annotation of Node `node` (a merge patch).
pub async fn publish(client: &Client, node: &str, facts: &HostFacts) -> Result<(), HostFactsError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {ANNOTATION_HOST_FACTS: facts.to_string()}}});
    let pp = PatchParams {
        field_manager: Some(crate::agent::FIELD_MANAGER.into()),
        ..Default::default()
    };
    nodes
        .patch(node, &pp, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| HostFactsError::Publish {
            node: node.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_family_and_model() {
        // AMD EPYC (Zen 3): family 0xf + 0xa = 25, model 0x01, stepping 1.
        assert_eq!(family_model_stepping(0x00a0_0f11), (25, 1, 1));
        // Intel Skylake-SP: family 6, model 0x55, stepping 4.
        assert_eq!(family_model_stepping(0x0005_0654), (6, 0x55, 4));
        // Family 5 ignores the extended fields.
        assert_eq!(family_model_stepping(0x00ff_0543), (5, 4, 3));
        assert_eq!(
            vendor(0x6874_7541, 0x6974_6e65, 0x444d_4163),
            "AuthenticAMD"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn this_host_has_facts_that_round_trip() {
        let f = detect().unwrap();
        assert!(!f.cpu_vendor.is_empty());
        assert!(!f.kernel.is_empty());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        };
        assert_eq!(field("vendor_id"), Some(f.cpu_vendor.clone()));
        assert_eq!(field("cpu family"), Some(f.cpu_family.to_string()));
        assert_eq!(field("model\t"), Some(f.cpu_model.to_string()));
        assert_eq!(f.to_string().parse::<HostFacts>(), Ok(f));
    }
}
