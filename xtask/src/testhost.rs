//! `cargo xtask testhost [SCENARIO...]`: run end-to-end scenarios by hand in the QEMU-TCG test host
//! (directly on hardware KVM when the host has it), and `cargo xtask bench-testhost [RUNS] [--disk|--initrd]
//! [--kernel VMLINUX] [--append ARGS] [--boot-log] [--snapshot-only] [--shmem-thp MODE] [--microvm-bin PATH]
//! [--no-qemu] [--boot-only] [--variant-append ARGS]`: the microvm vs QEMU `-M microvm` comparison in
//! the test host (with `--microvm-bin`, another microvm binary — e.g. an older revision's — as
//! `microvm-base` too; with `--variant-append`, microvm again with ARGS appended, e.g. `acpi=off`),
//! then restores of a Linux guest (only those with `--snapshot-only`, none with `--boot-only`).

use anyhow::{bail, Result};
use microvirt_testhost::{bench, diskbench, scenarios, stock, systemd_guest};

pub fn main(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--list") {
        for s in scenarios::ALL {
            println!("{}", s.name);
        }
        for s in scenarios::STOCK {
            println!("{} (stock Debian kernel; not in `all`)", s.name);
        }
        return Ok(());
    }
    let selected = scenarios::select(args)?;
    let mut prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    if selected.iter().any(scenarios::needs_stock_guest) {
        scenarios::add_stock_guest(&mut prep)?;
    }
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
    let mut o = bench::BenchOptions {
        runs: 5,
        root: bench::RootMode::Disk,
        kernel: None,
        append: String::new(),
        boot_log: false,
        snapshot_only: false,
        shmem_thp: None,
        baseline_microvm: None,
        no_qemu: false,
        boot_only: false,
        variant_append: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--initrd" => o.root = bench::RootMode::Initrd,
            "--boot-log" => o.boot_log = true,
            "--snapshot-only" => o.snapshot_only = true,
            "--boot-only" => o.boot_only = true,
            "--no-qemu" => o.no_qemu = true,
            "--microvm-bin" => {
                let p: std::path::PathBuf = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--microvm-bin needs a path"))?
                    .into();
                if !p.is_file() {
                    bail!("--microvm-bin {}: no such file", p.display());
                }
                o.baseline_microvm = Some(p);
            }
            "--shmem-thp" => {
                let m = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--shmem-thp needs a mode"))?;
                if !bench::SHMEM_THP_MODES.contains(&m.as_str()) {
                    bail!(
                        "--shmem-thp {m:?}: expected one of {:?}",
                        bench::SHMEM_THP_MODES
                    );
                }
                o.shmem_thp = Some(m.clone());
            }
            "--disk" => o.root = bench::RootMode::Disk,
            "--kernel" => {
                o.kernel = Some(
                    it.next()
                        .ok_or_else(|| anyhow::anyhow!("--kernel needs a path"))?
                        .into(),
                )
            }
            "--variant-append" => {
                o.variant_append = Some(
                    it.next()
                        .ok_or_else(|| anyhow::anyhow!("--variant-append needs a value"))?
                        .clone(),
                )
            }
            "--append" => {
                o.append = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--append needs a value"))?
                    .clone()
            }
            n => {
                o.runs = n
                    .parse()
                    .map_err(|_| anyhow::anyhow!("unknown argument {n:?}"))?
            }
        }
    }
    if o.snapshot_only && o.boot_only {
        bail!("--snapshot-only and --boot-only exclude each other");
    }
    let prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    let r = bench::run(&prep, &o, std::env::var_os("MICROVIRT_VERBOSE").is_some())?;
    for s in &r.samples {
        eprintln!("{s:?}");
    }
    let summaries = bench::summarize(&r.samples);
    println!(
        "root: {:?}, kernel: {}, guest {} MiB, 1 vCPU, medians over the successful runs:",
        o.root,
        o.kernel
            .as_ref()
            .map_or("shipped guest kernel".to_string(), |k| k
                .display()
                .to_string()),
        bench::GUEST_MIB
    );
    println!("test host THP: {}", r.thp);
    if !o.append.is_empty() {
        println!("extra command line: {}", o.append);
    }
    if !o.snapshot_only {
        println!("{}", bench::table(&summaries));
        println!("KVM exits per boot (medians; sampled from debugfs every 10 ms):\n");
        println!("{}", bench::exit_table(&summaries));
    }
    if !o.boot_only {
        println!("Linux guest restores (microvm):\n");
        println!("{}", bench::restore_table(&summaries));
    }
    if let Some(b) = &o.baseline_microvm {
        println!("microvm-base: {}", b.display());
    }
    if let Some(v) = &o.variant_append {
        println!("{}: microvm with `{v}` appended", bench::VARIANT_NAME);
    }
    if !r.microvm_exit_table.is_empty() {
        println!("microvm --exit-stats of its last run:\n```");
        for l in &r.microvm_exit_table {
            println!("{l}");
        }
        println!("```");
    }
    if o.boot_log {
        use microvirt_testhost::bootlog;
        let syms = bootlog::Symbols::of(o.kernel.as_ref().unwrap_or(&prep.images.vmlinux));
        let log = bootlog::parse(&r.boot_log);
        println!("\nkernel log breakdown of one microvm boot with initcall_debug:\n");
        println!("{}", bootlog::breakdown(&log, 15, &syms).report());
        let qlog = bootlog::parse(&r.qemu_boot_log);
        println!("\nthe same boot under QEMU -M microvm:\n");
        println!("{}", bootlog::breakdown(&qlog, 15, &syms).report());
        if let Some(l) = r.boot_log.iter().find(|l| l.contains("built VM:")) {
            println!("microvm's own start-up (µs per build step): {l}\n");
        }
        let exits: Vec<&String> = r
            .boot_log
            .iter()
            .skip_while(|l| !l.starts_with("exit statistics ("))
            .take_while(|l| l.starts_with("exit statistics (") || l.starts_with("  "))
            .collect();
        if !exits.is_empty() {
            println!("its exits:\n```");
            for l in exits {
                println!("{l}");
            }
            println!("```");
        }
    }
    eprintln!("[bench] test-host console log: {}", r.log.display());
    Ok(())
}

