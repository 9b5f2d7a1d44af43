//! `cargo xtask fuzz [--secs N] [--jobs N] [--sanitizer address|none] [TARGET...]`: build the
//! coverage-guided fuzz targets in `fuzz/` (libFuzzer, with the instrumentation cargo-fuzz uses,
//! by plain `cargo build` on the stable toolchain) and run each for `N` seconds (default 60),
//! starting from the committed corpus `fuzz/corpus/<target>`.
//!
//! New inputs go to a scratch corpus under `fuzz/target/corpus-run/<target>`, never into the
//! committed corpus. A target that crashes, hangs (10 s per input) or runs out of memory fails
//! the command; the reproducer is kept under `fuzz/artifacts/<target>/` and its path printed
//! with the command that replays it. `cargo xtask test` runs this as its fuzz phase
//! ([`TEST_SECS`] per target).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::setup::ensure_packages;

/// Every target (names of the binaries in `fuzz/fuzz_targets/`).
pub const TARGETS: &[&str] = &[
    "mmio_transport",
    "blk_raw",
    "blk_overlay",
    "blk_qcow2",
    "net_rxtx",
    "dhcp_parse",
    "vmi_document",
    "snapshot_state",
    "bootdisk",
    "bootcfg",
];

/// Seconds per target in `cargo xtask test` (issue 12 asks for about a minute each).
pub const TEST_SECS: u64 = 60;

/// Options of one fuzzing session.
#[derive(Clone, Debug)]
pub struct Options {
    pub secs: u64,
    pub jobs: usize,
    pub sanitizer: String,
    pub targets: Vec<String>,
}

impl Options {
    /// Every target for `secs` seconds, as many at a time as there are CPUs.
    pub fn all(secs: u64) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            secs,
            jobs: cpus.min(TARGETS.len()),
            sanitizer: "none".into(),
            targets: TARGETS.iter().map(|t| t.to_string()).collect(),
        }
    }
}

fn usage() -> &'static str {
    "usage: cargo xtask fuzz [--secs N] [--jobs N] [--sanitizer address|none] [TARGET...]\n\
     targets (default: all): mmio_transport blk_raw blk_overlay blk_qcow2 net_rxtx dhcp_parse \
     vmi_document snapshot_state bootdisk bootcfg"
}

pub fn main(args: &[String]) -> Result<()> {
    let mut o = Options::all(60);
    o.targets.clear();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n{}", usage()))
        };
        match a.as_str() {
            "--secs" => {
                o.secs = value("--secs")?
                    .parse()
                    .with_context(|| format!("--secs takes a number of seconds\n{}", usage()))?
            }
            "--jobs" => {
                o.jobs = value("--jobs")?
                    .parse()
                    .with_context(|| format!("--jobs takes a number\n{}", usage()))?
            }
            "--sanitizer" => o.sanitizer = value("--sanitizer")?,
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(());
            }
            t if TARGETS.contains(&t) => o.targets.push(t.to_string()),
            other => bail!("unknown fuzz argument {other:?}\n{}", usage()),
        }
    }
    if o.targets.is_empty() {
        o.targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    if o.jobs == 0 || o.secs == 0 {
        bail!("--jobs and --secs must be at least 1");
    }
    if !matches!(o.sanitizer.as_str(), "address" | "none") {
        bail!("--sanitizer is address or none");
    }
    let summary = run(&o)?;
    println!("{summary}");
    Ok(())
}

fn fuzz_dir() -> PathBuf {
    crate::workspace_root().join("fuzz")
}

/// The instrumentation cargo-fuzz 0.13.2 (`cargo fuzz build -O --debug-assertions`) gives a
/// build: SanitizerCoverage with inline 8-bit counters, the PC table, compare tracing and stack
/// depth for libFuzzer's feedback, no branch folding, `--cfg fuzzing`, one codegen unit, and
/// debug assertions (so integer overflow is a finding too). All of these are stable `rustc`
/// options: without a sanitizer the build needs neither nightly nor cargo-fuzz itself.
const COVERAGE_FLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg",
    "fuzzing",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cdebug-assertions",
    "-Ccodegen-units=1",
];

/// The target triple the fuzz targets are built for (cargo-fuzz's layout:
/// `fuzz/target/<triple>/release/<target>`).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// `RUSTFLAGS` for a build with `sanitizer` (`none` or `address`).
fn rustflags(sanitizer: &str) -> String {
    let mut f = COVERAGE_FLAGS.join(" ");
    if sanitizer == "address" {
        // Nightly-only on this toolchain: unlocked with RUSTC_BOOTSTRAP (see `build`).
        f.push_str(" -Zsanitizer=address");
    }
    f
}

