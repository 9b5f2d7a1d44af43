//! The node's configuration files (pure text generation, unit-tested): containerd's
//! `config.toml`, the kubelet's `KubeletConfiguration`, the CNI network list and the node
//! network namespace's nftables rules.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

use super::paths::NodePaths;

/// Addresses of the node's private network (all of it lives on this machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeNetwork {
    /// The host end of the veth pair; kube-apiserver listens here.
    pub host_ip: Ipv4Addr,
    /// The node end of the veth pair: the kubelet's address, the node's InternalIP.
    pub node_ip: Ipv4Addr,
    /// Prefix length of the veth link.
    pub link_prefix: u8,
    /// The pod subnet (CNI bridge + host-local IPAM inside the node's namespace).
    pub pod_subnet: Ipv4Addr,
    /// Its prefix length.
    pub pod_prefix: u8,
    /// The `kubernetes` Service's cluster IP (first address of the service range the apiserver
    /// is given); DNAT-ed to the apiserver inside the node's namespace.
    pub service_ip: Ipv4Addr,
    /// The cluster DNS address pods are given (no DNS server runs: lookups fail fast, and the
    /// kubelet does not warn about a missing cluster DNS on every pod).
    pub dns_ip: Ipv4Addr,
}

impl Default for NodeNetwork {
    fn default() -> Self {
        Self {
            host_ip: Ipv4Addr::new(10, 250, 250, 1),
            node_ip: Ipv4Addr::new(10, 250, 250, 2),
            link_prefix: 30,
            pod_subnet: Ipv4Addr::new(10, 244, 0, 0),
            pod_prefix: 24,
            service_ip: Ipv4Addr::new(10, 96, 0, 1),
            dns_ip: Ipv4Addr::new(10, 96, 0, 10),
        }
    }
}

impl NodeNetwork {
    /// `10.244.0.0/24`.
    pub fn pod_cidr(&self) -> String {
        format!("{}/{}", self.pod_subnet, self.pod_prefix)
    }

    /// Whether `ip` is in the pod subnet.
    pub fn is_pod_ip(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.pod_prefix))
            .unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.pod_subnet) & mask
    }
}

fn toml_str(p: &Path) -> String {
    // Single-quoted TOML literal strings take everything verbatim except `'`.
    format!("'{}'", p.display())
}

/// containerd's `config.toml` (version 3, containerd 2.x).
///
/// - Its own root, state, socket and CNI paths (nothing under /var/lib/containerd or
///   /etc/cni), pod network namespaces mounted under its state dir, not /run/netns.
/// - `restrict_oom_score_adj`: the machine lacks CAP_SYS_RESOURCE, so containers may not get an
///   OOM score below containerd's own.
/// - runc with cgroupfs (no systemd), the overlayfs snapshotter, the pinned sandbox image
///   (imported locally, never pulled), NRI and the plugins that write outside our
///   directories (opt) off.
pub fn containerd_toml(paths: &NodePaths, sandbox_image: &str, runc: &Path) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "version = 3\n\
         root = {root}\n\
         state = {state}\n\
         temp = {tmp}\n\
         disabled_plugins = [\n  'io.containerd.internal.v1.opt',\n  'io.containerd.nri.v1.nri',\n  \
         'io.containerd.snapshotter.v1.btrfs',\n  'io.containerd.snapshotter.v1.zfs',\n  \
         'io.containerd.snapshotter.v1.devmapper',\n  'io.containerd.snapshotter.v1.blockfile',\n  \
         'io.containerd.snapshotter.v1.erofs',\n  'io.containerd.tracing.processor.v1.otlp',\n  \
         'io.containerd.internal.v1.tracing',\n]\n\n\
         [grpc]\n  address = {sock}\n\n\
         [ttrpc]\n  address = {ttrpc}\n\n\
         [debug]\n  level = 'info'\n\n\
         [plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n  \
         disable_snapshot_annotations = true\n\n\
         [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = '{sandbox_image}'\n\n\
         [plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n  \
         restrict_oom_score_adj = true\n  netns_mounts_under_state_dir = true\n  \
         enable_unprivileged_ports = false\n  enable_unprivileged_icmp = false\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  \
         runtime_type = 'io.containerd.runc.v2'\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  \
         SystemdCgroup = false\n  BinaryName = {runc}\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = ['/usr/lib/cni']\n  \
         conf_dir = {cni_conf}\n  max_conf_num = 1\n\n\
         [plugins.'io.containerd.grpc.v1.cri']\n  disable_tcp_service = true\n",
        root = toml_str(&paths.containerd_root()),
        state = toml_str(&paths.containerd_state()),
        tmp = toml_str(&paths.tmp()),
        sock = toml_str(&paths.containerd_socket()),
        ttrpc = toml_str(&paths.containerd_ttrpc_socket()),
        runc = toml_str(runc),
        cni_conf = toml_str(&paths.cni_conf_dir()),
    );
    s
}

/// The CNI network list: a Linux bridge with host-local IPAM, the bridge being the pods'
/// default gateway (the node's namespace has no default route, so nothing leaves the machine:
/// pods reach the node, the host's veth end and, through DNAT, the apiserver); no IP
/// masquerade; hairpin on so a pod reaches itself through its own IP.
pub fn cni_conflist(paths: &NodePaths, net: &NodeNetwork) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "microvirt-pods",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{cidr}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}],
        "dataDir": "{data}"
      }}
    }},
    {{
      "type": "tuning",
      "sysctl": {{"net.ipv4.ip_forward": "1"}}
    }}
  ]
}}
"#,
        cidr = net.pod_cidr(),
        data = paths.cni_ipam_dir().display(),
    )
}

