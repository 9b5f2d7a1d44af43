//! Build and test orchestration for microvirt: `cargo xtask <command>`.
//!
//! Each concern lives in its own module; this file only dispatches.

use anyhow::{bail, Result};

mod bench;
mod cluster;
mod demo;
mod fuzz;
mod images;
mod oci_images;
mod setup;
mod test;
mod testhost;

/// The repository root (the workspace this xtask belongs to).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn usage() -> &'static str {
    "usage: cargo xtask <command>\n\
     commands:\n\
     \x20 test            set up this machine (packages, cached artifacts) and run every test\n\
     \x20 demo [ARGS]     build microvm and the test guest, boot it here (console on this terminal)\n\
     \x20 fuzz [--secs N] [--jobs N] [TARGET...]  coverage-guided fuzzing (libFuzzer) of every fuzz target\n\
     \x20 bench [RUNS] [--snapshot-only|--boot-only] [--rt] [--microvm-bin PATH] [--launcher-bin PATH]  VMM benchmarks on /dev/kvm: start-to-guest, memory overhead, boots/s, snapshot/restore\n\
     \x20 images          build (or find cached) the guest kernel + rootfs, print their paths\n\
     \x20 testhost [SCENARIO...|--list]  run end-to-end scenarios in the QEMU-TCG test host\n\
     \x20 bench-testhost [RUNS] [--initrd] [--kernel VMLINUX] [--append ARGS] [--boot-log] [--snapshot-only] [--shmem-thp MODE] [--no-qemu] [--boot-only] [--variant-append ARGS]  microvm vs QEMU -M microvm boot time and RSS, Linux restores, in the test host\n\
     \x20 bench-stock [RUNS]  Debian's stock cloud kernel + initramfs: microvm vs QEMU -M microvm,acpi=on start -> init, in the test host\n\
     \x20 bench-systemd [RUNS]  a Debian cloud image with systemd: microvm vs QEMU -M microvm,acpi=on start -> multi-user.target, in the test host\n\
     \x20 bench-oci [RUNS]  a Python OCI image: runc container vs VMI vs VMI restored from a snapshot, start -> first line, -> HTTP answer, memory, in the test host\n\
     \x20 bench-disk [RUNS] [--boots N]  guest O_DIRECT reads of a raw, qcow2 and qcow2 -c disk: microvm vs QEMU, in the test host\n\
     \x20 cluster up [--control-plane-only]|down|status  a persistent single-node cluster with\n\
     \x20                 microvirt installed (or only etcd + kube-apiserver)\n\
     \x20 bench-node [COUNT] | --pool [COUNT] [--rounds N] [--guest-mib MIB]  real-node benchmark: VMI create -> Running/Ready\n\
     \x20                 latency, memory per VMI; --pool: cold VMIRS vs warm VM pool scale-out, warm members' memory\n\
     \x20 oci-images [--no-linux]  build microvirt's container images (OCI archives), print them\n\
     \x20 testguest       build the no_std test guest, print its image paths (pvh, linux64, bzimage)\n"
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let rest = args.get(1..).unwrap_or(&[]);
    match cmd {
        "help" | "-h" | "--help" => {
            print!("{}", usage());
            Ok(())
        }
        "bench" => bench::main(rest),
        "test" => test::main(rest),
        "demo" => demo::main(rest),
        "fuzz" => fuzz::main(rest),
        "cluster" => cluster::main(rest),
        "images" => images::main(rest),
        "oci-images" => oci_images::main(rest),
        "bench-node" => bench::node::main(rest),
        "testhost" => testhost::main(rest),
        "bench-testhost" => testhost::bench_main(rest),
        "bench-stock" => testhost::bench_stock_main(rest),
        "bench-systemd" => testhost::bench_systemd_main(rest),
        "bench-oci" => testhost::bench_oci_main(rest),
        "bench-disk" => testhost::bench_disk_main(rest),
        "testguest" => {
            let a = testguest_build::build()?;
            println!("pvh {}", a.pvh.display());
            println!("linux64 {}", a.linux64.display());
            println!("bzimage {}", a.bzimage.display());
            Ok(())
        }
        _ => {
            bail!("unknown command {cmd:?}\n{}", usage())
        }
    }
}
