//! Operator settings (flags / environment of `virt-operator`).

/// How the launcher pod gets `/dev/kvm` and `/dev/net/tun`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvmMode {
    /// Request the extended resource `devices.microvirt.io/kvm: 1`; a device plugin on the node
    /// injects both device nodes (default).
    DevicePlugin,
    /// Mount `/dev/kvm` and `/dev/net/tun` from the node through hostPath volumes. Only for nodes
    /// whose container runtime lets unprivileged containers open those devices.
    HostPath,
}

/// The binding of the pod network interface a VMI gets when it declares no `interfaces` and no
/// `networks` (KubeVirt's `NetworkConfiguration.NetworkInterface`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultBinding {
    /// NAT behind the pod IP (default).
    #[default]
    Masquerade,
    /// The guest takes the pod IP.
    Bridge,
}

/// Settings the reconcilers need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Image of the launcher container.
    pub launcher_image: String,
    /// Memory the launcher needs on top of guest memory, in bytes.
    pub launcher_memory_overhead: u64,
    /// How `/dev/kvm` reaches the pod.
    pub kvm_mode: KvmMode,
    /// CPU request per vCPU, in millicores.
    pub cpu_request_millis_per_vcpu: u32,
    /// Guest memory when a VMI names none, in bytes.
    pub default_guest_memory: u64,
    /// Local disk the launcher's own runtime files need (console socket, cloud-init image,
    /// logs), in bytes; part of the pod's `ephemeral-storage` request and limit.
    pub launcher_scratch: u64,
    /// Local disk each writable containerDisk's copy-on-write overlay may take, in bytes; part
    /// of the pod's `ephemeral-storage` request and limit. A guest that writes more to its
    /// containerDisks than this allows gets its pod evicted by the kubelet.
    pub container_disk_overlay: u64,
    /// kernelBoot image for VMIs that name no `firmware.kernelBoot.container` (the kernel is
    /// [`DEFAULT_KERNEL_PATH`] inside it): a fallback, used only when the VMI's boot disk has no
    /// kernel of its own (the launcher looks first; docs/launcher-pod.md, "The guest kernel").
    /// `None`: such VMIs boot the boot disk's kernel or fail (`NoBootableKernel`); the launcher
    /// never falls back to its built-in demo guest in a pod.
    pub default_kernel_image: Option<String>,
    /// Kernel command line of the default kernel when the VMI gives no `kernelArgs` (its
    /// `root=` is replaced by the image's root partition on a partitioned boot disk).
    pub default_kernel_args: String,
    /// Binding of the pod interface added to VMIs without interfaces and networks.
    pub default_network_interface: DefaultBinding,
    /// First wait before a VM's next VMI after one failed before it ran (KubeVirt's 10 s);
    /// the n-th failure in a row waits n² times this plus up to half again, at most 30 times
    /// this (KubeVirt's 300 s). See `crate::vm::plan::start_backoff`.
    pub vm_start_backoff: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            launcher_image: DEFAULT_LAUNCHER_IMAGE.to_string(),
            launcher_memory_overhead: 32 << 20,
            kvm_mode: KvmMode::DevicePlugin,
            cpu_request_millis_per_vcpu: 100,
            default_guest_memory: 128 << 20,
            launcher_scratch: 64 << 20,
            container_disk_overlay: 2 << 30,
            default_kernel_image: Some(DEFAULT_KERNEL_IMAGE.to_string()),
            default_kernel_args: DEFAULT_KERNEL_ARGS.to_string(),
            default_network_interface: DefaultBinding::Masquerade,
            vm_start_backoff: DEFAULT_VM_START_BACKOFF,
        }
    }
}

/// KubeVirt's first back-off between the VMIs of a VM whose VMIs fail before they run.
pub const DEFAULT_VM_START_BACKOFF: std::time::Duration = std::time::Duration::from_secs(10);
/// Default launcher image.
pub const DEFAULT_LAUNCHER_IMAGE: &str = "microvirt/virt-launcher:dev";
/// Default guest kernel image: the Linux kernel of `guest-images/` (`cargo xtask oci-images`).
pub const DEFAULT_KERNEL_IMAGE: &str = "microvirt/guest-kernel:dev";
/// Where the kernel is inside a default kernel image.
pub const DEFAULT_KERNEL_PATH: &str = "/boot/vmlinux";
/// Command line of the default kernel: root on the first disk (the containerDisk of a
/// KubeVirt-style VMI), as the guest-images root file system expects.
pub const DEFAULT_KERNEL_ARGS: &str = "root=/dev/vda rw";
/// Local disk the launcher may use to extract a boot disk's kernel and initrd (its caps:
/// 64 MiB kernel + 512 MiB initrds, launcher/src/bootdisk), added to the runtime directory's
/// share for every VMI without `firmware.kernelBoot.container`.
pub const IMAGE_KERNEL_SCRATCH: u64 = 576 << 20;
/// Field manager of every server-side apply the operator does.
pub const FIELD_MANAGER: &str = "microvirt-operator";
/// Extended resource that grants `/dev/kvm` and `/dev/net/tun`.
pub const KVM_RESOURCE: &str = "devices.microvirt.io/kvm";
