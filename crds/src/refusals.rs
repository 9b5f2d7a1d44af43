//! The KubeVirt fields microvirt's CRDs accept in their schema only to refuse them, with a
//! message that names the field and says why (instead of `unknown field`, or the field being
//! pruned and silently dropped for clients that do not ask for strict validation). Each message
//! is a CEL rule's `message`; the API server puts the field's path in front of it. The table of
//! every KubeVirt field and what microvirt does with it is `docs/kubevirt-compatibility.md`.

/// `interfaces[].sriov`.
pub const SRIOV: &str = "sriov interfaces are not supported by microvirt: a microVM has no PCI bus to pass a virtual function through; use masquerade or bridge on the pod network";
/// `interfaces[].model` other than `virtio`.
pub const INTERFACE_MODEL: &str =
    "interface model: microvirt emulates only virtio-net; leave model unset or set it to virtio";
/// `networks[].multus`.
pub const MULTUS: &str = "multus networks are not supported by microvirt: the guest has one NIC, on the pod network (pod: {})";
/// `devices.gpus`.
pub const GPUS: &str =
    "gpus are not supported by microvirt: a microVM has no PCI bus to pass a GPU through";
/// `devices.hostDevices`.
pub const HOST_DEVICES: &str = "hostDevices are not supported by microvirt: a microVM has no PCI or USB bus to pass a host device through";
/// `devices.tpm`.
pub const TPM: &str = "tpm is not supported by microvirt: a microVM has no TPM device";
/// `devices.autoattachVSOCK: true`.
pub const VSOCK: &str =
    "autoattachVSOCK: true is not supported by microvirt: a microVM has no vsock device";
/// `features.hyperv`.
pub const HYPERV: &str = "hyperv features are not supported by microvirt: it boots Linux kernels directly and cannot run Windows guests";
/// `firmware.bootloader.efi` without `secureBoot: false`.
pub const SECURE_BOOT: &str = "efi.secureBoot: Secure Boot is not supported by microvirt, which boots the guest kernel directly, without UEFI firmware; KubeVirt turns Secure Boot on when efi is given, so set efi.secureBoot: false";
/// `firmware.bootloader` with both `bios` and `efi`.
pub const BOOTLOADER_BOTH: &str = "bootloader takes bios or efi, not both";
/// `clock.timezone`.
pub const TIMEZONE: &str = "clock.timezone is not supported by microvirt: the guest clock (kvm-clock) is UTC; use clock.utc: {}";
/// `clock.utc.offsetSeconds` other than 0.
pub const UTC_OFFSET: &str = "clock.utc.offsetSeconds is not supported by microvirt: the guest clock (kvm-clock) follows the host's";
/// `clock.timer.kvm.present: false`.
pub const KVM_CLOCK: &str = "clock.timer.kvm.present: false is not supported by microvirt: kvm-clock is the guest's clock source";
/// `cpu.isolateEmulatorThread` without `dedicatedCpuPlacement`.
pub const ISOLATE_EMULATOR_THREAD: &str =
    "cpu.isolateEmulatorThread needs cpu.dedicatedCpuPlacement: true";
/// `volumes[].dataVolume`.
pub const DATA_VOLUME: &str = "dataVolume volumes are not supported by microvirt: DataVolumes need CDI; put a raw disk.img into a PersistentVolumeClaim and use a persistentVolumeClaim volume";
/// `volumes[].hostDisk`.
pub const HOST_DISK: &str = "hostDisk volumes are not supported by microvirt: use a persistentVolumeClaim (a local or hostPath PersistentVolume holding a raw disk.img)";
/// `spec.resourceClaims`.
pub const RESOURCE_CLAIMS: &str = "resourceClaims are not supported by microvirt: a microVM cannot attach devices allocated by dynamic resource allocation";
/// `spec.startStrategy` in the template of a VM pool with warm members.
pub const POOL_WARM_START_STRATEGY: &str = "startStrategy: Paused is not supported with spec.warm: warm members are restored from a snapshot of a booted guest and start running when claimed";
/// `readinessProbe.exec` / `livenessProbe.exec`.
pub const PROBE_EXEC: &str = "exec probes need a guest agent, which microvirt does not have: use a tcpSocket or httpGet probe against a service in the guest";
/// `readinessProbe.guestAgentPing` / `livenessProbe.guestAgentPing`.
pub const PROBE_GUEST_AGENT_PING: &str = "guestAgentPing probes need a guest agent, which microvirt does not have: use a tcpSocket or httpGet probe against a service in the guest";
/// A probe with no handler.
pub const PROBE_NO_HANDLER: &str = "a probe needs a handler: tcpSocket or httpGet";
/// A probe with both tcpSocket and httpGet.
pub const PROBE_TWO_HANDLERS: &str = "a probe takes one handler: tcpSocket or httpGet, not both";
/// `readinessProbe`/`livenessProbe` on a VMI without a NIC on the pod network.
pub const PROBE_WITHOUT_NIC: &str = "readinessProbe and livenessProbe need a NIC on the pod network (the kubelet probes the pod IP): this VMI has no interfaces (autoattachPodInterface: false, or networks without interfaces)";
/// A probe whose port a masquerade interface with `ports` does not forward to the guest.
pub const PROBE_PORT_NOT_FORWARDED: &str = "the probe's port is not among the masquerade interface's ports, the only ones forwarded to the guest: the kubelet's probe of the pod IP would never reach it; add the port (protocol TCP) to ports";
/// `livenessProbe.successThreshold` other than 1.
pub const LIVENESS_SUCCESS_THRESHOLD: &str =
    "livenessProbe.successThreshold must be 1 (the kubelet's rule for liveness probes)";
