//! Real network namespaces: a "node" netns, a "pod" netns whose eth0 is a veth to the node,
//! and a "VM" netns whose vm0 (a veth stand-in for the guest's virtio-net, carrying the guest
//! MAC) is either a port of the pod's k6t-eth0 bridge or connected through the real TAP by a
//! relay (see `attach_vm_via_tap`). `ip` builds only this fixture; the code under test
//! configures everything through netlink. Needs root, iproute2 and busybox (udhcpc).

mod bridge;
mod fixture;
mod masquerade;
mod privileges;
mod relay;
mod tap;
