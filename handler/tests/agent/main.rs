//! The node agent end to end: the real `virt-handler` binary (`--no-device-plugin`) against a
//! real etcd + kube-apiserver (`tests/support`), running as the ServiceAccount of
//! `deploy/handler.yaml` (impersonated, so its RBAC is what is tested), and a real
//! `virt-launcher pod` process booting the built-in test guest on /dev/kvm.
//!
//! The test stands in for the kubelet: it creates the launcher pod object already bound to
//! node `node-a` and lays out the kubelet's pod directory in a temp "kubelet root":
//! `<root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/runtime` is a symlink to the
//! directory the launcher uses as `MICROVIRT_ROOT` (in a real pod that directory is the same
//! emptyDir, bind-mounted at /var/run/microvirt). It also plays the operator where needed
//! (writes the VMI's Ready condition with the operator's field manager, sets control
//! requests on the pod).

mod control;
mod harness;
mod pools;
mod readiness;
