//! `VirtualMachineInstance` (short name `vmi`): one running microVM.
//!
//! Field names follow KubeVirt's `kubevirt.io/v1` API so that a KubeVirt manifest works after its
//! `apiVersion` is changed to `microvirt.io/v1alpha1` (for the subset of fields microvirt supports).

mod devices;
mod domain;
mod network;
mod probe;
mod spec;
mod status;
#[cfg(test)]
mod tests;
mod volumes;

pub use devices::*;
pub use domain::*;
pub use network::*;
pub use probe::*;
pub use spec::*;
pub use status::*;
pub use volumes::*;

/// Label key that the operator puts on launcher pods: the owning VMI's name.
pub const LABEL_VMI_NAME: &str = "microvirt.io/vmi";
/// Finalizer the operator puts on every VMI (created by it or by a user): the launcher pod is
/// stopped before the VMI goes away.
pub const FINALIZER_LAUNCHER_POD: &str = "microvirt.io/launcher-pod";
/// Annotation key on launcher pods carrying the owning VMI's uid.
pub const ANNOTATION_VMI_UID: &str = "microvirt.io/vmi-uid";
/// Annotation on a VMI listing the presets (namespace/name, comma separated) applied to it.
pub const ANNOTATION_PRESETS_APPLIED: &str = "microvirt.io/presets-applied";
/// Annotation on launcher pods: milliseconds from VMM start to guest booted (set by the node
/// agent `virt-handler` while the pod runs; read by the operator into `status.bootTimeMs`).
pub const ANNOTATION_BOOT_TIME_MS: &str = "microvirt.io/boot-time-ms";
/// The launcher pod's control annotations (operator → node agent → launcher); their values are
/// [`crate::control::ControlRequest`] and [`crate::control::ControlResult`].
pub use crate::control::{ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT};
/// Name of the interface and the network a VMI gets when it declares neither (KubeVirt's
/// `autoattachPodInterface`); kube-free, for `virt-launcher run` too.
pub use crate::launcher_document::DEFAULT_NETWORK_NAME;
/// VMI condition reported by the node agent (the launcher's `paused` state).
pub const CONDITION_PAUSED: &str = "Paused";
/// VMI conditions whose owner is the node agent (field manager `virt-handler`); the operator
/// leaves them alone while the VMI runs.
pub const NODE_AGENT_CONDITIONS: &[&str] = &[CONDITION_PAUSED];
/// Pod condition, and the launcher pod's only readiness gate: `True` while the launcher's VM
/// runs (for a VM pool's unclaimed warm member: restored and waiting paused), `False` once it
/// is paused or stopped. Written by the node agent `virt-handler` on `pods/status` from the
/// launcher's `watch` stream; absent (so the pod is not Ready) until the agent has seen the
/// launcher. The kubelet's pod Ready, and so the VMI's Ready, follow it (KubeVirt's Ready: the
/// VM runs in a Ready launcher pod; a paused VMI is not Ready).
pub const POD_CONDITION_VM_RUNNING: &str = "microvirt.io/vm-running";
/// Pod condition, informational (not a readiness gate): `True` once the guest signalled boot
/// through the boot timer (the shipped guest images do; a stock guest never does). Its
/// `lastTransitionTime` is when the node agent saw the boot; a VM pool's builder is snapshotted
/// `afterBootSeconds` after it. Written by the node agent, never set back to `False`.
pub const POD_CONDITION_GUEST_BOOTED: &str = "microvirt.io/guest-booted";
/// Reasons of the two pod conditions above.
pub const REASON_VM_RUNNING: &str = "VMRunning";
pub const REASON_VM_PAUSED: &str = "VMPaused";
pub const REASON_VM_STARTING: &str = "VMStarting";
pub const REASON_VM_STOPPED: &str = "VMStopped";
pub const REASON_WARM_MEMBER: &str = "RestoredPaused";
pub const REASON_GUEST_BOOTED: &str = "GuestBooted";

/// CEL: the string is a DNS label (RFC 1123, as Kubernetes names; length checked separately).
pub const DNS_LABEL_RULE: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
/// CEL: the string is a relative path inside an image (no `..` component).
pub const INSIDE_IMAGE_RULE: &str = "!self.matches('(^|/)[.][.](/|$)')";