/// Where the libFuzzer binary of `target` is.
fn binary(target: &str) -> PathBuf {
    fuzz_dir()
        .join("target")
        .join(TRIPLE)
        .join("release")
        .join(target)
}

fn build(sanitizer: &str, targets: &[String]) -> Result<()> {
    // libFuzzer itself is C++ (built by libfuzzer-sys).
    ensure_packages(&["g++"])?;
    let dir = fuzz_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .args(["--release", "--target", TRIPLE, "--target-dir"])
        .arg(dir.join("target"))
        .args(["--config", "profile.release.debug=\"line-tables-only\""])
        .env("RUSTFLAGS", rustflags(sanitizer))
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(&dir);
    for t in targets {
        cmd.args(["--bin", t]);
    }
    if sanitizer == "address" {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    let st = cmd
        .status()
        .context("running cargo build for the fuzz targets")?;
    if !st.success() {
        bail!("building the fuzz targets failed ({st})");
    }
    Ok(())
}

/// libFuzzer's `-max_len` for `target`: the snapshot state file's payload is several KiB.
fn max_len(target: &str) -> usize {
    match target {
        "snapshot_state" => 16384,
        // Images of 512-byte clusters made by qemu-img: a few KiB.
        "blk_qcow2" => 16384,
        // Sparse disk images with ext4 file systems: 5 to 20 KiB.
        "bootdisk" => 65536,
        "bootcfg" => 8192,
        _ => 4096,
    }
}

/// What one target's run found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub target: String,
    pub secs: f64,
    pub execs: u64,
    pub cov: u64,
    pub ft: u64,
    pub corpus: u64,
    pub new_units: u64,
    pub peak_rss_mb: u64,
    pub artifact: Option<PathBuf>,
    pub failed: Option<String>,
}

fn field(line: &str, name: &str) -> Option<u64> {
    let rest = line.split(name).nth(1)?;
    let tok = rest.split_whitespace().next()?;
    tok.split('/').next()?.parse().ok()
}

fn run_target(target: &str, o: &Options) -> Result<Report> {
    let root = crate::workspace_root();
    let dir = fuzz_dir();
    let bin = binary(target);
    let corpus = dir.join("corpus").join(target);
    let scratch = dir.join("target/corpus-run").join(target);
    let artifacts = dir.join("artifacts").join(target);
    for d in [&scratch, &artifacts, &corpus] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let log_path = dir.join("target").join(format!("fuzz-{target}.log"));
    let mut child = Command::new(&bin)
        .arg(&scratch)
        .arg(&corpus)
        .arg(format!("-max_total_time={}", o.secs))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg(format!("-max_len={}", max_len(target)))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env(
            "ASAN_OPTIONS",
            std::env::var("ASAN_OPTIONS").map_or("detect_odr_violation=0".into(), |o| {
                format!("{o}:detect_odr_violation=0")
            }),
        )
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let started = Instant::now();
    // libFuzzer reports on stderr; keep the whole log, parse the lines that matter.
    let mut log = Vec::new();
    let mut r = Report {
        target: target.to_string(),
        ..Default::default()
    };
    let stderr = child.stderr.take().expect("piped");
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap_or_default();
        if let Some(c) = field(&line, "cov: ") {
            r.cov = c;
            r.ft = field(&line, "ft: ").unwrap_or(r.ft);
            r.corpus = field(&line, "corp: ").unwrap_or(r.corpus);
        }
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units: ") {
            r.execs = v.trim().parse().unwrap_or(0);
        }
        if let Some(v) = line.strip_prefix("stat::new_units_added: ") {
            r.new_units = v.trim().parse().unwrap_or(0);
        }
        if let Some(v) = line.strip_prefix("stat::peak_rss_mb: ") {
            r.peak_rss_mb = v.trim().parse().unwrap_or(0);
        }
        if let Some(p) = line.split("Test unit written to ").nth(1) {
            r.artifact = Some(PathBuf::from(p.trim()));
        }
        log.push(line);
    }
    let status = child.wait().context("waiting for the fuzzer")?;
    r.secs = started.elapsed().as_secs_f64();
    std::fs::write(&log_path, log.join("\n") + "\n")
        .with_context(|| format!("writing {}", log_path.display()))?;
    if !status.success() {
        let reason = log
            .iter()
            .find(|l| {
                l.contains("panicked at")
                    || l.contains("ERROR: libFuzzer")
                    || l.contains("ERROR: AddressSanitizer")
            })
            .cloned()
            .unwrap_or_else(|| format!("exit status {status}"));
        let detail = log
            .iter()
            .skip_while(|l| !l.contains("panicked at"))
            .nth(1)
            .cloned()
            .unwrap_or_default();
        r.failed = Some(format!("{reason} {detail}").trim().to_string());
    }
    Ok(r)
}

