//! `cargo xtask test`: the one command that sets up a fresh machine and runs every test.
//!
//! Phases (each prints a banner and its duration):
//! 1. Debian packages the tests need (apt-get, only what is missing);
//! 2. `cargo fmt --check` and `cargo clippy -D warnings` over the workspace (and over
//!    `microvirt-crds` without its `kube` feature, as the launcher uses it);
//! 3. release build of `microvm` (the end-to-end tests run it inside the test host);
//! 4. `cargo test --workspace`: unit tests, KVM integration tests with the test guest,
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
];

fn phase<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    println!("\n==> {name}");
    let t = Instant::now();
    let r = f();
    println!(
        "<== {name}: {} in {:.1}s",
        if r.is_ok() { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    r
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
    phase("set-up: Debian packages", || ensure_packages(PACKAGES))?;
    // The Go builds (minutes cold, cached by input hash) overlap with everything below.
    let go_builds = std::thread::spawn(|| {
        let t = Instant::now();
        let r = microvirt_testsupport::ensure_binaries()
            .map(|_| ())
            .and_then(|()| microvirt_testsupport::ensure_node_binaries().map(|_| ()));
        (r, t.elapsed())
    });
    if !skip_lint {
        phase("cargo fmt --check", || {
            cargo(&["fmt", "--all", "--", "--check"])
        })?;
        phase("cargo clippy -D warnings", || {
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
        phase(
            "cargo clippy -p microvirt-crds --no-default-features",
            || {
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
            },
        )?;
    }
    let microvm = phase("release build of microvm", || {
        crate::bench::build_release_microvm(&root)
    })?;
    std::env::set_var("MICROVIRT_MICROVM", &microvm);
    let mut test_args = vec!["test", "--workspace"];
    if !extra.is_empty() {
        test_args.push("--");
        test_args.extend(extra);
    }
    let tests = phase("cargo test --workspace", || cargo(&test_args));
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
        phase("fuzzing (every target, from the committed corpus)", || {
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
