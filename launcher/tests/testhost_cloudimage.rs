//! A Debian cloud image booted as KubeVirt boots one, inside the QEMU-TCG test host
//! (tests/testhost): `virt-launcher run` of a VMI that names no kernel and has only a
//! containerDisk, whose image is a `qemu-img convert -O qcow2 -c` of a GPT disk with an ext4
//! root holding Debian bookworm's stock `linux-image-cloud-amd64` kernel and its initramfs-tools
//! initramfs under `/boot` and a Debian-style `/boot/grub/grub.cfg`
//! (`microvirt_testhost::stock::cloud_image`, built from Debian's packages and cached). The
//! launcher boots the image's own kernel with the grub.cfg's command line (`root=UUID=`); the
//! root's init (`guest-images/stock/init`, `microvirt.scenario=reboot-once`) reboots once and
//! powers off through ACPI on its second boot: one launcher process, one in-place reboot,
//! ending as a guest power-off.

use microvirt_testhost::scenarios::{self, Scenario};
use microvirt_testhost::stock;

const SCRIPT: &str = r##"
[ -x /bin/virt-launcher ] && MICROVM=/bin/virt-launcher
VM_TIMEOUT=600
cp "$CLOUD_QCOW2" debian-cloud.qcow2
before=$(sha debian-cloud.qcow2)
cat > vmi.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: debian-cloud}
spec:
  terminationGracePeriodSeconds: 30
  domain:
    cpu: {cores: 2}
    memory: {guest: 512Mi}
    devices:
      disks: [{name: containerdisk, disk: {bus: virtio}}]
  volumes:
    - name: containerdisk
      containerDisk: {image: local, path: "$WORK/debian-cloud.qcow2"}
EOF
# The control socket's status once it counts the reboot (polled while the launcher runs).
(
	until [ -e "$WORK/cloud.rc" ]; do
		s=$("$MICROVM" status --socket "$WORK/ctl.sock" 2>/dev/null)
		case "$s" in *'"reboots":1'*) echo "check status $s"; break ;; esac
		sleep 1
	done
) &
poller=$!
vm cloud run vmi.yaml --control-socket "$WORK/ctl.sock" --termination-log "$WORK/term.log"
wait $poller
[ "$(sha debian-cloud.qcow2)" = "$before" ] && echo "check image unchanged"
sed 's/^/check term /' "$WORK/term.log"
"##;

#[test]
fn debian_cloud_qcow2_boots_its_own_kernel_and_reboots_in_place() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    let g = stock::build().expect("building the stock Debian guest");
    let cloud = stock::cloud_image(&g).expect("building the Debian cloud image");
    let mut prep = scenarios::prepare().expect("preparing the test host");
    prep.guest_files
        .push(("CLOUD_QCOW2".into(), cloud.qcow2.clone()));
    eprintln!(
        "[cloudimage] {} {} (kernel {}) in {}",
        g.kernel_package,
        g.kernel_version,
        cloud.release,
        cloud.qcow2.display()
    );
    let sc = Scenario {
        name: "launcher-cloudimage",
        script: SCRIPT,
    };
    let r = scenarios::run_suite(&prep, &[sc], echo).expect("running the test host");
    eprintln!(
        "[cloudimage] test host {} in {:.1} s; log: {}",
        r.mode,
        r.console.wall_secs,
        r.console.log.display()
    );
    let sec = r
        .section("launcher-cloudimage")
        .unwrap_or_else(|| panic!("no output; console:\n{}", r.console.lines.join("\n")));
    let lines = sec.vm_lines("cloud");
    let out = lines.join("\n");
    let guest = |key: &str| -> Vec<String> {
        let p = format!("microvirt: {key}");
        lines
            .iter()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix(p.as_str())?;
                (rest.is_empty() || rest.starts_with(char::is_whitespace))
                    .then(|| rest.trim().to_string())
            })
            .collect()
    };

    // The launcher took the kernel, initramfs and command line from the image's grub.cfg.
    let uuid = stock::CLOUD_FS_UUID;
    let release = &cloud.release;
    let chosen = lines
        .iter()
        .find(|l| l.contains("boot disk \"containerdisk\":"))
        .unwrap_or_else(|| panic!("the launcher did not log the disk's kernel:\n{out}"));
    assert!(
        chosen.contains(&format!("kernel /boot/vmlinuz-{release}"))
            && chosen.contains("1 initrd(s)")
            && chosen.contains(&format!("root=UUID={uuid} ro {}", stock::CLOUD_ARGS)),
        "not the grub.cfg's default entry: {chosen}"
    );

    // Both boots: Debian's own kernel, the grub.cfg's command line, root found by UUID on
    // the first partition of the qcow2 containerDisk, two vCPUs through ACPI.
    let kernels = guest("kernel");
    assert_eq!(kernels.len(), 2, "two boots expected: {kernels:?}\n{out}");
    assert!(
        kernels
            .iter()
            .all(|k| k == release && k.ends_with("-cloud-amd64")),
        "not the image's kernel ({kernels:?}, image has {release}):\n{out}"
    );
    for c in guest("cmdline") {
        assert!(
            c.contains(&format!("root=UUID={uuid} ro "))
                && c.contains("microvirt.scenario=reboot-once"),
            "the guest's command line is not the grub.cfg's: {c}"
        );
        assert!(
            !c.contains("root=/dev/vda"),
            "a default root= is on the command line: {c}"
        );
        assert!(!c.contains("single"), "the recovery entry booted: {c}");
    }
    assert_eq!(
        guest("root"),
        vec!["/dev/vda1 ext4", "/dev/vda1 ext4"],
        "the root is not partition 1 of the containerDisk:\n{out}"
    );
    assert_eq!(
        guest("cpus online"),
        vec!["0-1 nproc 2", "0-1 nproc 2"],
        "two vCPUs (MADT) on each boot expected:\n{out}"
    );
    assert_eq!(
        guest("init up").len(),
        2,
        "the root's init did not run twice:\n{out}"
    );

    // The first boot wrote its count to the overlay and rebooted; the second found it there.
    assert_eq!(
        guest("boot"),
        vec!["1", "2"],
        "the boot count did not survive the in-place reboot:\n{out}"
    );
    assert_eq!(guest("reboot").len(), 1, "{out}");
    assert!(
        guest("still running after reboot").is_empty(),
        "reboot -f returned:\n{out}"
    );
    let reboots: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("the guest rebooted in place (reboot "))
        .collect();
    assert_eq!(
        reboots.len(),
        1,
        "the launcher did not log exactly one in-place reboot: {reboots:?}\n{out}"
    );
    assert!(reboots[0].contains("(reboot 1)"), "{reboots:?}");
    let checks = sec.values("check ");
    assert!(
        checks
            .iter()
            .any(|c| c.starts_with("status ") && c.contains("\"reboots\":1")),
        "the control socket's status never counted the reboot: {checks:?}"
    );

    // The second boot powered off through ACPI S5: the one launcher process ends cleanly.
    assert_eq!(guest("poweroff").len(), 1, "{out}");
    assert_eq!(
        sec.vm_exit("cloud").as_deref(),
        Some("0"),
        "virt-launcher did not exit 0:\n{out}"
    );
    assert!(checks.contains(&"term reason=GuestShutdown"), "{checks:?}");
    assert!(
        checks.contains(&"term guest powered off"),
        "the VM did not end as a guest power-off: {checks:?}"
    );
    assert!(checks.contains(&"image unchanged"), "{checks:?}");
}