/// Build and run the targets; `Err` when one of them found a crash, naming the reproducers.
pub fn run(o: &Options) -> Result<String> {
    build(&o.sanitizer, &o.targets)?;
    let queue = Arc::new(Mutex::new(o.targets.clone()));
    let reports = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..o.jobs.min(o.targets.len()) {
        let (queue, reports, o) = (queue.clone(), reports.clone(), o.clone());
        workers.push(std::thread::spawn(move || loop {
            let Some(t) = queue.lock().expect("queue").pop() else {
                return;
            };
            println!("fuzzing {t} for {} s", o.secs);
            let r = run_target(&t, &o).unwrap_or_else(|e| Report {
                target: t.clone(),
                failed: Some(format!("{e:#}")),
                ..Default::default()
            });
            println!(
                "{t}: {} execs in {:.0} s, cov {} ft {}, corpus {} (+{} new){}",
                r.execs,
                r.secs,
                r.cov,
                r.ft,
                r.corpus,
                r.new_units,
                if r.failed.is_some() { ", FAILED" } else { "" }
            );
            reports.lock().expect("reports").push(r);
        }));
    }
    for w in workers {
        w.join().expect("fuzz worker");
    }
    let mut reports = reports.lock().expect("reports").clone();
    reports.sort_by_key(|r| TARGETS.iter().position(|t| *t == r.target));
    let mut summary = String::from(
        "| target | seconds | execs | execs/s | cov | ft | corpus | new | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &reports {
        summary.push_str(&format!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.target,
            r.secs,
            r.execs,
            r.execs as f64 / r.secs.max(1e-9),
            r.cov,
            r.ft,
            r.corpus,
            r.new_units,
            r.peak_rss_mb
        ));
    }
    let failed: Vec<&Report> = reports.iter().filter(|r| r.failed.is_some()).collect();
    if failed.is_empty() {
        return Ok(summary);
    }
    let mut msg = format!("{summary}\n{} fuzz target(s) failed:\n", failed.len());
    for r in failed {
        msg.push_str(&format!(
            "- {}: {}\n",
            r.target,
            r.failed.as_deref().unwrap_or("")
        ));
        match &r.artifact {
            Some(a) => msg.push_str(&format!(
                "  reproducer: {}\n  replay:     {} {}\n  triage:     cd fuzz && MICROVIRT_FUZZ_TRACE=1 cargo run --no-default-features --features seeds --bin replay -- {} {}\n",
                a.display(),
                binary(&r.target).display(),
                a.display(),
                r.target,
                rel_to_fuzz(a).display()
            )),
            None => msg.push_str(&format!(
                "  no reproducer was written; log: {}\n",
                fuzz_dir()
                    .join("target")
                    .join(format!("fuzz-{}.log", r.target))
                    .display()
            )),
        }
    }
    bail!(msg)
}

fn rel_to_fuzz(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        crate::workspace_root().join(p)
    };
    abs.strip_prefix(fuzz_dir())
        .map(Path::to_path_buf)
        .unwrap_or(abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_status_lines() {
        let l = "#4096\tpulse  cov: 9320 ft: 26178 corp: 2087/424Kb exec/s: 151 rss: 35Mb";
        assert_eq!(field(l, "cov: "), Some(9320));
        assert_eq!(field(l, "ft: "), Some(26178));
        assert_eq!(field(l, "corp: "), Some(2087));
        assert_eq!(field("INFO: Seed: 1", "cov: "), None);
    }

    #[test]
    fn every_target_has_a_wrapper_and_a_corpus() {
        let dir = fuzz_dir();
        for t in TARGETS {
            assert!(
                dir.join("fuzz_targets").join(format!("{t}.rs")).is_file(),
                "{t}"
            );
            assert!(dir.join("corpus").join(t).is_dir(), "{t}: committed corpus");
        }
    }
}
