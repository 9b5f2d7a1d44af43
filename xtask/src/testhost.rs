//! `cargo xtask testhost [SCENARIO...]`: run end-to-end scenarios by hand in the QEMU-TCG test host
//! (directly on hardware KVM when the host has it), and `cargo xtask bench-testhost [RUNS] [--disk|--initrd]
//! [--snapshot-only]`: the microvm vs QEMU `-M microvm` comparison in the test host, then restores
//! of a Linux guest (only those with `--snapshot-only`).

use anyhow::{bail, Result};
use microvirt_testhost::{bench, scenarios};

pub fn main(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--list") {
        for s in scenarios::ALL {
            println!("{}", s.name);
        }
        return Ok(());
    }
    let selected = scenarios::select(args)?;
    let prep = scenarios::prepare()?;
    let r = scenarios::run_suite(&prep, &selected, true)?;
    eprintln!(
        "\n[testhost] {} scenario(s) {} in {:.1} s; test host ready at {} s guest time; log {}",
        r.sections.len(),
        r.mode,
        r.console.wall_secs,
        r.l1_boot_secs.map_or("-".into(), |s| format!("{s:.2}")),
        r.console.log.display()
    );
    let mut failed = Vec::new();
    for s in &selected {
        let sec = r.section(s.name);
        let rc = sec.and_then(|s| s.rc);
        let vms: Vec<String> = sec
            .map(|sec| {
                sec.values("check vm ")
                    .into_iter()
                    .filter(|v| v.contains("exit="))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        println!("{:<14} script rc={:?}  {}", s.name, rc, vms.join("; "));
        if rc != Some(0) || vms.iter().any(|v| !v.contains("exit=0")) {
            failed.push(s.name);
        }
    }
    if !failed.is_empty() {
        bail!(
            "scenario(s) with a failing script or a non-zero microvm exit: {} (the assertions live in `cargo test -p microvirt-testhost`)",
            failed.join(" ")
        );
    }
    Ok(())
}

pub fn bench_main(args: &[String]) -> Result<()> {
    let mut runs = 5;
    let mut root = bench::RootMode::Disk;
    let mut snapshot_only = false;
    for a in args {
        match a.as_str() {
            "--initrd" => root = bench::RootMode::Initrd,
            "--disk" => root = bench::RootMode::Disk,
            "--snapshot-only" => snapshot_only = true,
            n => runs = n.parse()?,
        }
    }
    let prep = scenarios::prepare()?;
    let (samples, log) = bench::run(
        &prep,
        runs,
        root,
        std::env::var_os("MICROVIRT_VERBOSE").is_some(),
        snapshot_only,
    )?;
    for s in &samples {
        eprintln!("{s:?}");
    }
    println!(
        "root: {root:?}, guest {} MiB, 1 vCPU, medians over the successful runs:",
        bench::GUEST_MIB
    );
    println!("{}", bench::table(&bench::summarize(&samples)));
    eprintln!("[bench] test-host console log: {}", log.display());
    Ok(())
}