/// `cargo xtask bench-stock [RUNS]`: Debian's stock cloud kernel and initramfs-tools initramfs
/// (tests/testhost/src/stock.rs) under microvm and under QEMU `-M microvm,acpi=on`, RUNS boots
/// each (default 3), interleaved, in one test-host boot; medians of start → the root's init and
/// start → exit after the S5 power-off.
pub fn bench_stock_main(args: &[String]) -> Result<()> {
    let runs: usize = match args.first() {
        Some(n) => n
            .parse()
            .map_err(|_| anyhow::anyhow!("bench-stock [RUNS]: {n:?} is not a number"))?,
        None => 3,
    };
    let guest = stock::build()?;
    let prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    let (samples, console) = stock::bench(
        &prep,
        &guest,
        runs,
        std::env::var_os("MICROVIRT_VERBOSE").is_some(),
    )?;
    let median = |v: &mut Vec<f64>| -> String {
        if v.is_empty() {
            return "-".into();
        }
        v.sort_by(f64::total_cmp);
        format!("{:.1}", v[v.len() / 2])
    };
    println!(
        "{} {} ({}), 512 MiB, 2 vCPUs, {runs} runs each; test-host seconds (log {}):",
        guest.kernel_package,
        guest.kernel_version,
        guest.release,
        console.log.display()
    );
    println!("| VMM | start -> init (runs) | median | start -> exit (median) | guest uptime at init (median) |");
    println!("|---|---|---|---|---|");
    for vmm in ["microvm", "qemu"] {
        let s: Vec<_> = samples.iter().filter(|s| s.vmm == vmm).collect();
        let each: Vec<String> = s
            .iter()
            .map(|s| s.init_secs.map_or("-".into(), |v| format!("{v:.1}")))
            .collect();
        let mut init: Vec<f64> = s.iter().filter_map(|s| s.init_secs).collect();
        let mut exit: Vec<f64> = s.iter().filter_map(|s| s.exit_secs).collect();
        let mut up: Vec<f64> = s.iter().filter_map(|s| s.guest_uptime_at_init).collect();
        println!(
            "| {vmm} | {} | {} | {} | {} |",
            each.join(", "),
            median(&mut init),
            median(&mut exit),
            median(&mut up)
        );
    }
    if samples.len() < 2 * runs || samples.iter().any(|s| s.init_secs.is_none()) {
        bail!("a boot never reached the root's init; see the log");
    }
    Ok(())
}

