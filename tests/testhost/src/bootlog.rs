//! Breakdown of a Linux guest's boot from its kernel log (`dmesg` of a boot with
//! `initcall_debug`): where the kernel's own time goes before it runs `/init`.
//!
//! Used by `cargo xtask bench-testhost --boot-log` (docs/boot-time.md).

use std::fmt::Write as _;

/// Kernel symbols (address → name) from `nm` of a vmlinux: initcall_debug prints bare addresses
/// when the kernel has no kallsyms (tinyconfig).
#[derive(Debug, Default, Clone)]
pub struct Symbols(std::collections::BTreeMap<u64, String>);

impl Symbols {
    /// Parses `nm` output (`ffffffff81000000 T _text`).
    pub fn from_nm(text: &str) -> Self {
        let mut m = std::collections::BTreeMap::new();
        for l in text.lines() {
            let mut f = l.split_whitespace();
            if let (Some(a), Some(_), Some(n)) = (f.next(), f.next(), f.next()) {
                if let Ok(a) = u64::from_str_radix(a, 16) {
                    m.insert(a, n.to_string());
                }
            }
        }
        Symbols(m)
    }

    /// Runs `nm` on `vmlinux`; empty when that fails.
    pub fn of(vmlinux: &std::path::Path) -> Self {
        std::process::Command::new("nm")
            .arg(vmlinux)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| Self::from_nm(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or_default()
    }

    /// `0xffffffff81af549c` → `pty_init` (names are kept as they are).
    pub fn name(&self, s: &str) -> String {
        s.strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .and_then(|a| self.0.range(..=a).next_back())
            .map_or_else(|| s.to_string(), |(_, n)| n.clone())
    }
}

/// One kernel log line: printk time in seconds and the text.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub t: f64,
    pub text: String,
}

/// Parses `[    1.234567] text` lines (anything else is skipped).
pub fn parse(lines: &[String]) -> Vec<LogLine> {
    lines
        .iter()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?;
            let (t, text) = rest.split_once(']')?;
            Some(LogLine {
                t: t.trim().parse().ok()?,
                text: text.trim().to_string(),
            })
        })
        .collect()
}

/// `initcall foo+0x0/0x40 returned 0 after 123 usecs` → ("foo", 123).
fn initcall(text: &str) -> Option<(String, u64)> {
    let rest = text.strip_prefix("initcall ")?;
    let (name, rest) = rest.split_once(' ')?;
    let name = name.split('+').next()?.to_string();
    let after = rest.split_once(" after ")?.1;
    let us = after.strip_suffix(" usecs")?.trim().parse().ok()?;
    Some((name, us))
}

/// The breakdown.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    /// printk time of "Run /init" (or "Run /sbin/init"), seconds.
    pub init_at: Option<f64>,
    /// Sum of all initcall durations, µs.
    pub initcalls_us: u64,
    /// The slowest initcalls (name, µs), slowest first.
    pub top_initcalls: Vec<(String, u64)>,
    /// The largest gaps between consecutive log lines before init: (gap s, at s, the line after).
    pub gaps: Vec<(f64, f64, String)>,
    /// Selected milestones (printk time, text).
    pub milestones: Vec<(f64, String)>,
}

const MILESTONES: &[&str] = &[
    "Linux version",
    "tsc: Detected",
    "Calibrating delay loop",
    "Memory:",
    "smpboot: CPU0",
    "devtmpfs: initialized",
    "clocksource: Switched to clocksource",
    "Serial: 8250/16550 driver",
    "printk: console [ttyS0] enabled",
    "virtio_blk virtio0",
    "serio: i8042",
    "input: AT",
    "IP-Config: Complete",
    "EXT4-fs (vda): mounted",
    "VFS: Mounted root",
    "Freeing unused kernel",
    "Run /",
];

