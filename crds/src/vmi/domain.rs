//! The virtual hardware (`spec.domain`) but its devices: CPU, memory, features, clock, firmware
//! and kernel boot.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Devices, INSIDE_IMAGE_RULE};
use crate::refusals;

/// Virtual hardware of a VMI (also the defaults a preset carries).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.chassis)").message(refusals::CHASSIS).field_path(".chassis"),
    validation = Rule::new("!has(self.firmware) || !has(self.firmware.serial)")
        .message(refusals::FIRMWARE_SERIAL)
        .field_path(".firmware.serial")
)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// vCPU topology; the guest gets cores × sockets × threads vCPUs (without any of them:
    /// the CPU limit, else the CPU request, rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Resources of the launcher pod's compute container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// How the guest is booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Disks and network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// Machine type. Accepted, no effect: a microVM has one machine (no PCI, virtio-mmio
    /// devices), whatever the type says (`q35`, `pc`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Platform features (acpi: on or off; apic, smm: accepted; hyperv: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// Guest clock (UTC, kvm-clock; timer settings accepted without effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// SMBIOS chassis information: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub chassis: Option<serde_json::Value>,
}

/// Machine type (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Machine {
    /// KubeVirt's QEMU machine type, e.g. `q35`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub type_: Option<String>,
}

/// Platform features.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.hyperv)").message(refusals::HYPERV).field_path(".hyperv"),
    validation = Rule::new("!has(self.kvm) || !has(self.kvm.hidden) || !self.kvm.hidden")
        .message(refusals::KVM_HIDDEN)
        .field_path(".kvm.hidden")
)]
#[serde(rename_all = "camelCase")]
pub struct Features {
    /// ACPI (default on): `enabled: false` builds the VM without ACPI tables; the launcher's
    /// soft stop then sends Ctrl-Alt-Del (i8042) instead of pressing the ACPI power button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    /// Accepted, no effect: every vCPU has a local APIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apic: Option<FeatureApic>,
    /// Accepted, no effect: SMM is for firmware, and a microVM runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    /// Hyper-V enlightenments: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub hyperv: Option<serde_json::Value>,
    /// KVM's paravirtual features: accepted (the guest always sees KVM's CPUID signature and
    /// paravirtual features); `hidden: true` is refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<FeatureKvm>,
    /// Paravirtual spinlocks: accepted, no effect (the guest uses them when KVM offers them,
    /// whatever `enabled` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvspinlock: Option<FeatureState>,
}

/// KubeVirt's KVM feature.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FeatureKvm {
    /// Hide the KVM signature from the guest: only `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

/// A feature that is on when present (`enabled` defaults to true).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FeatureState {
    /// Whether the feature is on (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// The APIC feature.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureApic {
    /// Whether the feature is on (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// KubeVirt's EOI setting (no effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_interrupt: Option<bool>,
}

/// Guest clock.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.timezone)").message(refusals::TIMEZONE).field_path(".timezone"),
    validation = Rule::new("!has(self.utc) || !has(self.utc.offsetSeconds) || self.utc.offsetSeconds == 0")
        .message(refusals::UTC_OFFSET)
        .field_path(".utc.offsetSeconds")
)]
#[serde(rename_all = "camelCase")]
pub struct Clock {
    /// The guest clock is UTC (the only choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockUtc>,
    /// KubeVirt's local-time clock: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub timezone: Option<String>,
    /// Timers. Accepted without effect (kvm-clock is the clock source; the microVM's PIT is
    /// KVM's, with its own tick policy; there is no HPET, RTC or Hyper-V clock), except that
    /// kvm-clock cannot be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timers>,
}

/// UTC clock.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockUtc {
    /// Offset from UTC: only 0 (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_seconds: Option<i64>,
}

/// KubeVirt's timers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.kvm) || !has(self.kvm.present) || self.kvm.present")
        .message(refusals::KVM_CLOCK)
        .field_path(".kvm.present")
)]
pub struct Timers {
    /// HPET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpet: Option<Timer>,
    /// kvm-clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<Timer>,
    /// PIT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pit: Option<Timer>,
    /// RTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtc: Option<Timer>,
    /// Hyper-V reference clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<Timer>,
}

/// One timer's settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timer {
    /// Whether the timer is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// Tick policy (delay, catchup, merge, discard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub tick_policy: Option<String>,
    /// What the RTC tracks (guest, wall).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub track: Option<String>,
}

