//! microvirt's end-to-end proving ground.
//!
//! - [`images`]: builds and caches the guest kernel (ELF vmlinux + bzImage) and ext4 rootfs;
//! - [`l1`]: the test host's kernel (Debian, with KVM modules) and initramfs;
//! - [`qemu`]: boots it under QEMU TCG with `-cpu max` (emulated AMD SVM), streams and bounds it;
//! - [`scenarios`]: the end-to-end scenarios, run inside the test host or directly on hardware KVM;
//! - [`bench`]: microvm vs QEMU `-M microvm` boot time and memory in the test host;
//! - [`stock`]: a stock Debian guest (the distribution's cloud kernel and initramfs-tools
//!   initramfs, a partitioned root disk), built from Debian's packages and cached;
//! - [`diskbench`]: the stock guest reading a raw, a qcow2 and a compressed qcow2 disk with
//!   O_DIRECT under microvm and QEMU;
//! - [`systemd_guest`]: the same kernel in a Debian cloud image with systemd and cloud-init.

pub mod bench;
pub mod bootlog;
pub mod cmd;
pub mod diskbench;
pub mod images;
pub mod l1;
pub mod oci_guest;
pub mod qemu;
pub mod scenarios;
pub mod stock;
pub mod systemd_guest;
