use super::*;
use crate::refusals;

fn spec(yaml: &str) -> VirtualMachineInstanceSpec {
    serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(yaml).unwrap()).unwrap()
}

#[test]
fn kubevirt_tuning_fields_survive_a_round_trip() {
    // What the operator passes on (presets merged as JSON, the launcher's document) keeps
    // every accepted KubeVirt field with KubeVirt's spelling.
    let yaml = r#"
domain:
  cpu: {model: host-passthrough}
  features: {kvm: {hidden: false}, pvspinlock: {enabled: false}}
  devices:
    networkInterfaceMultiqueue: true
    blockMultiQueue: true
    inputs: [{name: tablet, type: tablet, bus: virtio}]
    disks: [{name: d, cache: none, io: native, shareable: false}]
volumes: [{name: d, persistentVolumeClaim: {claimName: c, hotpluggable: false}}]
dnsPolicy: None
dnsConfig: {nameservers: [192.0.2.53]}
"#;
    let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    let s = spec(yaml);
    let d = s.domain.devices.as_ref().unwrap();
    assert_eq!(d.disks[0].cache, Some(DiskCache::None));
    assert_eq!(d.disks[0].io, Some(DiskIo::Native));
    assert_eq!(s.dns_policy.map(DnsPolicy::as_str), Some("None"));
    assert_eq!(serde_json::to_value(&s).unwrap(), v);
    let w: Disk =
        serde_json::from_value(serde_json::json!({"name": "d", "cache": "writethrough"})).unwrap();
    assert_eq!(w.cache, Some(DiskCache::Writethrough));
}

#[test]
fn kubevirt_probes_are_typed_and_survive_a_round_trip() {
    let yaml = r#"
domain: {}
readinessProbe:
  httpGet: {port: 1500, path: /healthz, scheme: HTTPS, httpHeaders: [{name: X-A, value: b}]}
  initialDelaySeconds: 120
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 3
  successThreshold: 3
livenessProbe:
  tcpSocket: {port: 22}
  failureThreshold: 6
"#;
    let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    let s = spec(yaml);
    let r = s.readiness_probe.as_ref().unwrap();
    let h = r.http_get.as_ref().unwrap();
    assert_eq!((h.port, h.path.as_deref()), (1500, Some("/healthz")));
    assert_eq!(h.scheme, Some(ProbeScheme::Https));
    assert_eq!(h.http_headers[0].name, "X-A");
    assert_eq!(
        (r.initial_delay_seconds, r.period_seconds, r.timeout_seconds),
        (Some(120), Some(20), Some(10))
    );
    assert_eq!(
        (r.failure_threshold, r.success_threshold),
        (Some(3), Some(3))
    );
    let l = s.liveness_probe.as_ref().unwrap();
    assert_eq!(l.tcp_socket.as_ref().map(|t| t.port), Some(22));
    assert!(l.http_get.is_none() && l.exec.is_none() && l.guest_agent_ping.is_none());
    assert_eq!(serde_json::to_value(&s).unwrap(), v);
    // The handlers that need a guest agent are kept (for the CRD's rules to refuse).
    let s = spec(
        "{domain: {}, livenessProbe: {guestAgentPing: {}}, readinessProbe: {exec: {command: [x]}}}",
    );
    assert!(s.liveness_probe.unwrap().guest_agent_ping.is_some());
    assert!(s.readiness_probe.unwrap().exec.is_some());
}

#[test]
fn the_probe_rules_are_in_the_schema() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_string(&VirtualMachineInstance::crd()).unwrap();
    for message in [
        refusals::PROBE_EXEC,
        refusals::PROBE_GUEST_AGENT_PING,
        refusals::PROBE_NO_HANDLER,
        refusals::PROBE_TWO_HANDLERS,
        refusals::PROBE_WITHOUT_NIC,
        refusals::PROBE_PORT_NOT_FORWARDED,
        refusals::LIVENESS_SUCCESS_THRESHOLD,
    ] {
        assert!(
            crd.contains(&serde_json::to_string(message).unwrap()),
            "{message}"
        );
    }
    assert!(!crd.contains("not supported by microvirt yet: the VMI is Ready"));
}

#[test]
fn vcpus_from_topology_else_cpu_limit_else_request() {
    let v = |y: &str| spec(y).vcpus();
    assert_eq!(v("domain: {}"), 1);
    assert_eq!(v("domain: {cpu: {cores: 2, sockets: 2, threads: 2}}"), 8);
    assert_eq!(v("domain: {cpu: {sockets: 3}}"), 3);
    // KubeVirt: no topology → the limit, else the request, rounded up.
    assert_eq!(v("domain: {resources: {requests: {cpu: '2'}}}"), 2);
    assert_eq!(v("domain: {resources: {requests: {cpu: 1500m}}}"), 2);
    assert_eq!(v("domain: {resources: {requests: {cpu: 100m}}}"), 1);
    assert_eq!(
        v("domain: {resources: {requests: {cpu: '1'}, limits: {cpu: '3'}}}"),
        3
    );
    // A topology wins over resources; dedicatedCpuPlacement alone is no topology.
    assert_eq!(
        v("domain: {cpu: {cores: 1}, resources: {requests: {cpu: '4'}}}"),
        1
    );
    assert_eq!(
        v("domain: {cpu: {dedicatedCpuPlacement: true}, resources: {limits: {cpu: '2'}}}"),
        2
    );
    // Memory only: 1.
    assert_eq!(v("domain: {resources: {requests: {memory: 1Gi}}}"), 1);
}
