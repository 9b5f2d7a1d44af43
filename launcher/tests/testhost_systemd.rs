//! A Debian cloud image with systemd and cloud-init, booted as KubeVirt boots one, inside the
//! QEMU-TCG test host (tests/testhost): `virt-launcher run --pod-network` of a KubeVirt-style VMI
//! whose only disks are a qcow2 containerDisk (a GPT disk with Debian bookworm's stock
//! `linux-image-cloud-amd64`, initramfs-tools, systemd, udev, dbus and cloud-init, and a
//! `/boot/grub/grub.cfg`: `microvirt_testhost::systemd_guest`, built from Debian's packages and
//! cached) and its `cloudInitNoCloud` user data. The VMI declares no interfaces: it gets the pod
//! network by default (masquerade, KubeVirt's `autoattachPodInterface`), in a namespace the test
//! makes.
//!
//! One launcher process, two systemd boots:
//! 1. the image's own kernel boots with two vCPUs (ACPI MADT) and its disks found through ACPI;
//!    systemd reaches `multi-user.target`; systemd-networkd gets the pod network's DHCP lease;
//!    cloud-init runs the user data: `write_files`, `bootcmd`, `runcmd` (which starts a
//!    Python HTTP server that the "node" fetches through the pod IP, as the kubelet's httpGet
//!    probe would, writes a file, then `systemctl reboot`s);
//! 2. the reboot happens in place (the launcher counts it; the VM keeps running); the second
//!    boot finds the file the first one wrote (the containerDisk's overlay), cloud-init does not
//!    run the per-instance `runcmd` again, systemd reaches `multi-user.target` again;
//! 3. the launcher's soft stop (SIGTERM, as the kubelet sends it) presses the ACPI power button
//!    once logind watches it: logind logs `Power key pressed` (its log is on the console through
//!    the drop-in the user data wrote), systemd powers off, and the VM ends as a guest power-off
//!    (exit 0, `GuestShutdown`). The base image is unchanged.
//!
//! Test-host time ~8-10 min (each systemd boot ~3.5 min under nested TCG), the longest scenario
//! of the suite; the waits are on console lines, never on elapsed time.

use microvirt_testhost::scenarios::{self, Scenario};
use microvirt_testhost::{stock, systemd_guest};

const SCRIPT: &str = r##"
LAUNCHER=$MICROVM
[ -x /bin/virt-launcher ] && LAUNCHER=/bin/virt-launcher
VM_TIMEOUT=1800
pod_network_up
before=$(sha "$SYSTEMD_QCOW2")
tok=$(token)
echo "check token $tok"
cat > vmi.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: debian-systemd}
spec:
  terminationGracePeriodSeconds: 600
  domain:
    cpu: {cores: 2}
    memory: {guest: 512Mi}
    devices:
      disks:
        - {name: containerdisk, disk: {bus: virtio}}
        - {name: cloudinitdisk, disk: {bus: virtio}}
  volumes:
    - name: containerdisk
      containerDisk: {image: local, path: "$SYSTEMD_QCOW2"}
    - name: cloudinitdisk
      cloudInitNoCloud:
        userData: |
          #cloud-config
          write_files:
            - path: /etc/systemd/system/systemd-logind.service.d/console.conf
              content: |
                [Service]
                Environment=SYSTEMD_LOG_TARGET=console
                StandardOutput=journal+console
                StandardError=journal+console
            - path: /var/lib/web/token
              content: "$tok"
            - path: /var/lib/cloud/scripts/per-boot/microvirt-check.sh
              permissions: "0755"
              content: |
                #!/bin/sh
                # cloud-final runs this on every boot, after multi-user.target (bounded wait).
                i=0
                until systemctl is-active -q multi-user.target || [ \$i -ge 600 ]; do i=\$((i + 1)); sleep 1; done
                echo "microvirt-check final multi-user=\$(systemctl is-active multi-user.target)" > /dev/ttyS0
          bootcmd:
            - echo "microvirt-check boot ran=\$(cat /var/lib/microvirt-ran 2>/dev/null)" > /dev/ttyS0
          runcmd:
            - echo "microvirt-check runcmd nproc=\$(nproc) addr=\$(ip -4 -o addr show dev eth0 | awk '{print \$4}') instance=\$(cloud-init query instance_id)" > /dev/ttyS0
            - echo "$tok" > /var/lib/microvirt-ran
            - systemd-run --unit=web python3 -m http.server 8080 --directory /var/lib/web
            - timeout 900 sh -c 'until journalctl -u web | grep -q "GET /token"; do sleep 1; done' && echo "microvirt-check served" > /dev/ttyS0
            - systemctl reboot