/// The kubelet's configuration.
///
/// cgroup v1 with the cgroupfs driver (no systemd; `failCgroupV1: false` because 1.35 turns v1
/// off by default), swap tolerated, no OOM score below 0 (no CAP_SYS_RESOURCE), no iptables
/// chains, pods under their own cgroup root, image GC and eviction effectively off (this is a
/// shared development machine, not a dedicated node), the ImageVolume gate on. Its HTTPS
/// server answers anonymous requests (AlwaysAllow) but listens only on the node's private
/// address, reachable from this machine alone.
pub fn kubelet_yaml(paths: &NodePaths, net: &NodeNetwork, cgroup_root: &str) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         address: {node_ip}\n\
         port: 10250\n\
         readOnlyPort: 0\n\
         healthzBindAddress: {node_ip}\n\
         healthzPort: 10248\n\
         authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
         authorization:\n  mode: AlwaysAllow\n\
         containerRuntimeEndpoint: unix://{sock}\n\
         cgroupDriver: cgroupfs\n\
         cgroupRoot: {cgroup_root}\n\
         cgroupsPerQOS: true\n\
         failCgroupV1: false\n\
         failSwapOn: false\n\
         oomScoreAdj: 0\n\
         makeIPTablesUtilChains: false\n\
         protectKernelDefaults: false\n\
         featureGates:\n  ImageVolume: true\n\
         podLogsDir: {logs}\n\
         resolvConf: {resolv}\n\
         clusterDomain: cluster.local\n\
         clusterDNS: [{dns}]\n\
         hairpinMode: hairpin-veth\n\
         serializeImagePulls: false\n\
         imageGCHighThresholdPercent: 100\n\
         imageGCLowThresholdPercent: 99\n\
         evictionHard:\n  memory.available: 1Mi\n  nodefs.available: 1%\n  \
         nodefs.inodesFree: 1%\n  imagefs.available: 1%\n  imagefs.inodesFree: 1%\n\
         evictionPressureTransitionPeriod: 10s\n\
         maxPods: 110\n\
         kubeAPIQPS: 100\n\
         kubeAPIBurst: 200\n\
         registerNode: true\n\
         shutdownGracePeriod: 0s\n\
         localStorageCapacityIsolation: true\n",
        node_ip = net.node_ip,
        sock = paths.containerd_socket().display(),
        logs = paths.pod_logs().display(),
        resolv = paths.resolv_conf().display(),
        dns = net.dns_ip,
    )
}

/// nftables rules of the node's network namespace: the `kubernetes` Service's cluster IP
/// (port 443) goes to the apiserver, for pods (prerouting) and host-network processes
/// (output). This stands in for kube-proxy for the one Service in-cluster clients need.
pub fn nft_rules(net: &NodeNetwork, apiserver_port: u16) -> String {
    format!(
        "table ip microvirt-node {{\n\
         \x20 chain prerouting {{\n\
         \x20   type nat hook prerouting priority -100; policy accept;\n\
         \x20   ip daddr {svc} tcp dport 443 dnat to {host}:{port}\n\
         \x20 }}\n\
         \x20 chain output {{\n\
         \x20   type nat hook output priority -100; policy accept;\n\
         \x20   ip daddr {svc} tcp dport 443 dnat to {host}:{port}\n\
         \x20 }}\n\
         }}\n",
        svc = net.service_ip,
        host = net.host_ip,
        port = apiserver_port,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn paths() -> NodePaths {
        NodePaths::new(PathBuf::from("/x/node"), PathBuf::from("/run/x"))
    }

    #[test]
    fn containerd_config_keeps_everything_in_our_dirs() {
        let t = containerd_toml(
            &paths(),
            "docker.io/microvirt/pause:1",
            Path::new("/r/runc"),
        );
        assert!(t.starts_with("version = 3\n"));
        assert!(t.contains("root = '/x/node/containerd/root'"));
        assert!(t.contains("state = '/run/x/containerd'"));
        assert!(t.contains("address = '/run/x/containerd.sock'"));
        assert!(t.contains("restrict_oom_score_adj = true"));
        assert!(t.contains("SystemdCgroup = false"));
        assert!(t.contains("netns_mounts_under_state_dir = true"));
        assert!(t.contains("sandbox = 'docker.io/microvirt/pause:1'"));
        assert!(t.contains("BinaryName = '/r/runc'"));
        assert!(t.contains("conf_dir = '/x/node/cni/net.d'"));
    }

    #[test]
    fn kubelet_config_and_cni() {
        let net = NodeNetwork::default();
        let k = kubelet_yaml(&paths(), &net, "/microvirt-node");
        assert!(k.contains("address: 10.250.250.2\n"));
        assert!(k.contains("failCgroupV1: false\n"));
        assert!(k.contains("cgroupRoot: /microvirt-node\n"));
        assert!(k.contains("featureGates:\n  ImageVolume: true\n"));
        assert!(k.contains("containerRuntimeEndpoint: unix:///run/x/containerd.sock\n"));
        let c: serde_json::Value = serde_json::from_str(&cni_conflist(&paths(), &net)).unwrap();
        assert_eq!(c["plugins"][0]["ipMasq"], false);
        assert_eq!(c["plugins"][0]["ipam"]["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(c["plugins"][1]["sysctl"]["net.ipv4.ip_forward"], "1");
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.0.0/24"
        );
        assert!(net.is_pod_ip(Ipv4Addr::new(10, 244, 0, 9)));
        assert!(!net.is_pod_ip(Ipv4Addr::new(10, 244, 1, 9)));
        let n = nft_rules(&net, 6443);
        assert!(n.contains("ip daddr 10.96.0.1 tcp dport 443 dnat to 10.250.250.1:6443"));
    }
}