/// `cargo xtask bench-systemd [RUNS]`: the Debian cloud image with systemd
/// (tests/testhost/src/systemd_guest.rs) under microvm and under QEMU `-M microvm,acpi=on`, RUNS
/// boots each (default 5), interleaved, in one test-host boot; medians of start → the kernel's
/// first line, → systemd's first line, → `multi-user.target`, and microvm's multi-user time as
/// a ratio to QEMU's.
pub fn bench_systemd_main(args: &[String]) -> Result<()> {
    let runs: usize = match args.first() {
        Some(n) => n
            .parse()
            .map_err(|_| anyhow::anyhow!("bench-systemd [RUNS]: {n:?} is not a number"))?,
        None => 5,
    };
    let boot = stock::build()?;
    let guest = systemd_guest::build(&boot)?;
    let prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    let (samples, console) = systemd_guest::bench(
        &prep,
        &guest,
        runs,
        std::env::var_os("MICROVIRT_VERBOSE").is_some(),
    )?;
    let median = bench::median;
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    println!(
        "{} {} ({}) with systemd, 512 MiB, 2 vCPUs, {runs} runs each; test-host seconds from the VMM's start (log {}):",
        boot.kernel_package,
        boot.kernel_version,
        guest.release,
        console.log.display()
    );
    println!(
        "| VMM | -> kernel's first line | -> systemd | -> multi-user.target (runs) | median |"
    );
    println!("|---|---|---|---|---|");
    let mut medians = Vec::new();
    for vmm in ["microvm", "qemu"] {
        let s: Vec<_> = samples.iter().filter(|s| s.vmm == vmm).collect();
        let each: Vec<String> = s.iter().map(|s| show(s.multi_user)).collect();
        let mu = median(s.iter().filter_map(|s| s.multi_user).collect());
        medians.push(mu);
        println!(
            "| {vmm} | {} | {} | {} | {} |",
            show(median(s.iter().filter_map(|s| s.kernel).collect())),
            show(median(s.iter().filter_map(|s| s.systemd).collect())),
            each.join(", "),
            show(mu)
        );
    }
    if let [Some(m), Some(q)] = medians[..] {
        println!(
            "microvm / QEMU, start -> multi-user.target (medians): {:.2}x",
            m / q
        );
    }
    if samples.len() < 2 * runs || samples.iter().any(|s| s.multi_user.is_none()) {
        bail!("a boot never reached multi-user.target; see the log");
    }
    Ok(())
}

/// `cargo xtask bench-disk [RUNS] [--boots N]`: the stock guest reads the same data as a raw disk,
/// a qcow2 and a compressed qcow2 with O_DIRECT (sequential 1 MiB, random 4 KiB;
/// tests/testhost/src/diskbench.rs), RUNS rounds (default 5) per guest boot, N boots per VMM
/// (default 1), microvm and QEMU `-M microvm,acpi=on` alternating, in one test-host boot; medians
/// and the ratios qcow2 / raw and microvm / QEMU.
pub fn bench_disk_main(args: &[String]) -> Result<()> {
    let mut o = diskbench::DiskBenchOptions {
        rounds: 5,
        boots: 1,
    };
    let number = |what: &str, v: Option<&String>| -> Result<usize> {
        let v = v.ok_or_else(|| anyhow::anyhow!("bench-disk: {what} needs a number"))?;
        match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("bench-disk: {what} {v:?} is not a positive number"),
        }
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--boots" => o.boots = number("--boots", it.next())?,
            _ => o.rounds = number("RUNS", Some(a))?,
        }
    }
    let guest = stock::build()?;
    let prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    let (samples, errors, console) = diskbench::bench(
        &prep,
        &guest,
        &o,
        std::env::var_os("MICROVIRT_VERBOSE").is_some(),
    )?;
    println!(
        "{} ({}), 512 MiB, 2 vCPUs; {} MiB disks, {} random 4 KiB reads per round; {} round(s) x {} boot(s) per VMM; medians (log {}):\n",
        guest.kernel_package,
        guest.release,
        diskbench::DATA_MIB,
        diskbench::RANDOM_READS,
        o.rounds,
        o.boots,
        console.log.display()
    );
    println!("{}", diskbench::table(&samples));
    for e in &errors {
        eprintln!("diskread {e}");
    }
    let expected = 2 * diskbench::VMMS.len() * diskbench::DISKS.len() * o.rounds * o.boots;
    if samples.len() < expected || !errors.is_empty() {
        bail!(
            "{} of {expected} measurements, {} error line(s); see the log",
            samples.len(),
            errors.len()
        );
    }
    Ok(())
}