/// Computes the breakdown of `log` (top `n` initcalls and gaps), naming initcalls with `syms`.
pub fn breakdown(log: &[LogLine], n: usize, syms: &Symbols) -> Breakdown {
    let mut b = Breakdown::default();
    let mut calls: Vec<(String, u64)> = Vec::new();
    for l in log {
        if let Some((name, us)) = initcall(&l.text) {
            b.initcalls_us += us;
            calls.push((syms.name(&name), us));
        }
        if b.init_at.is_none() && l.text.starts_with("Run /") {
            b.init_at = Some(l.t);
        }
        if let Some(m) = MILESTONES.iter().find(|m| l.text.starts_with(**m)) {
            if !b.milestones.iter().any(|(_, t)| t.starts_with(*m)) {
                b.milestones.push((l.t, l.text.clone()));
            }
        }
    }
    calls.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    calls.truncate(n);
    b.top_initcalls = calls;
    let end = b.init_at.unwrap_or(f64::MAX);
    let mut gaps: Vec<(f64, f64, String)> = log
        .windows(2)
        .filter(|w| w[1].t <= end)
        .map(|w| (w[1].t - w[0].t, w[1].t, w[1].text.clone()))
        .collect();
    gaps.sort_by(|a, b| b.0.total_cmp(&a.0));
    gaps.truncate(n);
    b.gaps = gaps;
    b
}

impl Breakdown {
    /// Markdown tables.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "kernel: `Run /init` at {} s printk time; initcalls sum {:.1} ms\n",
            self.init_at.map_or("?".into(), |t| format!("{t:.3}")),
            self.initcalls_us as f64 / 1000.0
        );
        let _ = writeln!(s, "| printk time (s) | milestone |\n|---|---|");
        for (t, m) in &self.milestones {
            let _ = writeln!(s, "| {t:.3} | {} |", m.replace('|', "/"));
        }
        let _ = writeln!(s, "\n| initcall | ms |\n|---|---|");
        for (n, us) in &self.top_initcalls {
            let _ = writeln!(s, "| {n} | {:.1} |", *us as f64 / 1000.0);
        }
        let _ = writeln!(
            s,
            "\n| gap before (ms) | at (s) | next line |\n|---|---|---|"
        );
        for (g, t, l) in &self.gaps {
            let _ = writeln!(
                s,
                "| {:.1} | {t:.3} | {} |",
                g * 1000.0,
                l.replace('|', "/")
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaks_a_boot_log_down() {
        let text = [
            "[    0.000000] Linux version 6.1.0 (gcc)",
            "[    0.010000] tsc: Detected 2000.000 MHz processor",
            "[    0.300000] calling  serial8250_init+0x0/0x100 @ 1",
            "[    0.350000] initcall serial8250_init+0x0/0x100 returned 0 after 50000 usecs",
            "noise without a timestamp",
            "[    0.360000] initcall virtio_blk_init+0x0/0x80 returned 0 after 900 usecs",
            "[    0.900000] initcall 0xffffffff81af735f returned 0 after 540000 usecs",
            "[    1.000000] Run /init as init process",
            "[    3.000000] after init",
        ]
        .map(String::from);
        let log = parse(&text);
        assert_eq!(log.len(), 8);
        let syms = Symbols::from_nm(
            "ffffffff81af7300 t i8042_init\nffffffff81af7400 t later\nnot a symbol line\n",
        );
        assert_eq!(syms.name("0xffffffff81af735f"), "i8042_init");
        assert_eq!(syms.name("serial8250_init"), "serial8250_init");
        let b = breakdown(&log, 2, &syms);
        assert_eq!(b.init_at, Some(1.0));
        assert_eq!(b.initcalls_us, 590_900);
        assert_eq!(
            b.top_initcalls,
            vec![
                ("i8042_init".to_string(), 540_000),
                ("serial8250_init".to_string(), 50_000)
            ]
        );
        // The biggest gap before init is the i8042 one; the gap after init is left out.
        assert!((b.gaps[0].0 - 0.54).abs() < 1e-9);
        assert!(b.gaps[0].2.starts_with("initcall 0xffffffff81af735f"));
        assert!(b.gaps.iter().all(|g| g.1 <= 1.0));
        assert_eq!(b.milestones.len(), 3);
        let r = b.report();
        assert!(r.contains("`Run /init` at 1.000 s"), "{r}");
        assert!(r.contains("| i8042_init | 540.0 |"), "{r}");
    }
}
