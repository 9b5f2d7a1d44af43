//! `virt-launcher` end to end on this machine's /dev/kvm with the built-in demo guest (the test
//! guest embedded in the binary): run mode, signals and the grace period, crashes, pod mode
//! with a fake pod filesystem, the control socket, and disks from volumes.

mod disks;
mod harness;
mod network;
mod pod_mode;
mod privileges;
mod run_mode;
mod shutdown;
