//! A Debian cloud image booted as KubeVirt boots one, inside the QEMU-TCG test host
//! (tests/testhost): `virt-launcher run` of a VMI that names no kernel and has one disk, a GPT
//! disk with an ext4 root holding Debian bookworm's stock `linux-image-cloud-amd64` kernel and
//! its initramfs-tools initramfs under `/boot` and a Debian-style `/boot/grub/grub.cfg`
//! (`microvirt_testhost::stock::cloud_image`, built from Debian's packages and cached), three
//! times: as a containerDisk in qcow2 (`qemu-img convert -O qcow2 -c`), as a raw containerDisk,
//! and as a raw PVC (`disk.img` in the claim's directory). Each time the launcher boots the
//! image's own kernel with the grub.cfg's command line (`root=UUID=`); the root's init
//! (`guest-images/stock/init`, `microvirt.scenario=reboot-once`) reboots once and powers off
//! through ACPI on its second boot: one launcher process, one in-place reboot, ending as a guest
//! power-off. The containerDisks are unchanged (their overlays took the writes); the PVC took
//! them. (The same layout with systemd and cloud-init: `testhost_systemd.rs`.)

use microvirt_testhost::scenarios::{self, Scenario, Section};
use microvirt_testhost::stock;

const SCRIPT: &str = r##"
[ -x /bin/virt-launcher ] && MICROVM=/bin/virt-launcher
VM_TIMEOUT=900
# vmi NAME VOLUME-SOURCE: a KubeVirt-style VMI whose only disk is that volume.
vmi() {
	cat > "$1.yaml" <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: debian-$1}
spec:
  terminationGracePeriodSeconds: 30
  domain:
    cpu: {cores: 2}
    memory: {guest: 512Mi}
    devices:
      disks: [{name: bootdisk, disk: {bus: virtio}}]
  volumes:
    - name: bootdisk
      $2
EOF
}
# boot NAME: runs the VMI; polls the control socket until its status counts the reboot.
boot() {
	(
		until [ -e "$WORK/$1.rc" ]; do
			s=$("$MICROVM" status --socket "$WORK/$1.sock" 2>/dev/null)
			case "$s" in *'"reboots":1'*) echo "check $1 status $s"; break ;; esac
			sleep 1
		done
	) &
	_poller=$!
	vm "$1" run "$1.yaml" --control-socket "$WORK/$1.sock" --termination-log "$WORK/$1.term"
	wait $_poller
	sed "s/^/check $1 term /" "$WORK/$1.term"
}
# The qcow2 containerDisk (the overlay takes the writes; the image stays as it was).
cp "$CLOUD_QCOW2" debian-cloud.qcow2
before=$(sha debian-cloud.qcow2)
vmi cloud "containerDisk: {image: local, path: \"$WORK/debian-cloud.qcow2\"}"
boot cloud
[ "$(sha debian-cloud.qcow2)" = "$before" ] && echo "check cloud image unchanged"
# The same disk raw, as a containerDisk.
before=$(sha "$CLOUD_RAW")
vmi raw "containerDisk: {image: local, path: \"$CLOUD_RAW\"}"
boot raw
[ "$(sha "$CLOUD_RAW")" = "$before" ] && echo "check raw image unchanged"
# The same raw disk as a PVC (volumeMode Filesystem: the claim's disk.img); writes go to it.
mkdir pvc
cp "$CLOUD_RAW" pvc/disk.img
vmi pvc "persistentVolumeClaim: {claimName: \"$WORK/pvc\"}"
boot pvc
[ "$(sha pvc/disk.img)" != "$before" ] && echo "check pvc written"
"##;

#[test]
fn debian_cloud_image_boots_its_own_kernel_from_qcow2_raw_and_pvc_and_reboots_in_place() {
    // Set before the harness reads it; this test binary has no other test.
    std::env::set_var("MICROVIRT_MICROVM", env!("CARGO_BIN_EXE_virt-launcher"));
    let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
    let g = stock::build().expect("building the stock Debian guest");
    let cloud = stock::cloud_image(&g).expect("building the Debian cloud image");
    let mut prep = scenarios::prepare().expect("preparing the test host");
    prep.guest_files
        .push(("CLOUD_QCOW2".into(), cloud.qcow2.clone()));
    prep.guest_files
        .push(("CLOUD_RAW".into(), cloud.raw.clone()));
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
    let checks = sec.values("check ");
    for vm in ["cloud", "raw", "pvc"] {
        assert_booted_twice(sec, vm, &cloud.release);
    }
    assert!(checks.contains(&"cloud image unchanged"), "{checks:?}");
    assert!(checks.contains(&"raw image unchanged"), "{checks:?}");
    assert!(
        checks.contains(&"pvc written"),
        "the guest's writes did not reach the PVC's disk.img: {checks:?}"
    );
}

