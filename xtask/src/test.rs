//! `cargo xtask test`: the one command that sets up a fresh machine and runs every test.
//!
//! Phases (each prints a banner and its duration):
//! 1. Debian packages the tests need (apt-get, only what is missing);
//! 2. `cargo fmt --check` and `cargo clippy -D warnings` over the workspace (and over
//!    `microvirt-crds` without its `kube` feature, as the launcher uses it);
//! 3. release build of `microvm` (the end-to-end tests run it inside the test host);
//! 4. `cargo test --workspace --no-fail-fast` (a failing test binary does not keep the later
//!    ones from running): unit tests, KVM integration tests with the test guest,
//!    controller tests against a real kube-apiserver + etcd, the QEMU-TCG test-host
//!    end-to-end scenarios with real Linux guests, and the whole-system tests on a real
//!    single-node cluster (`tests/e2e`). Slow artifacts (guest kernel, rootfs, the Kubernetes
//!    components, containerd, container images) are built once and cached under
//!    ~/.cache/microvirt by content hash. The Go builds start in the background right away, so
//!    they overlap with the Rust compilation; the tests that need them wait for them;
//! 5. fuzzing: every coverage-guided fuzz target in `fuzz/` for [`fuzz::TEST_SECS`] seconds
//!    from the committed corpus (`cargo xtask fuzz`); a crash fails the run and names the
//!    reproducer.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::fuzz;
use crate::setup::ensure_packages;

/// Every Debian package any test needs.
const PACKAGES: &[&str] = &[
    // KVM tests: setpriv (no-/dev/kvm-access test), ip (network namespaces, TAP)
    "util-linux",
    "iproute2",
    // vmm qcow2 tests: images made by qemu-img
    "qemu-utils",
    // launcher boot-disk tests: partition tables (sfdisk) and ext4 file systems (e2fsprogs)
    "fdisk",
    // test host and guest images
    "qemu-system-x86",
    "busybox-static",
    "e2fsprogs",
    "cpio",
    "gzip",
    "xz-utils",
    "linux-source-6.1",
    "bc",
    "flex",
    "bison",
    "libelf-dev",
    "libssl-dev",
    "make",
    "gcc",
    // Go toolchain fallback for kube-apiserver/etcd builds is the machine's /usr/local/go
    "ca-certificates",
    // the real node (tests/support real_node, tests/e2e): runtime, CNI plugins, nft in the
    // node's namespace; objcopy strips the dev binaries that go into the test images
    "runc",
    "containernetworking-plugins",
    "nftables",
    "binutils",
    // vmm/tests/acpi_iasl.rs: iasl -d decodes the ACPI tables
    "acpica-tools",
    // tests/testhost/tests/stock.rs: the stock Debian guest (a chroot with the distribution's
    // kernel and initramfs-tools; a partitioned disk)
    "mmdebstrap",
    "fdisk",
    // launcher/tests/testhost_oci.rs: virt-launcher builds an OCI image's erofs disk
    "erofs-utils",
];

/// The phases of one run, in order. Each is announced and timed; when one fails, the run
/// stops there and says which of the later phases did not run, so a reader of a red log knows
/// what was not checked.
struct Phases {
    /// Phases not started yet.
    ahead: Vec<&'static str>,
}

impl Phases {
    fn new(all: Vec<&'static str>) -> Self {
        Phases { ahead: all }
    }

