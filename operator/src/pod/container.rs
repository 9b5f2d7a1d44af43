//! The container renderer: the launcher's `compute` container (command, environment,
//! security context, termination message, the VMI's probes); its resources, mounts and devices
//! come from the resources and volumes renderers.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, HTTPGetAction, HTTPHeader, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, TCPSocketAction, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use microvirt_crds::launcher_document::DOCUMENT_FILE_ENV;
use microvirt_crds::vmi::{self, VirtualMachineInstanceSpec};

use super::{COMPUTE_CONTAINER, LAUNCHER_GID, LAUNCHER_UID, TERMINATION_LOG, VMI_DIR, VMI_FILE};

/// The compute container: the launcher `image` with `resources`, `mounts` and `devices`
/// (no `volumeDevices` field when there are none) and the probes of the VMI `spec`.
pub(super) fn compute_container(
    image: &str,
    spec: &VirtualMachineInstanceSpec,
    resources: ResourceRequirements,
    mounts: Vec<VolumeMount>,
    devices: Vec<VolumeDevice>,
) -> Container {
    Container {
        name: COMPUTE_CONTAINER.into(),
        image: Some(image.to_string()),
        command: Some(vec!["virt-launcher".into(), "pod".into()]),
        env: Some(env()),
        resources: Some(resources),
        // The VM running is the pod's readiness gate (the pod renderer), which the node agent
        // sets from the launcher's status stream; no probe of the launcher itself (an exec probe
        // cost a runtime exec per VM per second for the pod's whole life). The VMI's own probes
        // (KubeVirt's) check the guest: the kubelet sends them to the pod IP, which reaches the
        // guest with either binding.
        readiness_probe: spec.readiness_probe.as_ref().map(pod_probe),
        liveness_probe: spec.liveness_probe.as_ref().map(pod_probe),
        security_context: Some(security_context()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("File".into()),
        volume_mounts: Some(mounts),
        volume_devices: (!devices.is_empty()).then_some(devices),
        ..Default::default()
    }
}

/// A VMI probe as a container probe: the same handler (`tcpSocket` or `httpGet`; the CRD
/// refuses the others) and the same timings, which the kubelet defaults as KubeVirt's would be.
fn pod_probe(p: &vmi::Probe) -> Probe {
    Probe {
        tcp_socket: p.tcp_socket.as_ref().map(|t| TCPSocketAction {
            port: IntOrString::Int(t.port),
            host: t.host.clone(),
        }),
        http_get: p.http_get.as_ref().map(|h| HTTPGetAction {
            port: IntOrString::Int(h.port),
            path: h.path.clone(),
            host: h.host.clone(),
            scheme: h.scheme.map(|s| s.as_str().to_string()),
            http_headers: (!h.http_headers.is_empty()).then(|| {
                h.http_headers
                    .iter()
                    .map(|x| HTTPHeader {
                        name: x.name.clone(),
                        value: x.value.clone(),
                    })
                    .collect()
            }),
        }),
        initial_delay_seconds: p.initial_delay_seconds,
        timeout_seconds: p.timeout_seconds,
        period_seconds: p.period_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
        ..Default::default()
    }
}

/// Where the launcher finds the VMI document, and the user it becomes after its setup.
fn env() -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: DOCUMENT_FILE_ENV.into(),
            value: Some(format!("{VMI_DIR}/{VMI_FILE}")),
            ..Default::default()
        },
        EnvVar {
            name: "MICROVIRT_LAUNCHER_USER".into(),
            value: Some(format!("{LAUNCHER_UID}:{LAUNCHER_GID}")),
            ..Default::default()
        },
    ]
}

