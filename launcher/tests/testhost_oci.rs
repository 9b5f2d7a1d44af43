//! VMs booted from an OCI container image (docs/oci-images.md), inside the QEMU-TCG test host
//! (real Linux: the shipped guest kernel with erofs and overlayfs): `virt-launcher run` of VMIs
//! whose only disk is a `containerRootfs` volume. The image is a directory the scenario builds
//! from Debian's `busybox-static` (`rootfs/` with a user `app`, and an OCI image configuration
//! `config.json`: Entrypoint, Cmd, Env, WorkingDir, User). The launcher builds the erofs disk
//! with `mkfs.erofs` inside the test host (once per tree: a cache keyed by the tree's
//! fingerprint, rebuilt when the tree changed) and the initramfs with `microvirt-init` (built
//! static here) and the workload; the init mounts the image under a tmpfs overlay and runs it.
//!
//! - `hello`: the image's Entrypoint with the VMI's `args` and `env`: the workload runs as the
//!   image's user in its working directory, with the image's and the VMI's environment, the
//!   VMI's host name, `/proc` and a writable root; a link out of the image to a file of the
//!   test host reads nothing of it; exit 3 → `WorkloadFailed` "workload exited with status 3",
//!   launcher exit code 6.
//! - `ok`: the VMI's `command` (Entrypoint and Cmd dropped), exit 0 → `GuestShutdown`, exit 0.
//! - `stop`: a workload that traps SIGTERM; the launcher's `shutdown` (the ACPI power button)
//!   reaches it through the init as SIGTERM, and its exit status 0 ends the VM.
//! - `missing`: a command not in the image's PATH → status 127, `WorkloadFailed`.
//! - `web`: a masquerade interface on a pod network (`--pod-network` in a namespace of its
//!   own, as `testhost_network.rs`): the guest kernel's DHCP client (`ip=dhcp`) configures the
//!   NIC from the launcher's DHCP server, the init writes the lease's name server to
//!   `/etc/resolv.conf`, and busybox `httpd` in the workload answers the node through the pod
//!   IP.
//! - `py`, `pyweb`: a Python image from Debian's `python3` (`microvirt_testhost::oci_guest`: no
//!   shell, the image's Entrypoint `python3`, WorkingDir `/srv`, its Env): a script with the
//!   VMI's `args`; `python3 -m http.server` on the pod network answering through the pod IP,
//!   ended by the stop's SIGTERM (status 143, as a container runtime reports it).
//! - `warm`, `restored`: the same Python service snapshotted once it serves (what a warm pool
//!   member will be), stopped, and restored with `run --restore`: the restored VM answers through
//!   the pod IP without the app starting again, and its exit status still reaches the launcher.

use microvirt_testhost::scenarios::{self, Scenario};

const SCRIPT: &str = r##"
[ -x /bin/virt-launcher ] && MICROVM=/bin/virt-launcher
VM_TIMEOUT=300
# Where the launchers keep the erofs images they build, by the tree's fingerprint.
export MICROVIRT_ROOTFS_CACHE=$WORK/rootfs-cache
# The image: busybox, a user, a secret link out of the tree, and its configuration.
mkdir -p img/rootfs/bin img/rootfs/etc img/rootfs/app
cp /bin/busybox img/rootfs/bin/
for a in sh echo cat id pwd hostname sleep true ls mount grep ip httpd mkdir kill; do ln -s busybox "img/rootfs/bin/$a"; done
printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/app:/bin/sh\n' > img/rootfs/etc/passwd
printf 'root:x:0:\napp:x:1000:\n' > img/rootfs/etc/group
chown 1000:1000 img/rootfs/app
secret=$(token)
echo "$secret" > /tmp/host-secret
ln -s /tmp/host-secret img/rootfs/leak
cat > img/config.json <<EOF
{"architecture": "amd64", "os": "linux",
 "config": {"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo image-cmd"],
            "Env": ["PATH=/bin", "FROM_IMAGE=yes", "OVERRIDDEN=image"],
            "WorkingDir": "/app", "User": "app"}}