/// The VM `vm` of the scenario booted the image's own kernel from its grub.cfg, rebooted in
/// place once and powered off on its second boot.
fn assert_booted_twice(sec: &Section, vm: &str, release: &str) {
    let lines = sec.vm_lines(vm);
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
    let chosen = lines
        .iter()
        .find(|l| l.contains("boot disk \"bootdisk\":"))
        .unwrap_or_else(|| panic!("{vm}: the launcher did not log the disk's kernel:\n{out}"));
    assert!(
        chosen.contains(&format!("kernel /boot/vmlinuz-{release}"))
            && chosen.contains("1 initrd(s)")
            && chosen.contains(&format!("root=UUID={uuid} ro {}", stock::CLOUD_ARGS)),
        "{vm}: not the grub.cfg's default entry: {chosen}"
    );

    // Both boots: Debian's own kernel, the grub.cfg's command line, root found by UUID on
    // the first partition of the disk, two vCPUs through ACPI.
    let kernels = guest("kernel");
    assert_eq!(
        kernels.len(),
        2,
        "{vm}: two boots expected: {kernels:?}\n{out}"
    );
    assert!(
        kernels
            .iter()
            .all(|k| k == release && k.ends_with("-cloud-amd64")),
        "{vm}: not the image's kernel ({kernels:?}, image has {release}):\n{out}"
    );
    for c in guest("cmdline") {
        assert!(
            c.contains(&format!("root=UUID={uuid} ro "))
                && c.contains("microvirt.scenario=reboot-once"),
            "{vm}: the guest's command line is not the grub.cfg's: {c}"
        );
        assert!(
            !c.contains("root=/dev/vda"),
            "{vm}: a default root= is on the command line: {c}"
        );
        assert!(
            !c.contains("single"),
            "{vm}: the recovery entry booted: {c}"
        );
    }
    assert_eq!(
        guest("root"),
        vec!["/dev/vda1 ext4", "/dev/vda1 ext4"],
        "{vm}: the root is not partition 1 of the disk:\n{out}"
    );
    assert_eq!(
        guest("cpus online"),
        vec!["0-1 nproc 2", "0-1 nproc 2"],
        "{vm}: two vCPUs (MADT) on each boot expected:\n{out}"
    );
    assert_eq!(
        guest("init up").len(),
        2,
        "{vm}: the root's init did not run twice:\n{out}"
    );

    // The first boot wrote its count to the disk and rebooted; the second found it there.
    assert_eq!(
        guest("boot"),
        vec!["1", "2"],
        "{vm}: the boot count did not survive the in-place reboot:\n{out}"
    );
    assert_eq!(guest("reboot").len(), 1, "{vm}: {out}");
    assert!(
        guest("still running after reboot").is_empty(),
        "{vm}: reboot -f returned:\n{out}"
    );
    let reboots: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("the guest rebooted in place (reboot "))
        .collect();
    assert_eq!(
        reboots.len(),
        1,
        "{vm}: the launcher did not log exactly one in-place reboot: {reboots:?}\n{out}"
    );
    assert!(reboots[0].contains("(reboot 1)"), "{vm}: {reboots:?}");
    let checks = sec.values(&format!("check {vm} "));
    assert!(
        checks
            .iter()
            .any(|c| c.starts_with("status ") && c.contains("\"reboots\":1")),
        "{vm}: the control socket's status never counted the reboot: {checks:?}"
    );

    // The second boot powered off through ACPI S5: the one launcher process ends cleanly.
    assert_eq!(guest("poweroff").len(), 1, "{vm}: {out}");
    assert_eq!(
        sec.vm_exit(vm).as_deref(),
        Some("0"),
        "{vm}: virt-launcher did not exit 0:\n{out}"
    );
    assert!(
        checks.contains(&"term reason=GuestShutdown"),
        "{vm}: {checks:?}"
    );
    assert!(
        checks.contains(&"term guest powered off"),
        "{vm}: the VM did not end as a guest power-off: {checks:?}"
    );
}
