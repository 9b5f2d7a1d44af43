//! `expose`: a Service for a VMI, VM, VMIRS or VM pool, as `virtctl expose` makes it (pure: the
//! Service, given the object as kubectl prints it in JSON).
//!
//! - selector: a VMI's or VM's launcher pod by its `microvirt.io/vmi` label (a VM's VMI has the
//!   VM's name); a VMIRS's or pool's `spec.selector.matchLabels` (the operator copies the
//!   VMI's labels to its launcher pod; a pool's warm members carry none of them);
//! - ports: `--port` (with `--target-port`, `--protocol`, `--port-name`), else the ports that
//!   the pod-network interface declares (`port-1`, `port-2`, …);
//! - an owner reference to the object (not blocking its deletion), so the Service goes with it.

use serde_json::{json, Map, Value};

/// The launcher pod's label with its VMI's name (operator/src/pod/podspec.rs).
pub const LABEL_VMI_NAME: &str = "microvirt.io/vmi";

/// A kind `expose` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// VirtualMachineInstance.
    Vmi,
    /// VirtualMachine.
    Vm,
    /// VirtualMachineInstanceReplicaSet.
    Vmirs,
    /// VirtualMachinePool.
    Pool,
}

impl Kind {
    /// Parses virtctl's names for the kinds (and the pool's).
    pub fn parse(s: &str) -> Result<Kind, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances" => Kind::Vmi,
            "vm" | "vms" | "virtualmachine" | "virtualmachines" => Kind::Vm,
            "vmirs"
            | "vmirss"
            | "virtualmachineinstancereplicaset"
            | "virtualmachineinstancereplicasets" => Kind::Vmirs,
            "vmpool" | "vmpools" | "pool" | "virtualmachinepool" | "virtualmachinepools" => {
                Kind::Pool
            }
            _ => {
                return Err(format!(
                    "unsupported resource type: {s} (one of vmi, vm, vmirs, vmpool)"
                ))
            }
        })
    }

    /// The resource for `kubectl get`.
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Vmi => "virtualmachineinstances.microvirt.io",
            Kind::Vm => "virtualmachines.microvirt.io",
            Kind::Vmirs => "virtualmachineinstancereplicasets.microvirt.io",
            Kind::Pool => "virtualmachinepools.microvirt.io",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Vmi => "VirtualMachineInstance",
            Kind::Vm => "VirtualMachine",
            Kind::Vmirs => "VirtualMachineInstanceReplicaSet",
            Kind::Pool => "VirtualMachinePool",
        }
    }
}

/// The Service's settings (virtctl's flags).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// Service name.
    pub name: String,
    /// Service port; `None`: the interface's declared ports.
    pub port: Option<u16>,
    /// Target port (number or name); default: the port.
    pub target_port: Option<String>,
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// Name of the port.
    pub port_name: Option<String>,
    /// ClusterIP, NodePort or LoadBalancer.
    pub service_type: String,
    /// A fixed cluster IP, or `None` for a headless Service.
    pub cluster_ip: Option<String>,
    /// An external IP.
    pub external_ip: Option<String>,
}

/// The ports the pod-network interface of a VMI spec declares.
fn declared_ports(spec: &Value) -> Vec<Value> {
    let Some(net) = spec["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n.get("pod").is_some())
        .and_then(|n| n["name"].as_str())
    else {
        return Vec::new();
    };
    let Some(iface) = spec["domain"]["devices"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["name"].as_str() == Some(net))
    else {
        return Vec::new();
    };
    iface["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "name": format!("port-{}", i + 1),
                "protocol": p["protocol"].as_str().unwrap_or("TCP"),
                "port": p["port"],
            })
        })
        .collect()
}

/// The selector of `kind`'s launcher pods.
fn selector(kind: Kind, obj: &Value) -> Result<Value, String> {
    match kind {
        Kind::Vmi | Kind::Vm => {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            Ok(json!({ LABEL_VMI_NAME: name }))
        }
        Kind::Vmirs | Kind::Pool => {
            let sel = &obj["spec"]["selector"];
            if sel["matchExpressions"]
                .as_array()
                .is_some_and(|e| !e.is_empty())
            {
                return Err(format!(
                    "cannot expose {} with match expressions",
                    kind.kind()
                ));
            }
            match sel["matchLabels"].as_object() {
                Some(m) if !m.is_empty() => Ok(Value::Object(m.clone())),
                _ => Err(format!(
                    "cannot expose {} without any selector labels",
                    kind.kind()
                )),
            }
        }
    }
}

