//! The pod network interface: the interface and network a VMI without any gets (KubeVirt's
//! `autoattachPodInterface`). The pod itself has no network rendering: the launcher attaches
//! the guest to the pod's own interface.

use microvirt_crds::vmi::{
    Interface, InterfaceBridge, InterfaceMasquerade, Network, PodNetwork,
    VirtualMachineInstanceSpec, DEFAULT_NETWORK_NAME,
};

use crate::config::DefaultBinding;

/// The pod network interface (and its network) that a VMI without `interfaces` and `networks`
/// gets, as in KubeVirt (`autoattachPodInterface`, default true): an interface and a network
/// both named `default`, the network the pod network, the binding the operator's
/// `--default-network-interface`. `None` when the VMI declares either, or turns it off with
/// `autoattachPodInterface: false`. The one place this default is decided: the launcher
/// document gets it ([`launcher_spec`](super::launcher_spec)), the VMI status names it.
pub fn default_pod_interface(
    spec: &VirtualMachineInstanceSpec,
    binding: DefaultBinding,
) -> Option<(Interface, Network)> {
    let devices = spec.domain.devices.as_ref();
    let autoattach = devices
        .and_then(|d| d.autoattach_pod_interface)
        .unwrap_or(true);
    let has_interfaces = devices.is_some_and(|d| !d.interfaces.is_empty());
    if !autoattach || has_interfaces || !spec.networks.is_empty() {
        return None;
    }
    let mut iface = Interface {
        name: DEFAULT_NETWORK_NAME.into(),
        ..Default::default()
    };
    match binding {
        DefaultBinding::Masquerade => iface.masquerade = Some(InterfaceMasquerade {}),
        DefaultBinding::Bridge => iface.bridge = Some(InterfaceBridge {}),
    }
    let network = Network {
        name: DEFAULT_NETWORK_NAME.into(),
        pod: Some(PodNetwork::default()),
        ..Default::default()
    };
    Some((iface, network))
}

/// `spec` with [`default_pod_interface`] added (unchanged when it gets none).
pub fn with_default_pod_interface(spec: &mut VirtualMachineInstanceSpec, binding: DefaultBinding) {
    if let Some((iface, network)) = default_pod_interface(spec, binding) {
        spec.domain
            .devices
            .get_or_insert_with(Default::default)
            .interfaces
            .push(iface);
        spec.networks.push(network);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes};
    use super::*;
    use crate::config::Config;
    use microvirt_crds::vmi::Devices;

    #[test]
    fn a_vmi_without_interfaces_gets_the_pod_network_as_in_kubevirt() {
        // spec() declares no interfaces and no networks.
        let v = vmi(spec(Some("64Mi"), None));
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let doc = launcher_doc(&pod);
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "default", "masquerade": {}}])
        );
        assert_eq!(
            doc["spec"]["networks"],
            serde_json::json!([{"name": "default", "pod": {}}])
        );
        // The VMI object itself is not changed.
        assert!(v.spec.domain.devices.is_none());

        // --default-network-interface=bridge.
        let cfg = Config {
            default_network_interface: DefaultBinding::Bridge,
            ..Config::default()
        };
        let doc = launcher_doc(&desired_pod(&v, &cfg, &BlockVolumes::new()).unwrap());
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "default", "bridge": {}}])
        );

        // autoattachPodInterface: false: no NIC.
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(Devices {
            autoattach_pod_interface: Some(false),
            ..Default::default()
        });
        let doc =
            launcher_doc(&desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap());
        assert!(doc["spec"]["domain"]["devices"].get("interfaces").is_none());
        assert!(doc["spec"].get("networks").is_none());

        // Declared interfaces and networks are kept as they are, and so is a VMI that names
        // a network but no interface (KubeVirt adds nothing to either).
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(Devices {
            interfaces: vec![Interface {
                name: "net0".into(),
                bridge: Some(InterfaceBridge {}),
                ..Default::default()
            }],
            ..Default::default()
        });
        sp.networks = vec![Network {
            name: "net0".into(),
            pod: Some(PodNetwork::default()),
            ..Default::default()
        }];
        let doc = launcher_doc(
            &desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap(),
        );
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "net0", "bridge": {}}])
        );
        sp.domain.devices = None;
        assert!(default_pod_interface(&sp, DefaultBinding::Masquerade).is_none());
    }
}