    fn run<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.ahead.retain(|p| *p != name);
        println!("\n==> {name}");
        let t = Instant::now();
        let r = f();
        println!(
            "<== {name}: {} in {:.1}s",
            if r.is_ok() { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        if r.is_err() {
            self.not_run(name);
        }
        r
    }

    /// Prints what `failed` leaves unchecked.
    fn not_run(&self, failed: &str) {
        if self.ahead.is_empty() {
            println!("(\"{failed}\" was the last phase: every phase ran)");
        } else {
            println!(
                "NOT RUN because \"{failed}\" failed: {}",
                self.ahead.join("; ")
            );
        }
    }
}

fn cargo(args: &[&str]) -> Result<()> {
    let root = crate::workspace_root();
    let st = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(&root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !st.success() {
        bail!("cargo {} failed ({st})", args.join(" "));
    }
    Ok(())
}

/// `cargo test` with `--no-fail-fast`: a failing test binary does not keep the later ones from
/// running (without it cargo stops at the first, and nothing says which binaries never ran);
/// cargo lists the failed targets at the end (`error: N targets failed:`).
fn cargo_test(args: &[&str]) -> Result<()> {
    cargo(args).context(
        "some tests failed; every test target ran, the failed ones are listed above \
         (`error: N targets failed:`)",
    )
}

pub fn main(args: &[String]) -> Result<()> {
    let skip_lint = args.iter().any(|a| a == "--no-lint");
    let skip_fuzz = args.iter().any(|a| a == "--no-fuzz");
    let extra: Vec<&str> = args
        .iter()
        .filter(|a| *a != "--no-lint" && *a != "--no-fuzz")
        .map(String::as_str)
        .collect();
    let root = crate::workspace_root();
    let total = Instant::now();
    const PACKAGES_PHASE: &str = "set-up: Debian packages";
    const FMT: &str = "cargo fmt --check";
    const CLIPPY: &str = "cargo clippy -D warnings";
    const CLIPPY_CRDS: &str = "cargo clippy -p microvirt-crds --no-default-features";
    const MICROVM: &str = "release build of microvm";
    const TEST: &str = "cargo test --workspace";
    const FUZZ: &str = "fuzzing (every target, from the committed corpus)";
    let mut plan = vec![PACKAGES_PHASE];
    if !skip_lint {
        plan.extend([FMT, CLIPPY, CLIPPY_CRDS]);
    }
    plan.extend([MICROVM, TEST]);
    if !skip_fuzz {
        plan.push(FUZZ);
    }
    let mut phases = Phases::new(plan);
    phases.run(PACKAGES_PHASE, || ensure_packages(PACKAGES))?;
    // The Go builds (minutes cold, cached by input hash) overlap with everything below.
    let go_builds = std::thread::spawn(|| {
        let t = Instant::now();
        let r = microvirt_testsupport::ensure_binaries()
            .map(|_| ())
            .and_then(|()| microvirt_testsupport::ensure_node_binaries().map(|_| ()));
        (r, t.elapsed())
    });
    if !skip_lint {
        phases.run(FMT, || cargo(&["fmt", "--all", "--", "--check"]))?;
        phases.run(CLIPPY, || {
            cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
        })?;
        // The launcher builds `microvirt-crds` without its `kube` feature; in the workspace
        // build above features are unified, so check that configuration on its own.
        phases.run(CLIPPY_CRDS, || {
            cargo(&[
                "clippy",
                "-p",
                "microvirt-crds",
                "--no-default-features",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
        })?;
    }
    let microvm = phases.run(MICROVM, || crate::bench::build_release_microvm(&root))?;
    std::env::set_var("MICROVIRT_MICROVM", &microvm);
    let mut test_args = vec!["test", "--workspace", "--no-fail-fast"];
    if !extra.is_empty() {
        test_args.push("--");
        test_args.extend(extra);
    }
    let tests = phases.run(TEST, || cargo_test(&test_args));
    match go_builds.join() {
        Ok((Ok(()), took)) => println!(
            "(background) etcd, Kubernetes components and containerd ready after {:.1}s",
            took.as_secs_f64()
        ),
        Ok((Err(e), _)) => println!("(background) Go builds failed: {e}"),
        Err(_) => println!("(background) Go build thread panicked"),
    }
    tests?;
    if !skip_fuzz {
        phases.run(FUZZ, || {
            let summary = fuzz::run(&fuzz::Options::all(fuzz::TEST_SECS))?;
            println!("{summary}");
            Ok(())
        })?;
    }
    println!(
        "\nall tests passed in {:.1}s",
        total.elapsed().as_secs_f64()
    );
    Ok(())
}