/// A VM pool template with a probe and warm members.
pub const POOL_WARM_PROBES: &str = "readinessProbe and livenessProbe are not supported with spec.warm: a warm member waits paused, so its probes would fail (not Ready, or stopped by the kubelet) before it is claimed";
/// `spec.accessCredentials`.
pub const ACCESS_CREDENTIALS: &str = "accessCredentials are not supported by microvirt yet: put the SSH key into the cloudInitNoCloud user data (ssh_authorized_keys)";
/// VirtualMachine `spec.instancetype.kind` that names no instancetype kind.
pub const INSTANCETYPE_KIND: &str = "instancetype.kind must be VirtualMachineInstancetype or VirtualMachineClusterInstancetype (the default)";
/// VirtualMachine `spec.preference.kind` that names no preference kind.
pub const PREFERENCE_KIND: &str = "preference.kind must be VirtualMachinePreference or VirtualMachineClusterPreference (the default)";
/// `spec.instancetype.inferFromVolume` / `spec.preference.inferFromVolume`.
pub const INFER_FROM_VOLUME: &str = "inferFromVolume is not supported by microvirt: it reads the instancetype or preference from a volume's labels (a DataVolume or DataSource of CDI); name it";
/// VirtualMachinePool `virtualMachineTemplate.spec.instancetype`.
pub const POOL_INSTANCETYPE: &str = "instancetype in a pool's virtualMachineTemplate is not supported by microvirt: a pool's members are VMIs, not VirtualMachines; give the size in the template's domain (cpu, memory.guest)";
/// VirtualMachinePool `virtualMachineTemplate.spec.preference`.
pub const POOL_PREFERENCE: &str = "preference in a pool's virtualMachineTemplate is not supported by microvirt: a pool's members are VMIs, not VirtualMachines; give the devices in the template's domain";
/// Preference `cpu.preferredCPUTopology` other than sockets, cores, threads, any.
pub const PREFERRED_CPU_TOPOLOGY: &str = "cpu.preferredCPUTopology must be sockets, cores, threads or any (or KubeVirt's older preferSockets, preferCores, preferThreads, preferAny): spread is not supported by microvirt";
/// Preference `devices.preferredDiskBus` other than virtio.
pub const PREFERRED_DISK_BUS: &str =
    "devices.preferredDiskBus: microvirt has only virtio-blk; leave it unset or set it to virtio";
/// Preference `devices.preferredInterfaceModel` other than virtio.
pub const PREFERRED_INTERFACE_MODEL: &str = "devices.preferredInterfaceModel: microvirt emulates only virtio-net; leave it unset or set it to virtio";
/// Preference `devices.preferredTPM`.
pub const PREFERRED_TPM: &str =
    "devices.preferredTPM is not supported by microvirt: a microVM has no TPM device";
/// Preference `clock`.
pub const PREFERRED_CLOCK: &str =
    "clock preferences are not supported by microvirt: the guest clock is kvm-clock, in UTC";
/// Preference `features`.
pub const PREFERRED_FEATURES: &str = "features preferences are not supported by microvirt: a microVM has no ACPI, SMM or Hyper-V features to prefer";
/// Preference `firmware`.
pub const PREFERRED_FIRMWARE: &str = "firmware preferences are not supported by microvirt: it boots the guest kernel directly, without BIOS or UEFI firmware";
/// VirtualMachine `spec.dataVolumeTemplates`.
pub const DATA_VOLUME_TEMPLATES: &str = "dataVolumeTemplates are not supported by microvirt: DataVolumes need CDI; create a PersistentVolumeClaim holding a raw disk.img and use a persistentVolumeClaim volume";
/// VirtualMachinePool with both `spec.template` and `spec.virtualMachineTemplate`.
pub const POOL_BOTH_TEMPLATES: &str =
    "give spec.template (a VMI template) or KubeVirt's spec.virtualMachineTemplate, not both";