/// The Service that exposes `obj` (of `kind`).
pub fn service(kind: Kind, obj: &Value, opts: &Options) -> Result<Value, String> {
    let spec = match kind {
        Kind::Vmi => &obj["spec"],
        // A pool in KubeVirt's spelling: the VMI template inside its VM template.
        Kind::Pool if obj["spec"]["virtualMachineTemplate"].is_object() => {
            &obj["spec"]["virtualMachineTemplate"]["spec"]["template"]["spec"]
        }
        _ => &obj["spec"]["template"]["spec"],
    };
    let ports = match opts.port {
        Some(port) => {
            let mut p = Map::new();
            if let Some(n) = &opts.port_name {
                p.insert("name".into(), json!(n));
            }
            p.insert("protocol".into(), json!(opts.protocol));
            p.insert("port".into(), json!(port));
            if let Some(t) = &opts.target_port {
                p.insert(
                    "targetPort".into(),
                    t.parse::<u16>().map_or_else(|_| json!(t), |n| json!(n)),
                );
            }
            vec![Value::Object(p)]
        }
        None => declared_ports(spec),
    };
    if ports.is_empty() {
        return Err("couldn't find port via --port flag or introspection \
                    (the VMI's pod-network interface declares no ports)"
            .into());
    }
    let mut svc_spec = Map::new();
    svc_spec.insert("type".into(), json!(opts.service_type));
    svc_spec.insert("selector".into(), selector(kind, obj)?);
    svc_spec.insert("ports".into(), Value::Array(ports));
    if let Some(ip) = &opts.cluster_ip {
        svc_spec.insert("clusterIP".into(), json!(ip));
    }
    if let Some(ip) = &opts.external_ip {
        svc_spec.insert("externalIPs".into(), json!([ip]));
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": opts.name,
            "ownerReferences": [{
                "apiVersion": "microvirt.io/v1alpha1",
                "kind": kind.kind(),
                "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"],
                "controller": true,
                "blockOwnerDeletion": false,
            }],
        },
        "spec": svc_spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(port: Option<u16>) -> Options {
        Options {
            name: "svc".into(),
            port,
            protocol: "TCP".into(),
            service_type: "ClusterIP".into(),
            ..Default::default()
        }
    }

    #[test]
    fn kinds() {
        assert_eq!(Kind::parse("vmi"), Ok(Kind::Vmi));
        assert_eq!(Kind::parse("VirtualMachines"), Ok(Kind::Vm));
        assert_eq!(Kind::parse("vmirs"), Ok(Kind::Vmirs));
        assert_eq!(Kind::parse("vmpool"), Ok(Kind::Pool));
        assert!(Kind::parse("pod").is_err());
    }

    #[test]
    fn vm_by_its_vmi_name_with_a_port() {
        let vm =
            json!({"metadata": {"name": "db", "uid": "u"}, "spec": {"template": {"spec": {}}}});
        let mut o = opts(Some(5432));
        o.target_port = Some("5433".into());
        o.service_type = "NodePort".into();
        let s = service(Kind::Vm, &vm, &o).unwrap();
        assert_eq!(s["spec"]["selector"], json!({"microvirt.io/vmi": "db"}));
        assert_eq!(
            s["spec"]["ports"],
            json!([{"protocol": "TCP", "port": 5432, "targetPort": 5433}])
        );
        assert_eq!(s["spec"]["type"], "NodePort");
        assert_eq!(
            s["metadata"]["ownerReferences"][0]["kind"],
            "VirtualMachine"
        );
        assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "u");
        o.target_port = Some("ssh".into());
        let s = service(Kind::Vm, &vm, &o).unwrap();
        assert_eq!(s["spec"]["ports"][0]["targetPort"], "ssh");
        // No --port and no declared port.
        assert!(service(Kind::Vm, &vm, &opts(None))
            .unwrap_err()
            .contains("couldn't find port"));
    }

    #[test]
    fn declared_ports_of_the_pod_interface() {
        let vmi = json!({"metadata": {"name": "web", "uid": "u"}, "spec": {
            "networks": [{"name": "m", "multus": {}}, {"name": "p", "pod": {}}],
            "domain": {"devices": {"interfaces": [
                {"name": "p", "masquerade": {}, "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}
            ]}}
        }});
        let s = service(Kind::Vmi, &vmi, &opts(None)).unwrap();
        assert_eq!(
            s["spec"]["ports"],
            json!([
                {"name": "port-1", "protocol": "TCP", "port": 80},
                {"name": "port-2", "protocol": "UDP", "port": 53}
            ])
        );
        assert_eq!(s["spec"]["selector"], json!({"microvirt.io/vmi": "web"}));
    }

    #[test]
    fn replica_sets_and_pools_by_their_selector() {
        let rs = json!({"metadata": {"name": "rs", "uid": "u"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {}}}});
        let s = service(Kind::Vmirs, &rs, &opts(Some(80))).unwrap();
        assert_eq!(s["spec"]["selector"], json!({"app": "web"}));
        let s = service(Kind::Pool, &rs, &opts(Some(80))).unwrap();
        assert_eq!(
            s["metadata"]["ownerReferences"][0]["kind"],
            "VirtualMachinePool"
        );
        let exprs = json!({"metadata": {"name": "rs"}, "spec": {"selector": {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "a", "operator": "Exists"}]}}});
        assert!(service(Kind::Vmirs, &exprs, &opts(Some(80)))
            .unwrap_err()
            .contains("match expressions"));
        // A pool in KubeVirt's spelling: the ports of the VMI template in its VM template.
        let pool = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "virtualMachineTemplate": {"spec": {"runStrategy": "Always", "template": {"spec": {
                "networks": [{"name": "default", "pod": {}}],
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}, "ports": [{"port": 8080}]}
                ]}}
            }}}}
        }});
        let s = service(Kind::Pool, &pool, &opts(None)).unwrap();
        assert_eq!(
            s["spec"]["ports"],
            json!([{"name": "port-1", "protocol": "TCP", "port": 8080}])
        );
        assert_eq!(s["spec"]["selector"], json!({"app": "web"}));
        let none = json!({"metadata": {"name": "rs"}, "spec": {"selector": {}}});
        assert!(service(Kind::Pool, &none, &opts(Some(80)))
            .unwrap_err()
            .contains("without any selector labels"));
    }
}
