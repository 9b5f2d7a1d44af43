//! The container renderer: the launcher's `compute` container (command, environment,
//! security context, termination message); its resources, mounts and devices come from the
//! resources and volumes renderers.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, ResourceRequirements, SeccompProfile, SecurityContext,
    VolumeDevice, VolumeMount,
};

use super::{COMPUTE_CONTAINER, LAUNCHER_GID, LAUNCHER_UID, TERMINATION_LOG, VMI_DIR, VMI_FILE};

/// The compute container: the launcher `image` with `resources`, `mounts` and `devices`
/// (no `volumeDevices` field when there are none).
pub(super) fn compute_container(
    image: &str,
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
        // No probe: readiness is the pod's readiness gate (the pod renderer), which the node
        // agent sets from the launcher's status stream. An exec probe cost a runtime exec per
        // VM per second for the pod's whole life.
        security_context: Some(security_context()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("File".into()),
        volume_mounts: Some(mounts),
        volume_devices: (!devices.is_empty()).then_some(devices),
        ..Default::default()
    }
}

/// Where the launcher finds the VMI document, and the user it becomes after its setup.
fn env() -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "MICROVIRT_VMI_FILE".into(),
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

    #[test]
    fn the_compute_container_has_no_probes_and_no_empty_device_list() {
        let mounts = vec![VolumeMount {
            name: "runtime".into(),
            mount_path: "/r".into(),
            ..Default::default()
        }];
        let c = compute_container("launcher:1", Default::default(), mounts.clone(), vec![]);
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
        let c = compute_container("launcher:1", Default::default(), vec![], devices.clone());
        assert_eq!(c.volume_devices, Some(devices));
    }
}
