//! A real Linux guest through `virt-launcher run`, inside the QEMU-TCG test host
//! (tests/testhost; directly on hosts with hardware KVM). Uses the guest images of
//! `guest-images/` (built and cached by microvirt-testhost) and this crate's `virt-launcher`
//! binary in place of `microvm` (the harness copies the binary named by MICROVIRT_MICROVM into the
//! test host with its shared libraries).

use microvirt_testhost::scenarios::{self, Scenario};

/// Boots the ELF vmlinux with its root on a containerDisk (through an overlay) and a
/// cloud-init seed disk, runs the guest's `boot` scenario, and checks the image is unchanged.
const SCRIPT: &str = r##"
[ -x /bin/virt-launcher ] && MICROVM=/bin/virt-launcher
cat > vmi.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: linux}
spec:
  terminationGracePeriodSeconds: 30
  domain:
    cpu: {cores: 1}
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: "root=/dev/vda rw microvirt.scenario=boot"
        container: {image: local, kernelPath: "$VMLINUX"}
    devices:
      disks: [{name: root, serial: rootdisk}, {name: seed}]
  volumes:
    - {name: root, containerDisk: {image: local, path: "$ROOTFS"}}
    - {name: seed, cloudInitNoCloud: {userData: "#cloud-config"}}
EOF
before=$(sha "$ROOTFS")
vm linux run vmi.yaml --termination-log "$WORK/term.log"
[ "$(sha "$ROOTFS")" = "$before" ] && echo "check image unchanged"
sed 's/^/check term /' "$WORK/term.log"
"##;

/// The guest's shell mounts the NoCloud seed disk (VFAT, read-only /dev/vdb) and sets its
/// host name from `meta-data`, as cloud-init's NoCloud source would. The root disk is a PVC
/// given by path (a copy of the rootfs).
const CLOUD_INIT_SCRIPT: &str = r##"
[ -x /bin/virt-launcher ] && MICROVM=/bin/virt-launcher
cp "$ROOTFS" root.ext4
cat > vmi.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: ci-demo, uid: 5f1c-77}
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: "root=/dev/vda rw quiet microvirt.scenario=console"
        container: {image: local, kernelPath: "$VMLINUX"}
    devices:
      disks: [{name: root}, {name: seed}]
  volumes:
    - {name: root, persistentVolumeClaim: {claimName: "$WORK/root.ext4"}}
    - name: seed
      cloudInitNoCloud:
        userData: "#cloud-config from-the-vmi"
EOF
mkfifo in.fifo
(
	i=0
	until grep -q "microvirt: shell ready" ci.log 2>/dev/null; do
		i=$((i + 1))
		[ $i -ge 600 ] && break
		sleep 0.2
	done
	sleep 1
	printf 'mkdir -p /mnt && mount -t vfat -o ro /dev/vdb /mnt && hostname "$(sed -n "s/^local-hostname: //p" /mnt/meta-data)" && echo "cidata: host=$(hostname) $(grep instance-id /mnt/meta-data) user-data=[$(cat /mnt/user-data)] files=$(ls /mnt | tr "\\n" ,)"\n'
	sleep 3
	printf 'exit\n'
	sleep 60
) > in.fifo &
feeder=$!
vm ci run vmi.yaml < in.fifo
kill $feeder 2>/dev/null
"##;

#[test]
fn linux_guest_boots_through_virt_launcher_run() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    let prep = scenarios::prepare().expect("preparing the test host");
    let sc = Scenario {
        name: "launcher-linux",
        script: SCRIPT,
    };
    let ci = Scenario {
        name: "launcher-cloudinit",
        script: CLOUD_INIT_SCRIPT,
    };
    let r = scenarios::run_suite(&prep, &[sc, ci], echo).expect("running the test host");
    let sec = r
        .section("launcher-linux")
        .unwrap_or_else(|| panic!("no output; console:\n{}", r.console.lines.join("\n")));
    let out = sec.vm_lines("linux").join("\n");
    assert_eq!(
        sec.vm_exit("linux").as_deref(),
        Some("0"),
        "virt-launcher did not exit 0:\n{out}"
    );
    assert!(out.contains("microvirt: root /dev/vda ext4"), "{out}");
    assert!(out.contains("virt-launcher: guest booted in "), "{out}");
    let checks = sec.values("check ");
    assert!(checks.contains(&"image unchanged"), "{checks:?}");
    assert!(checks.contains(&"term reason=GuestShutdown"), "{checks:?}");
    assert!(
        checks.iter().any(|c| c.starts_with("term bootTimeMs=")),
        "{checks:?}"
    );

    // The cloud-init NoCloud seed: Linux's vfat reads the launcher's image.
    let sec = r
        .section("launcher-cloudinit")
        .unwrap_or_else(|| panic!("no output; console:\n{}", r.console.lines.join("\n")));
    let out = sec.vm_lines("ci").join("\n");
    assert_eq!(
        sec.vm_exit("ci").as_deref(),
        Some("0"),
        "virt-launcher did not exit 0:\n{out}"
    );
    assert!(
        out.contains(
            "cidata: host=ci-demo instance-id: 5f1c-77 user-data=[#cloud-config from-the-vmi] \
             files=meta-data,user-data,"
        ),
        "{out}"
    );
}
