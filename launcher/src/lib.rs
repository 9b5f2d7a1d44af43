//! `virt-launcher`: runs one VirtualMachineInstance in this process, with microvirt's VMM
//! embedded as a library (the VMM and its vCPUs on their own threads, driven through the
//! VMM's action channel).
//!
//! - [`vmi`]: the VMI document (manifest or the operator's `vmi.json`).
//! - [`launch`]: VMI → VM configuration; [`disks`]: volumes → virtio-blk disks; [`paths`]:
//!   names that become paths, files opened without following links;
//!   [`cloudinit`]: the NoCloud seed image (VFAT writer); [`demo`]: the embedded demo guest;
//!   [`oci`]: a root file system and workload from an OCI image (`containerRootfs`).
//! - [`runner`]: boot, signals, grace period, outcome; [`control`]: the control socket.
//! - [`seccomp`], [`caps`], [`teardown`]: least privilege.

pub mod bootdisk;
pub mod caps;
pub mod cloudinit;
pub mod console;
pub mod control;
pub mod demo;
pub mod disks;
pub mod kernel;
pub mod launch;
pub mod oci;
pub mod paths;
pub mod runner;
pub mod seccomp;
pub mod status;
pub mod teardown;
pub mod vmi;