EOF
# vmi NAME VOLUME-FIELDS: a VMI whose only disk is the image, with these containerRootfs fields.
vmi() {
	cat > "$1.yaml" <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: oci-$1}
spec:
  hostname: web-$1
  terminationGracePeriodSeconds: 60
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: "console=ttyS0 panic=-1 quiet"
        container: {image: local, kernelPath: "$VMLINUX"}
    devices:
      disks: [{name: app}]
  volumes:
    - name: app
      containerRootfs:
        image: local/image
        path: "${IMG:-$WORK/img}"
        $2
EOF
}
run_vmi() {
	vm "$1" run "$1.yaml" --guest-init "$GUEST_INIT" --termination-log "$WORK/$1.term"
	sed "s/^/check $1 term /" "$WORK/$1.term"
}
vmi hello 'args: ["echo out-id $(id -u):$(id -g) out-pwd $(pwd) out-env $FROM_IMAGE/$OVERRIDDEN/$FROM_VMI out-host $(hostname); echo out-leak $(cat /leak 2>/dev/null || echo none); grep -q \"^proc /proc\" /proc/mounts && echo out-proc; echo x > /app/written && echo out-writable; exit 3"]
        env: [{name: OVERRIDDEN, value: vmi}, {name: FROM_VMI, value: "1"}]'
run_vmi hello
grep -q "$secret" "$WORK/hello.log" && echo "check hello leaked the host's secret"
vmi ok 'command: ["/bin/sh", "-c", "echo out-ok $0 $#"]'
run_vmi ok
vmi stop 'command: ["/bin/sh", "-c", "trap \"echo out-got-term; exit 0\" TERM; echo out-waiting; while true; do sleep 1; done"]'
vm stop run stop.yaml --guest-init "$GUEST_INIT" --termination-log "$WORK/stop.term" --control-socket "$WORK/stop.sock" &
# (at a line's start: the launcher's own log names the workload's command, which holds it too)
if wait_line "$WORK/stop.log" "^out-waiting" 1500; then
	"$MICROVM" shutdown --socket "$WORK/stop.sock" && echo "check stop shutdown sent"
