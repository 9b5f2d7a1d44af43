//! What the benchmarks share: the clock they read, the `key=value` fields of the VMM's log
//! lines, the RSS split of a VMM process, and the min/median/p95 rows they print.

use anyhow::Result;

pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc_timespec::default();
    // SAFETY: clock_gettime writes into the struct we own; CLOCK_MONOTONIC is valid.
    unsafe { clock_gettime(1, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[repr(C)]
#[derive(Default)]
struct libc_timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clk: i32, ts: *mut libc_timespec) -> i32;
}

pub(crate) fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

pub(crate) fn stats(mut v: Vec<u64>) -> (f64, f64, f64) {
    v.sort_unstable();
    let ms = |x: u64| x as f64 / 1000.0;
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (ms(v[0]), ms(p(0.5)), ms(p(0.95)))
}

/// RSS of `pid` split into (total KiB, guest-RAM KiB) using /proc/PID/smaps.
pub(crate) fn rss_split(pid: u32, guest_kib: u64) -> Result<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (mut total, mut guest) = (0u64, 0u64);
    let mut in_guest = false;
    for line in smaps.lines() {
        if let Some(v) = line.strip_prefix("Size:") {
            let kib: u64 = v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0);
            in_guest = kib == guest_kib;
        } else if let Some(v) = line.strip_prefix("Rss:") {
            let kib: u64 = v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0);
            total += kib;
            if in_guest {
                guest += kib;
            }
        }
    }
    Ok((total, guest))
}

/// Prints one row of a benchmark table: `[tag] label`, then min, median and p95 in ms.
pub(crate) fn print_row(tag: &str, label: &str, v: Vec<u64>) {
    let (min, med, p95) = stats(v);
    println!(
        "{:<44} {:>9.2} {:>9.2} {:>9.2}",
        format!("[{tag}] {label}"),
        min,
        med,
        p95
    );
}