/// vCPU topology.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.isolateEmulatorThread) || !self.isolateEmulatorThread || (has(self.dedicatedCpuPlacement) && self.dedicatedCpuPlacement)")
        .message(refusals::ISOLATE_EMULATOR_THREAD)
        .field_path(".isolateEmulatorThread"),
    validation = Rule::new("!has(self.model) || self.model == 'host-passthrough' || self.model == 'host-model'")
        .message(refusals::CPU_MODEL)
        .field_path(".model"),
    validation = Rule::new("!has(self.features)").message(refusals::CPU_FEATURES).field_path(".features"),
    validation = Rule::new("!has(self.numa)").message(refusals::NUMA).field_path(".numa")
)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub cores: Option<u32>,
    /// Sockets (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8))]
    pub sockets: Option<u32>,
    /// Threads per core (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2))]
    pub threads: Option<u32>,
    /// Whole, exclusive CPUs for the vCPUs: the launcher pod gets a CPU request and limit of
    /// one CPU per vCPU (Guaranteed QoS), which the kubelet's static CPU manager makes
    /// exclusive. The vCPU threads are not pinned one to one inside that set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// With `dedicatedCpuPlacement`: one more whole CPU for the VMM's own threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// KubeVirt's CPU model: `host-passthrough` and `host-model` are accepted and mean what
    /// the guest always gets, the host CPU's features as KVM reports them (KVM's supported
    /// CPUID); a named model is refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub model: Option<String>,
    /// CPU features to require or disable: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub features: Option<Vec<serde_json::Value>>,
    /// Guest NUMA topology: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub numa: Option<serde_json::Value>,
}

/// Guest memory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "!has(self.guest) || (isQuantity(string(self.guest)) && quantity(string(self.guest)).compareTo(quantity('16Mi')) >= 0 && quantity(string(self.guest)).compareTo(quantity('1Ei')) <= 0)"
    )
    .message("domain.memory.guest must be a quantity from 16Mi to 1Ei, e.g. 128Mi"),
    validation = Rule::new("!has(self.hugepages)").message(refusals::HUGEPAGES).field_path(".hugepages")
)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Memory the guest sees, e.g. `128Mi` (at least 16Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity)]
    pub guest: Option<Quantity>,
    /// Huge pages: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub hugepages: Option<serde_json::Value>,
}

/// Resource requests and limits (KubeVirt's `domain.resources`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "!has(self.requests) || !('memory' in self.requests) || (isQuantity(string(self.requests['memory'])) && quantity(string(self.requests['memory'])).compareTo(quantity('16Mi')) >= 0 && quantity(string(self.requests['memory'])).compareTo(quantity('1Ei')) <= 0)"
    )
    .message("domain.resources.requests.memory must be a quantity from 16Mi to 1Ei")
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Requests, e.g. `memory: 128Mi`. A memory request is the guest memory when
    /// `domain.memory.guest` is unset; a CPU request (without a CPU limit) is the vCPU count,
    /// rounded up, when `domain.cpu` gives no cores, sockets or threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity_map)]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Limits. A CPU limit is the vCPU count, rounded up, when `domain.cpu` gives no cores,
    /// sockets or threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity_map)]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// Boot firmware.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// Direct kernel boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    /// BIOS or EFI. Accepted as microvirt's one boot path: no firmware runs; the guest boots
    /// the kernel of `kernelBoot` (or the operator's default kernel) directly. Secure Boot is
    /// refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    /// The machine's UUID. A microVM has no SMBIOS; it is the guest's cloud-init
    /// `instance-id` (else the VMI's uid), as in KubeVirt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uuid: Option<String>,
    /// The SMBIOS serial number: refused (a validation rule on the domain says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub serial: Option<String>,
}

/// BIOS or EFI (both: boot the kernel directly).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!(has(self.bios) && has(self.efi))").message(refusals::BOOTLOADER_BOTH),
    validation = Rule::new("!has(self.efi) || (has(self.efi.secureBoot) && !self.efi.secureBoot)")
        .message(refusals::SECURE_BOOT)
        .field_path(".efi")
)]
pub struct Bootloader {
    /// BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
    /// EFI (only with `secureBoot: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efi: Option<Efi>,
}

/// BIOS settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bios {
    /// BIOS output on the serial console (no effect: the kernel's console is the serial one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_serial: Option<bool>,
}

/// EFI settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Efi {
    /// Secure Boot; KubeVirt's default is true, so microvirt needs an explicit `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Persistent EFI variables (no effect: there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// Direct kernel boot: a kernel (and optional initrd) taken from a container image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    /// Kernel command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub kernel_args: Option<String>,
    /// Where the kernel and initrd come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
}

/// A container image holding the guest kernel.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("has(self.kernelPath) || has(self.initrdPath)")
        .message("firmware.kernelBoot.container needs kernelPath (and optionally initrdPath)")
)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    /// Image reference.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Path of the kernel inside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("kernelPath must stay inside the image: no '..' component"))]
    pub kernel_path: Option<String>,
    /// Path of the initrd inside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("initrdPath must stay inside the image: no '..' component"))]
    pub initrd_path: Option<String>,
    /// Image pull policy (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// A Secret in the VMI's namespace to pull the image with (it joins the launcher pod's
    /// `imagePullSecrets`, as in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_pull_secret: Option<String>,
}

/// Image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when absent.
    IfNotPresent,
    /// Never pull.
    Never,
}