fi
wait
sed "s/^/check stop term /" "$WORK/stop.term"
vmi missing 'command: ["no-such-program"]'
run_vmi missing
# web: on the pod network (masquerade): the kernel's DHCP client configures eth0 from the
# launcher's DHCP server and the init writes the lease's name server; busybox httpd answers the
# node through the pod IP (DNAT).
pod_network_up
web_token=$(token)
# fetch_token NAME: GET /index.html through the pod IP until something answers (at most 30
# tries; nc, not wget: the static busybox's wget crashes in glibc's resolver here); says whether
# it was the token, and when (test-host uptime).
fetch_token() {
	i=0
	until got=$(printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 2 10.244.0.5 8080 2>/dev/null | tail -n 1) && [ -n "$got" ]; do
		i=$((i + 1))
		[ $i -ge 30 ] && break
		sleep 0.2
	done
	[ "$got" = "$web_token" ] && echo "check $1 served the token through the pod IP" &&
		echo "check $1 answered $(cut -d' ' -f1 /proc/uptime)"
}
cat > web.sh <<EOF
echo out-ip \$(ip -4 addr show eth0 | grep -o 'inet [0-9./]*')
echo out-\$(grep nameserver /etc/resolv.conf)
mkdir /tmp/www
echo $web_token > /tmp/www/index.html
trap 'kill \$p; wait; exit 0' TERM
httpd -f -p 8080 -h /tmp/www &
p=\$!
echo out-serving
wait
EOF
cp web.sh img/rootfs/web.sh
vmi web 'command: ["/bin/sh", "/web.sh"]'
sed -i 's/^  volumes:/  networks: [{name: default, pod: {}}]\n  volumes:/; s/^      disks: \[{name: app}\]/      disks: [{name: app}]\n      interfaces: [{name: default, masquerade: {}}]/' web.yaml
cat > launch.sh <<EOF
#!/bin/sh
MICROVIRT_RESOLV_CONF=$WORK/resolv.conf exec nsenter -t $holder -n $MICROVM "\$@"
EOF
chmod +x launch.sh
(
	if wait_line "$WORK/web.log" "^out-serving" 1500; then
		fetch_token web
		"$MICROVM" shutdown --socket "$WORK/web.sock"
	fi
) &
client=$!
launcher=$MICROVM
MICROVM=$WORK/launch.sh
vm web run web.yaml --pod-network --guest-init "$GUEST_INIT" --termination-log "$WORK/web.term" --control-socket "$WORK/web.sock"
MICROVM=$launcher
wait $client
sed "s/^/check web term /" "$WORK/web.term"
# The Python image (Debian's python3, no shell; config: Entrypoint python3, WorkingDir /srv).
mkdir -p py/rootfs
tar -xf "$PY_ROOTFS_TAR" -C py/rootfs
cp "$PY_CONFIG" py/config.json
echo "$web_token" > py/rootfs/srv/index.html
IMG=$WORK/py
# py: the image's Entrypoint with the VMI's args; its environment and working directory.
vmi py 'args: ["-c", "import json, os, socket, sys; print(\"out-py\", json.dumps([sys.version_info[0], os.getcwd(), socket.gethostname(), os.environ[\"LANG\"], os.getuid()]))"]'
run_vmi py
# pyweb: python3 -m http.server on the pod network, reached through the pod IP; the stop's
# SIGTERM ends it as it ends it in a container (killed: status 143).
vmi pyweb 'args: ["-m", "http.server", "8080"]'
sed -i 's/^  volumes:/  networks: [{name: default, pod: {}}]\n  volumes:/; s/^      disks: \[{name: app}\]/      disks: [{name: app}]\n      interfaces: [{name: default, masquerade: {}}]/' pyweb.yaml
(
	if wait_line "$WORK/pyweb.log" "^Serving HTTP" 1500; then
		fetch_token pyweb
		"$MICROVM" shutdown --socket "$WORK/pyweb.sock"
	fi
) &
client=$!
MICROVM=$WORK/launch.sh
vm pyweb run pyweb.yaml --pod-network --guest-init "$GUEST_INIT" --termination-log "$WORK/pyweb.term" --control-socket "$WORK/pyweb.sock"
MICROVM=$launcher
wait $client
sed "s/^/check pyweb term /" "$WORK/pyweb.term"
# warm: the same service snapshotted once it serves (a warm pool's member), stopped, and
# restored: the restored VM answers without starting anything again.
cp pyweb.yaml warm.yaml
(
	if wait_line "$WORK/warm.log" "^Serving HTTP" 1500; then
		"$launcher" snapshot "$WORK/warm-snap" --socket "$WORK/warm.sock" >/dev/null && echo "check warm snapshot taken"
		"$launcher" stop --socket "$WORK/warm.sock" >/dev/null
	fi
) &
client=$!
MICROVM=$WORK/launch.sh
vm warm run warm.yaml --pod-network --guest-init "$GUEST_INIT" --control-socket "$WORK/warm.sock"
MICROVM=$launcher
wait $client
(
	if wait_line "$WORK/restored.log" "restored and running" 1500; then
		fetch_token restored
		"$launcher" shutdown --socket "$WORK/restored.sock" >/dev/null
	fi
) &
client=$!
MICROVM=$WORK/launch.sh
vm restored run warm.yaml --restore "$WORK/warm-snap" --pod-network --guest-init "$GUEST_INIT" --termination-log "$WORK/restored.term" --control-socket "$WORK/restored.sock"
MICROVM=$launcher
wait $client
sed "s/^/check restored term /" "$WORK/restored.term"
pod_network_down
"##;