/// `cargo xtask bench-oci [RUNS]`: the Python image of the OCI-image tests
/// (tests/testhost/src/oci_guest.rs) serving HTTP as a runc container, as a VMI (`virt-launcher
/// run`, its erofs image cached) and as a VMI restored from a snapshot taken while it served (a
/// warm pool's claim), RUNS of each (default 5), interleaved, in one test-host boot, all on one
/// pod network; the first VMI also builds the erofs image. Medians of start → the app's first
/// line and → its first HTTP answer through the pod IP, each answer as a ratio to runc's, and
/// memory once it answered.
pub fn bench_oci_main(args: &[String]) -> Result<()> {
    use microvirt_testhost::oci_guest::{self, Sample};
    let runs: usize = match args.first() {
        Some(n) => n
            .parse()
            .map_err(|_| anyhow::anyhow!("bench-oci [RUNS]: {n:?} is not a number"))?,
        None => 5,
    };
    crate::setup::ensure_packages(&["erofs-utils", "runc"])?;
    let image = oci_guest::build()?;
    let launcher = scenarios::cargo_build_release_static("microvirt-launcher", "virt-launcher")?;
    let init = scenarios::cargo_build_release_static("microvirt-init", "microvirt-init")?;
    let prep = scenarios::prepare()?;
    // The console log named at the end stays for the reader.
    prep.keep_workdir();
    let (samples, console) = oci_guest::bench(
        &prep,
        &image,
        &launcher,
        &init,
        runs,
        std::env::var_os("MICROVIRT_VERBOSE").is_some(),
    )?;
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    let of = |kind: &str, f: fn(&Sample) -> Option<f64>| {
        bench::median(
            samples
                .iter()
                .filter(|s| s.kind == kind)
                .filter_map(f)
                .collect(),
        )
    };
    println!(
        "python3 {} (Debian), `python3 -m http.server`, {runs} runs each; test-host seconds from the start command (log {}):",
        image.version,
        console.log.display()
    );
    println!("| start | n | -> first line | -> HTTP answer | / runc's | RSS MiB | PSS MiB |");
    println!("|---|---|---|---|---|---|---|");
    let runc = of("runc", |s| s.answer);
    for kind in ["runc", "vm-uncached", "vm", "restored"] {
        let n = samples
            .iter()
            .filter(|s| s.kind == kind && s.answer.is_some())
            .count();
        let answer = of(kind, |s| s.answer);
        let ratio = match (answer, runc) {
            (Some(a), Some(r)) if r > 0.0 => format!("{:.2}x", a / r),
            _ => "-".into(),
        };
        println!(
            "| {kind} | {n} | {} | {} | {ratio} | {} | {} |",
            show(of(kind, |s| s.first_line)),
            show(answer),
            show(of(kind, |s| s.rss_kib).map(|k| k / 1024.0)),
            show(of(kind, |s| s.pss_kib).map(|k| k / 1024.0)),
        );
    }
    if samples.iter().filter(|s| s.answer.is_some()).count() < 3 * runs + 1 {
        bail!(
            "not every start answered (log {}): {samples:?}",
            console.log.display()
        );
    }
    Ok(())
}