/// The launcher starts as root only for its setup: the pod network (NET_ADMIN: tap, bridge,
/// nftables; NET_BIND_SERVICE: the DHCP server's UDP port 67) and opening /dev/kvm; then it
/// becomes LAUNCHER_UID:LAUNCHER_GID (SETUID, SETGID), which leaves it no capability, before
/// it opens any volume or runs the guest.
fn security_context() -> SecurityContext {
    SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        run_as_user: Some(0),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: Some(vec![
                "NET_ADMIN".into(),
                "NET_BIND_SERVICE".into(),
                "SETGID".into(),
                "SETUID".into(),
            ]),
            drop: Some(vec!["ALL".into()]),
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with_probes(probes: serde_json::Value) -> VirtualMachineInstanceSpec {
        let mut spec = serde_json::json!({"domain": {}});
        spec.as_object_mut()
            .unwrap()
            .extend(probes.as_object().unwrap().clone());
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn the_vmi_probes_become_the_container_probes() {
        let spec = spec_with_probes(serde_json::json!({
            "readinessProbe": {
                "httpGet": {
                    "port": 8080, "path": "/healthz", "scheme": "HTTPS",
                    "httpHeaders": [{"name": "X-Probe", "value": "1"}]
                },
                "initialDelaySeconds": 5, "periodSeconds": 2, "timeoutSeconds": 3,
                "successThreshold": 2, "failureThreshold": 4
            },
            "livenessProbe": {"tcpSocket": {"port": 22}, "failureThreshold": 6}
        }));
        let c = compute_container("launcher:1", &spec, Default::default(), vec![], vec![]);
        let r = c.readiness_probe.expect("readiness probe");
        let h = r.http_get.expect("httpGet");
        assert_eq!(h.port, IntOrString::Int(8080));
        assert_eq!(h.path.as_deref(), Some("/healthz"));
        assert_eq!(h.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(h.host, None, "the kubelet's default host is the pod IP");
        let headers = h.http_headers.expect("headers");
        assert_eq!(
            (headers[0].name.as_str(), headers[0].value.as_str()),
            ("X-Probe", "1")
        );
        assert!(r.tcp_socket.is_none() && r.exec.is_none() && r.grpc.is_none());
        assert_eq!(
            (
                r.initial_delay_seconds,
                r.period_seconds,
                r.timeout_seconds,
                r.success_threshold,
                r.failure_threshold
            ),
            (Some(5), Some(2), Some(3), Some(2), Some(4))
        );
        let l = c.liveness_probe.expect("liveness probe");
        let t = l.tcp_socket.expect("tcpSocket");
        assert_eq!((t.port, t.host), (IntOrString::Int(22), None));
        assert!(l.http_get.is_none());
        assert_eq!(l.failure_threshold, Some(6));
        assert_eq!((l.period_seconds, l.success_threshold), (None, None));
        assert!(c.startup_probe.is_none());
        // Only the liveness probe: no readiness probe is made up.
        let spec = spec_with_probes(serde_json::json!({
            "livenessProbe": {"httpGet": {"port": 80}}
        }));
        let c = compute_container("launcher:1", &spec, Default::default(), vec![], vec![]);
        assert!(c.readiness_probe.is_none());
        let h = c.liveness_probe.unwrap().http_get.unwrap();
        assert_eq!(
            (h.port, h.path, h.scheme, h.http_headers),
            (IntOrString::Int(80), None, None, None)
        );
    }

    #[test]
    fn the_compute_container_has_no_probes_and_no_empty_device_list() {
        let mounts = vec![VolumeMount {
            name: "runtime".into(),
            mount_path: "/r".into(),
            ..Default::default()
        }];
        let spec = VirtualMachineInstanceSpec::default();
        let c = compute_container(
            "launcher:1",
            &spec,
            Default::default(),
            mounts.clone(),
            vec![],
        );
        assert_eq!(c.name, COMPUTE_CONTAINER);
        assert_eq!(c.image.as_deref(), Some("launcher:1"));
        assert_eq!(c.volume_mounts, Some(mounts));
        assert_eq!(c.volume_devices, None);
        assert!(c.readiness_probe.is_none() && c.liveness_probe.is_none());
        assert!(c.startup_probe.is_none());
        let devices = vec![VolumeDevice {
            name: "vol-0".into(),
            device_path: "/dev/x".into(),
        }];
        let c = compute_container(
            "launcher:1",
            &spec,
            Default::default(),
            vec![],
            devices.clone(),
        );
        assert_eq!(c.volume_devices, Some(devices));
    }
}
