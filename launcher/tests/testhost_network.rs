//! Masquerade pod networking end to end with a real Linux guest, inside the QEMU-TCG test host
//! (tests/testhost; directly on hosts with hardware KVM).
//!
//! The test host's root network namespace plays the node (10.244.0.1 on `vnode0`); a second
//! namespace plays the pod, its `eth0` (10.244.0.5/24) the veth peer of `vnode0`.
//! `virt-launcher run --pod-network` runs inside the pod namespace with a VMI that has a
//! masquerade interface on the pod network, so netsetup builds the bridge `k6t-eth0`, the TAP,
//! the nf_tables NAT and the DHCP server there, as in a launcher pod. The guest (the rootfs
//! `net` scenario) gets its address by DHCP, connects to a server on the node (SNAT: the node
//! sees the pod IP), then serves TCP which a node client reaches through the pod IP (DNAT).

use microvirt_testhost::scenarios::{self, Scenario};

const SCRIPT: &str = r##"
LAUNCHER=$MICROVM
[ -x /bin/virt-launcher ] && LAUNCHER=/bin/virt-launcher
for m in veth bridge nf_tables nf_nat nft_chain_nat nft_nat; do
	grep -q "^$m " /proc/modules || echo "check module $m missing"
done

# The pod: a network namespace with eth0 10.244.0.5/24, the node 10.244.0.1 (prelude.sh).
pod_network_up

# The node's server: records the peer address of its connection and what it received.
cat > srv.sh <<'EOF'
#!/bin/sh
netstat -tn > "$WORK/netstat.txt" 2>&1
awk '$4 ~ /:5000$/ {print $5}' "$WORK/netstat.txt" | head -n 1 > "$WORK/peer.txt"
cat > "$WORK/from-guest.txt"
EOF
chmod +x srv.sh
timeout 150 nc -l -p 5000 -e "$WORK/srv.sh" </dev/null &
listener=$!

# The node's client: once the guest says it listens, connect to the pod IP (DNAT to the VM).
(
	i=0
	until grep -q "microvirt: net listening" net.log 2>/dev/null; do
		i=$((i + 1))
		[ $i -ge 600 ] && exit 0
		sleep 0.2
	done
	i=0
	until echo "hello-from-node" | nc -w 2 10.244.0.5 5001 2>/dev/null; do
		i=$((i + 1))
		[ $i -ge 50 ] && { echo "check node client gave up"; break; }
		sleep 0.3
	done
) &
client=$!

cat > vmi.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: netvm}
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: "root=/dev/vda rw quiet microvirt.scenario=net microvirt.peer=10.244.0.1"
        container: {image: local, kernelPath: "$VMLINUX"}
    devices:
      disks: [{name: root}]
      interfaces: [{name: default, masquerade: {}}]
  networks: [{name: default, pod: {}}]
  volumes:
    - {name: root, containerDisk: {image: local, path: "$ROOTFS"}}
EOF
cat > launch.sh <<EOF
#!/bin/sh
MICROVIRT_RESOLV_CONF=$WORK/resolv.conf exec nsenter -t $holder -n $LAUNCHER "\$@"
EOF
chmod +x launch.sh
MICROVM=$WORK/launch.sh
vm net run vmi.yaml --pod-network --termination-log "$WORK/term.log"
kill $client 2>/dev/null
i=0
while kill -0 $listener 2>/dev/null && [ ! -s from-guest.txt ] && [ $i -lt 20 ]; do
	i=$((i + 1))
	sleep 0.1
done
kill $listener 2>/dev/null
wait $client $listener 2>/dev/null
echo "check node got $(cat from-guest.txt 2>/dev/null)"
# netstat shows the peer as ADDR:PORT, IPv4-mapped (::ffff:ADDR) when nc listens on IPv6.
echo "check node peer raw $(cat peer.txt 2>/dev/null)"
echo "check node peer $(sed 's/:[0-9]*$//; s/^::ffff://' peer.txt 2>/dev/null)"
sed 's/^/check term /' term.log 2>/dev/null
echo "check pod links after $(inpod ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | tr '\n' ' ')"
pod_network_down
"##;

#[test]
fn masquerade_pod_network_with_a_linux_guest() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    let prep = scenarios::prepare().expect("preparing the test host");
    let sc = Scenario {
        name: "launcher-masquerade",
        script: SCRIPT,
    };
    let r = scenarios::run_suite(&prep, &[sc], echo).expect("running the test host");
    let console = r.console.lines.join("\n");
    assert!(
        !console.contains("=== l1: insmod"),
        "a test-host module failed to load:\n{console}"
    );
    let sec = r
        .section("launcher-masquerade")
        .unwrap_or_else(|| panic!("no output; console:\n{console}"));
    let out = sec.vm_lines("net").join("\n");
    let checks = sec.values("check ");
    let ctx = format!("checks: {checks:?}\nlauncher and guest:\n{out}");
    for bad in [
        "module",
        "no pod netns",
        "veth failed",
        "netns move failed",
        "node client gave up",
    ] {
        assert!(!checks.iter().any(|c| c.starts_with(bad)), "{ctx}");
    }
    // DHCP from the launcher's server: the guest's udhcpc configured 10.0.2.2/24.
    assert!(out.contains("microvirt: eth0 10.0.2.2/24"), "{ctx}");
    // VM -> node through SNAT: the node's server saw the pod IP, not 10.0.2.2.
    assert!(out.contains("microvirt: net sent"), "{ctx}");
    assert!(checks.contains(&"node got hello-from-guest"), "{ctx}");
    assert!(checks.contains(&"node peer 10.244.0.5"), "{ctx}");
    // node -> pod IP through DNAT: the guest's server got the node's message.
    assert!(out.contains("microvirt: net got hello-from-node"), "{ctx}");
    // The guest powered off (ACPI S5) and the launcher exited 0 after a guest shutdown.
    assert!(out.contains("microvirt: poweroff"), "{ctx}");
    assert_eq!(sec.vm_exit("net").as_deref(), Some("0"), "{ctx}");
    assert!(checks.contains(&"term reason=GuestShutdown"), "{ctx}");
    // run mode removes what it set up in the pod netns when it exits.
    let after = checks
        .iter()
        .find(|c| c.starts_with("pod links after"))
        .unwrap_or_else(|| panic!("no pod links line: {ctx}"));
    assert!(
        !after.contains("k6t-eth0") && !after.contains("tap0"),
        "pod network left behind: {after}\n{ctx}"
    );
}