/// VirtualMachinePool `spec.virtualMachineTemplate` whose run strategy is not `Always`.
pub const POOL_VM_RUN_STRATEGY: &str = "virtualMachineTemplate.spec.runStrategy must be Always (or running: true): a microvirt VirtualMachinePool keeps its members running and replaces one that ended; it makes no VirtualMachines that could be Halted, Manual, RerunOnFailure or Once";
/// VirtualMachinePool `spec.virtualMachineTemplate` whose VMI labels miss the selector.
pub const POOL_VM_TEMPLATE_SELECTOR: &str = "virtualMachineTemplate.spec.template.metadata.labels must contain every label of spec.selector.matchLabels: a microvirt pool's members are VMIs, not VirtualMachines";
/// VirtualMachinePool `spec.warm` with `spec.virtualMachineTemplate`.
pub const POOL_VM_TEMPLATE_WARM: &str = "spec.warm needs spec.template (a VMI template): move virtualMachineTemplate.spec.template to spec.template (docs/pools.md)";

/// KubeVirt's annotation naming sidecar hook containers.
pub const ANNOTATION_HOOK_SIDECARS: &str = "hooks.kubevirt.io/hookSidecars";
/// The annotation [`ANNOTATION_HOOK_SIDECARS`], on a VMI template (CEL) or a VMI (the operator:
/// a VMI's own annotations are out of reach of a CRD's CEL rules).
pub const HOOK_SIDECARS: &str = "the annotation hooks.kubevirt.io/hookSidecars is not supported by microvirt: sidecar hooks edit a libvirt domain, which a microVM does not have";

/// `disks[].cdrom`.
pub const CDROM: &str = "cdrom disks are not supported by microvirt: a microVM has only virtio-blk; attach the image as a read-only disk (disk: {readonly: true})";
/// `disks[].lun`.
pub const LUN: &str =
    "lun disks are not supported by microvirt: a microVM has no SCSI bus for LUN passthrough";
/// `devices.filesystems`.
pub const FILESYSTEMS: &str =
    "filesystems are not supported by microvirt: a microVM has no virtiofs device";
/// `interfaces[].passt`.
pub const PASST: &str = "passt interfaces are not supported by microvirt: use masquerade or bridge";
/// `interfaces[].binding`.
pub const BINDING: &str =
    "network binding plugins are not supported by microvirt: use masquerade or bridge";
/// `networks[].pod.vmNetworkCIDR`.
pub const VM_NETWORK_CIDR: &str = "pod.vmNetworkCIDR is not supported by microvirt yet: the guest side of masquerade is 10.0.2.0/24";
/// `memory.hugepages`.
pub const HUGEPAGES: &str = "memory.hugepages is not supported by microvirt: guest memory is ordinary anonymous memory of the launcher pod";
/// `evictionStrategy` other than `None` and `LiveMigrateIfPossible`.
pub const EVICTION_STRATEGY: &str = "evictionStrategy: microvirt has no live migration; an evicted VMI fails and its VM restarts it by its run strategy (None, or LiveMigrateIfPossible, which then means the same)";
/// Volume sources KubeVirt has and microvirt does not: `configMap`, `secret`,
/// `serviceAccount`, `downwardAPI`, `cloudInitConfigDrive`, `ephemeral`, `downwardMetrics`,
/// `sysprep`, `memoryDump`.
pub const VOLUME_SOURCE: &str = "this volume source is not supported by microvirt: a volume is a containerDisk, persistentVolumeClaim, cloudInitNoCloud or emptyDisk";
/// `cpu.model` other than `host-passthrough` or `host-model`.
pub const CPU_MODEL: &str = "cpu.model: microvirt gives the guest the host CPU's features as KVM reports them (host-passthrough); a named CPU model is not supported, leave model unset or set it to host-passthrough or host-model";
/// `cpu.features`.
pub const CPU_FEATURES: &str = "cpu.features is not supported by microvirt: the guest sees the host CPU's features as KVM reports them, none can be required or disabled";
/// `cpu.numa`.
pub const NUMA: &str =
    "cpu.numa is not supported by microvirt: a microVM has no guest NUMA topology";
/// `domain.chassis`.
pub const CHASSIS: &str =
    "chassis is not supported by microvirt: a microVM has no SMBIOS tables to carry it";
/// `firmware.serial`.
pub const FIRMWARE_SERIAL: &str =
    "firmware.serial is not supported by microvirt: a microVM has no SMBIOS tables to carry it";
/// `features.kvm.hidden: true`.
pub const KVM_HIDDEN: &str = "features.kvm.hidden: true is not supported by microvirt: the guest always sees KVM's signature (kvm-clock is its clock source)";
/// `devices.watchdog`.
pub const WATCHDOG: &str = "watchdog is not supported by microvirt: a microVM has no watchdog device, so nothing would act on a hung guest";
/// `devices.sound`.
pub const SOUND: &str = "sound is not supported by microvirt: a microVM has no sound device";
/// `disks[].cache: writethrough`.
pub const DISK_CACHE_WRITETHROUGH: &str = "cache: writethrough is not supported by microvirt: writes are durable when the guest flushes them (as with none or writeback), not each one on its own";
/// `disks[].shareable: true`.
pub const SHAREABLE: &str =
    "shareable disks are not supported by microvirt: a writable disk image is locked to one VMI";
/// `persistentVolumeClaim.hotpluggable: true`.
pub const HOTPLUG: &str =
    "hotpluggable volumes are not supported by microvirt: a microVM has no disk hotplug";