#[test]
fn oci_image_vms_run_their_entrypoint_and_end_with_its_exit_status() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    microvirt_testhost::cmd::ensure_packages(&["erofs-utils"]).expect("installing erofs-utils");
    let init = scenarios::cargo_build_release_static("microvirt-init", "microvirt-init")
        .expect("building microvirt-init (static)");
    let python = microvirt_testhost::oci_guest::build().expect("building the Python image");
    eprintln!(
        "[oci] python3 {} in {}",
        python.version,
        python.rootfs_tar.display()
    );
    let mut prep = scenarios::prepare().expect("preparing the test host");
    prep.guest_files.push(("GUEST_INIT".into(), init));
    prep.guest_files.extend(python.guest_files());
    prep.host_binaries.push("/usr/bin/mkfs.erofs".into());
    let sc = Scenario {
        name: "launcher-oci",
        script: SCRIPT,
    };
    let r = scenarios::run_suite(&prep, &[sc], echo).expect("running the test host");
    eprintln!(
        "[oci] test host {} in {:.1} s; log: {}",
        r.mode,
        r.console.wall_secs,
        r.console.log.display()
    );
    let sec = r
        .section("launcher-oci")
        .unwrap_or_else(|| panic!("no output; console:\n{}", r.console.lines.join("\n")));
    let checks = sec.values("check ");
    let out = |vm: &str| -> Vec<String> {
        sec.vm_lines(vm)
            .iter()
            .filter_map(|l| l.trim().strip_prefix("out-").map(str::to_string))
            .collect()
    };
    let all = |vm: &str| sec.vm_lines(vm).join("\n");
    let term = |vm: &str| -> Vec<String> {
        let p = format!("{vm} term ");
        checks
            .iter()
            .filter_map(|c| c.strip_prefix(p.as_str()).map(str::to_string))
            .collect()
    };

    // hello: the image's Entrypoint, the VMI's args and env over the image's config.
    let hello = out("hello");
    assert_eq!(
        hello.first().map(String::as_str),
        Some("id 1000:1000 out-pwd /app out-env yes/vmi/1 out-host web-hello"),
        "{}",
        all("hello")
    );
    assert!(hello.contains(&"leak none".to_string()), "{hello:?}");
    assert!(hello.contains(&"proc".to_string()), "{hello:?}");
    assert!(hello.contains(&"writable".to_string()), "{hello:?}");
    assert!(
        !checks.contains(&"hello leaked the host's secret"),
        "{checks:?}"
    );
    assert_eq!(
        term("hello")[..3],
        [
            "workload exited with status 3",
            "reason=WorkloadFailed",
            "exitCode=6"
        ],
        "{}",
        all("hello")
    );
    // The init wrote the boot marker once the workload started.
    assert!(
        term("hello").iter().any(|l| l.starts_with("bootTimeMs=")),
        "no boot marker: {:?}",
        term("hello")
    );
    assert_eq!(sec.vm_exit("hello").as_deref(), Some("6"), "{checks:?}");

    // The erofs image: built by the first VM of a tree, found in the cache by the next ones,
    // built again once the tree changed (web.sh was added for `web`).
    for (vm, how) in [
        ("hello", "built in"),
        ("ok", "found in the cache"),
        ("missing", "found in the cache"),
        ("web", "built in"),
        ("py", "built in"),
        ("pyweb", "found in the cache"),
        ("restored", "found in the cache"),
    ] {
        assert!(
            sec.vm_lines(vm)
                .iter()
                .any(|l| l.contains("rootfs-cache/") && l.contains(how)),
            "{vm}: erofs image not {how}:\n{}",
            all(vm)
        );
    }

    // ok: command replaces Entrypoint and Cmd.
    assert_eq!(out("ok"), ["ok /bin/sh 0"], "{}", all("ok"));
    assert_eq!(
        term("ok")[..3],
        [
            "workload exited with status 0",
            "reason=GuestShutdown",
            "exitCode=0"
        ]
    );
    assert_eq!(sec.vm_exit("ok").as_deref(), Some("0"), "{checks:?}");

    // stop: the launcher's shutdown reached the workload as SIGTERM.
    assert!(
        checks.contains(&"stop shutdown sent"),
        "{checks:?}\n{}",
        all("stop")
    );
    assert_eq!(out("stop"), ["waiting", "got-term"], "{}", all("stop"));
    assert_eq!(
        term("stop")[..3],
        [
            "workload exited with status 0",
            "reason=GuestShutdown",
            "exitCode=0"
        ]
    );
    assert!(
        term("stop").contains(&"shutdownRequested=control".to_string()),
        "{:?}",
        term("stop")
    );

    // missing: not in PATH.
    assert!(
        all("missing").contains("\"no-such-program\": executable file not found in PATH \"/bin\""),
        "{}",
        all("missing")
    );
    assert_eq!(sec.vm_exit("missing").as_deref(), Some("6"), "{checks:?}");
    // web: DHCP by the guest kernel, the lease's name server, served through the pod IP.
    assert_eq!(
        out("web")[..3],
        ["ip inet 10.0.2.2/24", "nameserver 10.244.0.1", "serving"],
        "{}",
        all("web")
    );
    assert!(
        checks.contains(&"web served the token through the pod IP"),
        "{checks:?}\n{}",
        all("web")
    );
    assert_eq!(
        term("web")[..3],
        [
            "workload exited with status 0",
            "reason=GuestShutdown",
            "exitCode=0"
        ]
    );
    // py: Debian's python3 with its standard library, as the image configures it.
    assert_eq!(
        out("py"),
        [r#"py [3, "/srv", "web-py", "C.UTF-8", 0]"#],
        "{}",
        all("py")
    );
    assert_eq!(
        term("py")[..3],
        [
            "workload exited with status 0",
            "reason=GuestShutdown",
            "exitCode=0"
        ]
    );
    // pyweb: a Python service on the pod network; stopped by SIGTERM (143, as a container).
    assert!(
        checks.contains(&"pyweb served the token through the pod IP"),
        "{checks:?}\n{}",
        all("pyweb")
    );
    assert_eq!(
        term("pyweb")[..3],
        [
            "workload exited with status 143",
            "reason=WorkloadFailed",
            "exitCode=6"
        ],
        "{}",
        all("pyweb")
    );
    // warm: snapshotted while serving; the restore answers at once, the app not started again,
    // and its exit status still reaches the launcher.
    assert!(
        checks.contains(&"warm snapshot taken"),
        "{checks:?}\n{}",
        all("warm")
    );
    assert!(
        checks.contains(&"restored served the token through the pod IP"),
        "{checks:?}\n{}",
        all("restored")
    );
    assert!(
        !all("restored").contains("Serving HTTP"),
        "the restored app started again:\n{}",
        all("restored")
    );
    assert_eq!(
        term("restored")[..3],
        [
            "workload exited with status 143",
            "reason=WorkloadFailed",
            "exitCode=6"
        ],
        "{}",
        all("restored")
    );
    // Not asserted (a test is no benchmark): the launcher's start → the first answer, cold and
    // restored, in test-host seconds.
    let uptime = |key: &str| -> Option<f64> {
        checks
            .iter()
            .find_map(|c| c.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
    };
    for vm in ["pyweb", "restored"] {
        if let (Some(a), Some(b)) = (
            uptime(&format!("vm {vm} start ")),
            uptime(&format!("{vm} answered ")),
        ) {
            eprintln!(
                "[oci] {vm}: launcher start -> first HTTP answer {:.2} s",
                b - a
            );
        }
    }
    assert_eq!(
        term("missing")[..3],
        [
            "workload exited with status 127",
            "reason=WorkloadFailed",
            "exitCode=6"
        ]
    );
}