EOF
# The launcher in the pod's network namespace (named virt-launcher: the stall watch speaks its
# control syntax).
mkdir -p pod
cat > pod/virt-launcher <<EOF
#!/bin/sh
# The VM's process (exec keeps the pid); not the stall watch's vcpu-state calls.
[ "\$1" = run ] && echo \$\$ > $WORK/launcher.pid
MICROVIRT_RESOLV_CONF=$WORK/resolv.conf exec nsenter -t $holder -n $LAUNCHER "\$@"
EOF
chmod +x pod/virt-launcher
MICROVM=$WORK/pod/virt-launcher
# The "node": fetch the guest's web server through the pod IP (DNAT to the guest), as a
# kubelet's httpGet probe does; then, on the second boot, the soft stop once logind watches the
# power button; then the control socket's status while the VM runs.
(
	until grep -q "microvirt-check runcmd" "$WORK/sd.log" 2>/dev/null; do
		[ -e "$WORK/sd.rc" ] && exit 0
		sleep 1
	done
	# (busybox-static's wget crashes; an HTTP/1.0 GET over nc is what the probe sends.)
	i=0
	until resp=$(printf 'GET /token HTTP/1.0\r\nHost: 10.244.0.5\r\n\r\n' |
		nc -w 5 10.244.0.5 8080 2>/dev/null | tr -d '\r') && [ -n "$resp" ]; do
		i=$((i + 1))
		[ $i -ge 600 ] && { echo "check web never answered"; break; }
		[ -e "$WORK/sd.rc" ] && exit 0
		sleep 1
	done
	echo "check web status $(echo "$resp" | head -n 1)"
	echo "check web body $(echo "$resp" | tail -n 1)"
	# The second boot at multi-user.target (its per-boot script says so), its logind watching
	# the power button (logind's console drop-in is written by the first boot's cloud-init).
	# (systemd's own "Reached target" line is not reliable on a console a getty also uses.)
	until sed -n '/rebooted in place/,$p' "$WORK/sd.log" > "$WORK/boot2.log" &&
		grep -q "Watching system buttons on .*Power Button" "$WORK/boot2.log" &&
		grep -q "microvirt-check final multi-user=" "$WORK/boot2.log"; do
		[ -e "$WORK/sd.rc" ] && exit 0
		sleep 1
	done
	echo "check status $("$LAUNCHER" status --socket "$WORK/ctl.sock" 2>&1)"
	echo "check soft stop $(cut -d' ' -f1 /proc/uptime)"
	kill -TERM "$(cat "$WORK/launcher.pid")"
) &
node=$!
vm sd run vmi.yaml --pod-network --control-socket "$WORK/ctl.sock" --termination-log "$WORK/term.log"
wait $node
[ "$(sha "$SYSTEMD_QCOW2")" = "$before" ] && echo "check image unchanged"
sed 's/^/check term /' "$WORK/term.log"
pod_network_down
"##;

#[test]
fn debian_systemd_cloud_image_boots_runs_user_data_reboots_in_place_and_powers_off() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    let boot = stock::build().expect("building the stock Debian guest");
    let g = systemd_guest::build(&boot).expect("building the systemd Debian cloud image");
    let mut prep = scenarios::prepare().expect("preparing the test host");
    prep.guest_files
        .push(("SYSTEMD_QCOW2".into(), g.qcow2.clone()));
    eprintln!(
        "[systemd] {} {} (kernel {}) in {}",
        boot.kernel_package,
        boot.kernel_version,
        g.release,
        g.qcow2.display()
    );
    let sc = Scenario {
        name: "launcher-systemd",
        script: SCRIPT,
    };
    let r = scenarios::run_suite(&prep, &[sc], echo).expect("running the test host");
    eprintln!(
        "[systemd] test host {} in {:.1} s; log: {}",
        r.mode,
        r.console.wall_secs,
        r.console.log.display()
    );
    let sec = r
        .section("launcher-systemd")
        .unwrap_or_else(|| panic!("no output; console:\n{}", r.console.lines.join("\n")));
    let lines = sec.vm_lines("sd");
    let out = lines.join("\n");
    let checks = sec.values("check ");
    let ctx = format!("checks: {checks:?}\nlauncher and guest:\n{out}");
    let guest = |key: &str| -> Vec<String> {
        let p = format!("microvirt-check {key}");
        lines
            .iter()
            .filter_map(|l| {
                l.find(p.as_str())
                    .map(|i| l[i + p.len()..].trim().to_string())
            })
            .collect()
    };
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    let tok = sec.value("check token ").unwrap_or_default().to_string();
    assert!(tok.starts_with("tok"), "{ctx}");

    // The image's own kernel, from its grub.cfg, on both boots.
    let chosen = lines
        .iter()
        .find(|l| l.contains("boot disk \"containerdisk\":"))
        .unwrap_or_else(|| panic!("the launcher did not log the disk's kernel:\n{ctx}"));
    assert!(
        chosen.contains(&format!("kernel /boot/vmlinuz-{}", g.release))
            && chosen.contains(&format!(
                "root=UUID={} ro {}",
                systemd_guest::FS_UUID,
                systemd_guest::ARGS
            )),
        "not the grub.cfg's default entry: {chosen}"
    );

    // Two boots to multi-user, nothing failed on either.
    assert_eq!(
        guest("final"),
        vec!["multi-user=active", "multi-user=active"],
        "systemd did not reach multi-user.target on both boots:\n{ctx}"
    );
    assert_eq!(count("FAILED"), 0, "a unit failed:\n{ctx}");
    // bootcmd runs on every boot; the second boot sees what the first wrote (overlay).
    assert_eq!(
        guest("boot ran="),
        vec![String::new(), tok.clone()],
        "bootcmd did not run on both boots, or the first boot's file did not survive the reboot:\n{ctx}"
    );
    // runcmd (per instance) ran once: two vCPUs, the DHCP lease of the masquerade network,
    // the instance id of the NoCloud meta-data.
    let runcmd = guest("runcmd");
    assert_eq!(runcmd.len(), 1, "runcmd did not run exactly once:\n{ctx}");
    assert!(
        runcmd[0].starts_with("nproc=2 addr=10.0.2.2/24 instance="),
        "{runcmd:?}"
    );
    assert!(
        !runcmd[0].ends_with("instance="),
        "cloud-init has no instance id: {runcmd:?}"
    );
    // The node reached the guest's service through the pod IP.
    assert!(
        checks.contains(&format!("web body {tok}").as_str())
            && checks.contains(&"web status HTTP/1.0 200 OK"),
        "the guest's web server was not reached through the pod IP:\n{ctx}"
    );
    assert_eq!(guest("served").len(), 1, "{ctx}");

    // The in-place reboot: one launcher process, one reboot counted, the VM kept running.
    assert_eq!(
        count("the guest rebooted in place (reboot 1)"),
        1,
        "the launcher did not log one in-place reboot:\n{ctx}"
    );
    assert!(
        checks.iter().any(|c| c.starts_with("status ")
            && c.contains("\"reboots\":1")
            && c.contains("\"state\":\"running\"")),
        "the control socket's status did not count the reboot with the VM running: {checks:?}"
    );

    // The soft stop pressed the power button; logind saw it; systemd powered off (ACPI S5).
    assert_eq!(
        count("asking the guest to shut down: ACPI power button"),
        1,
        "the launcher did not take SIGTERM as a soft stop with the power button:\n{ctx}"
    );
    assert!(
        count("Power key pressed") >= 1,
        "logind did not log the power key:\n{ctx}"
    );
    assert!(count("reboot: Power down") == 1, "no S5 power-off:\n{ctx}");
    assert_eq!(
        count("it gets the pod network by default"),
        1,
        "the launcher did not give the VMI the default pod interface:\n{ctx}"
    );
    assert_eq!(
        sec.vm_exit("sd").as_deref(),
        Some("0"),
        "virt-launcher did not exit 0:\n{ctx}"
    );
    assert!(checks.contains(&"term reason=GuestShutdown"), "{ctx}");
    assert!(
        checks.contains(&"term guest powered off after the shutdown request"),
        "{ctx}"
    );
    assert!(checks.contains(&"term shutdownRequested=signal"), "{ctx}");
    assert!(checks.contains(&"image unchanged"), "{ctx}");
}
