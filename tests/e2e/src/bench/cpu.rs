//! Node CPU over a fixed window: the whole machine's busy time (`/proc/stat`) and the CPU time
//! of each kind of process on the node (`/proc/PID/stat`), so that the cost of idle VMIs, idle
//! warm members and idle minimal pods can be set against the empty cluster measured the same way.
//!
//! A process is identified by its pid and start time (a reused pid is another process). Its CPU
//! in a window is the growth of `utime + stime` between the two samples, or all of it when it
//! started inside the window; a process that ended inside the window is not counted (the
//! machine's busy time still holds it). `guest_time` (the time vCPU threads spent running the
//! guest, already part of `utime`) is kept apart: the goal is stated beyond the guest's own time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{exe_name, in_node_pods, pids};

/// What a process on the node is, for the CPU table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// `virt-launcher` in one of the node's pods (VMM and vCPU threads).
    Launcher,
    /// `containerd-shim-runc-v2`: one per pod sandbox.
    Shim,
    /// A sandbox's `pause`, and the minimal pods' own `pause` container.
    Pause,
    Kubelet,
    Containerd,
    /// `kube-apiserver`, `etcd`, `kube-scheduler`, `kube-controller-manager`.
    ControlPlane,
    /// `virt-operator` and `virt-handler`.
    Microvirt,
    /// Everything else on the machine (the benchmark's own watches, other work).
    Other,
}

impl Class {
    const ALL: [Class; 8] = [
        Class::Launcher,
        Class::Shim,
        Class::Pause,
        Class::Kubelet,
        Class::Containerd,
        Class::ControlPlane,
        Class::Microvirt,
        Class::Other,
    ];

    fn label(self) -> &'static str {
        match self {
            Class::Launcher => "launchers",
            Class::Shim => "shims",
            Class::Pause => "pause",
            Class::Kubelet => "kubelet",
            Class::Containerd => "containerd",
            Class::ControlPlane => "ctl-plane",
            Class::Microvirt => "operator+agent",
            Class::Other => "other",
        }
    }

    fn of(exe: &str, in_pods: bool) -> Class {
        match exe {
            "virt-launcher" if in_pods => Class::Launcher,
            "containerd-shim-runc-v2" => Class::Shim,
            "pause" => Class::Pause,
            "kubelet" => Class::Kubelet,
            "containerd" => Class::Containerd,
            "kube-apiserver" | "etcd" | "kube-scheduler" | "kube-controller-manager" => {
                Class::ControlPlane
            }
            "virt-operator" | "virt-handler" => Class::Microvirt,
            _ => Class::Other,
        }
    }
}

/// CPU counters of one process, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcTimes {
    pub(crate) start: u64,
    pub(crate) cpu: u64,
    pub(crate) guest: u64,
}

/// Parses `/proc/PID/stat`: start time, `utime + stime` and `guest_time` (fields 22, 14 + 15
/// and 43). The command name (field 2) may hold spaces and parentheses: fields are counted after
/// its last `)`.
pub(crate) fn parse_stat(s: &str) -> Option<ProcTimes> {
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    // f[0] is field 3 (state).
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(ProcTimes {
        start: n(22)?,
        cpu: n(14)? + n(15)?,
        guest: n(43).unwrap_or(0),
    })
}

/// The machine's busy ticks from `/proc/stat`'s `cpu` line: user, nice, system, irq, softirq
/// (guest time is part of user; idle, iowait and steal are not busy).
pub(crate) fn parse_machine_busy(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some(v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)?)
}

/// One sample of the machine and its processes.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    at: Instant,
    busy: u64,
    procs: BTreeMap<u32, (Class, ProcTimes)>,
}

impl Sample {
    pub(crate) fn take() -> Result<Self> {
        let at = Instant::now();
        let busy =
            parse_machine_busy(&fs::read_to_string("/proc/stat")?).context("parsing /proc/stat")?;
        let mut procs = BTreeMap::new();
        for pid in pids() {
            let Some(t) = fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
            else {
                continue;
            };
            let class = Class::of(&exe_name(pid), in_node_pods(pid));
            procs.insert(pid, (class, t));
        }
        Ok(Self { at, busy, procs })
    }
}

/// CPU used in a window, in ticks, per class and for the whole machine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Usage {
    pub(crate) secs: f64,
    pub(crate) busy: u64,
    pub(crate) by_class: BTreeMap<Class, u64>,
    /// Guest time of the launchers (their vCPUs running the guest).
    pub(crate) launcher_guest: u64,
    /// Processes of each class alive at the end.
    pub(crate) count: BTreeMap<Class, usize>,
}

/// What the processes of `end` used since `start`.
pub(crate) fn usage(start: &Sample, end: &Sample) -> Usage {
    let mut u = Usage {
        secs: end.at.duration_since(start.at).as_secs_f64(),
        busy: end.busy.saturating_sub(start.busy),
        ..Default::default()
    };
    for (pid, (class, t)) in &end.procs {
        let before = start
            .procs
            .get(pid)
            .filter(|(_, s)| s.start == t.start)
            .map(|(_, s)| *s);
        let (cpu, guest) = match before {
            Some(b) => (t.cpu.saturating_sub(b.cpu), t.guest.saturating_sub(b.guest)),
            None => (t.cpu, t.guest),
        };
        *u.by_class.entry(*class).or_default() += cpu;
        *u.count.entry(*class).or_default() += 1;
        if *class == Class::Launcher {
            u.launcher_guest += guest;
        }
    }
    u
}

/// Clock ticks per second.
pub(crate) fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Samples the machine over `window` (after `settle`, so that what just started has settled).
pub(crate) fn measure(settle: Duration, window: Duration) -> Result<Usage> {
    thread::sleep(settle);
    let a = Sample::take()?;
    thread::sleep(window);
    let b = Sample::take()?;
    Ok(usage(&a, &b))
}

/// Millicores: CPU ticks used over `secs` seconds, ×1000 / ticks per second.
fn millicores(ticks: u64, secs: f64, hz: f64) -> f64 {
    ticks as f64 / hz / secs.max(1e-9) * 1000.0
}

/// One measured window, with how many of the measured objects it held.
pub(crate) struct Window {
    pub(crate) title: String,
    /// VMIs / pods / members the window is about (0 for the empty cluster).
    pub(crate) objects: usize,
    pub(crate) usage: Usage,
}

/// The table of windows, in millicores (1000 = one core busy), and the cost per object against
/// the first window (the empty cluster).
pub(crate) fn table(windows: &[Window], out: &mut String) {
    let hz = ticks_per_sec();
    let Some(empty) = windows.first() else {
        return;
    };
    let secs = empty.usage.secs;
    let _ = writeln!(
        out,
        "\nnode CPU while idle, {:.0} s windows (millicores; 1000 = one core busy)",
        secs
    );
    let _ = write!(out, "  {:<34} {:>8}", "", "machine");
    for c in Class::ALL {
        let _ = write!(out, " {:>10}", c.label());
    }
    let _ = writeln!(out, " {:>10}", "vCPU guest");
    for w in windows {
        let u = &w.usage;
        let _ = write!(
            out,
            "  {:<34} {:>8.1}",
            w.title,
            millicores(u.busy, u.secs, hz)
        );
        for c in Class::ALL {
            let t = u.by_class.get(&c).copied().unwrap_or(0);
            let _ = write!(out, " {:>10.1}", millicores(t, u.secs, hz));
        }
        let _ = writeln!(out, " {:>10.1}", millicores(u.launcher_guest, u.secs, hz));
    }
    for w in windows.iter().skip(1).filter(|w| w.objects > 0) {
        let u = &w.usage;
        let n = w.objects as f64;
        let m = |t: u64| millicores(t, u.secs, hz);
        let me = |t: u64| millicores(t, empty.usage.secs, hz);
        let class = |u: &Usage, c: Class| u.by_class.get(&c).copied().unwrap_or(0);
        let machine = (m(u.busy) - me(empty.usage.busy)) / n;
        let guest = m(u.launcher_guest) / n;
        let launcher = (m(class(u, Class::Launcher)) - m(u.launcher_guest)) / n;
        let runtime = (m(class(u, Class::Shim)) + m(class(u, Class::Pause))) / n;
        let node = (m(class(u, Class::Kubelet)) + m(class(u, Class::Containerd))
            - me(class(&empty.usage, Class::Kubelet))
            - me(class(&empty.usage, Class::Containerd)))
            / n;
        let _ = writeln!(
            out,
            "  per object, {}: machine {:+.2} m beyond the empty cluster ({:.2} m of it vCPU \
             guest time); launcher beyond guest {:.2} m, shim+pause {:.2} m, kubelet+containerd \
             {:+.2} m",
            w.title, machine, guest, launcher, runtime, node
        );
    }
}

/// CPU spent starting objects: per shape (title, objects started, what the machine used from
/// the first create until the last object was Running/Ready), in CPU milliseconds per object.
pub(crate) fn start_table(rows: &[(&str, usize, &Usage)], out: &mut String) {
    let hz = ticks_per_sec();
    let per = |ticks: u64, n: usize| ticks as f64 / hz * 1000.0 / n.max(1) as f64;
    let _ = writeln!(
        out,
        "\nnode CPU spent starting them, from the first create to the last one up (CPU ms per object)"
    );
    let _ = write!(out, "  {:<44} {:>8}", "", "machine");
    for c in Class::ALL {
        let _ = write!(out, " {:>10}", c.label());
    }
    let _ = writeln!(out);
    for (title, n, u) in rows {
        let _ = write!(out, "  {:<44} {:>8.1}", title, per(u.busy, *n));
        for c in Class::ALL {
            let _ = write!(
                out,
                " {:>10.1}",
                per(u.by_class.get(&c).copied().unwrap_or(0), *n)
            );
        }
        let _ = writeln!(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // Fields 1..=44 of a process whose name holds ") (": utime 7, stime 5, start 900,
        // guest_time 3.
        let mut f: Vec<String> = (4..=44).map(|_| "0".to_string()).collect();
        f[14 - 4] = "7".into();
        f[15 - 4] = "5".into();
        f[22 - 4] = "900".into();
        f[43 - 4] = "3".into();
        let s = format!("123 (a) (b) S {}", f.join(" "));
        assert_eq!(
            parse_stat(&s),
            Some(ProcTimes {
                start: 900,
                cpu: 12,
                guest: 3
            })
        );
        assert_eq!(parse_stat("123 (x) S 1 2"), None);
    }

    #[test]
    fn machine_busy_leaves_out_idle_iowait_and_steal() {
        let stat = "cpu  10 1 4 1000 50 2 3 40 6 0\ncpu0 5 0 2 500 25 1 1 20 3 0\n";
        assert_eq!(parse_machine_busy(stat), Some(10 + 1 + 4 + 2 + 3));
        assert_eq!(parse_machine_busy("intr 1 2\n"), None);
    }

    #[test]
    fn usage_counts_growth_and_new_processes_but_not_reused_pids() {
        let at = Instant::now();
        let t = |start, cpu, guest| ProcTimes { start, cpu, guest };
        let a = Sample {
            at,
            busy: 100,
            procs: BTreeMap::from([
                (1, (Class::Launcher, t(10, 50, 20))),
                (2, (Class::Shim, t(10, 5, 0))),
                (3, (Class::Kubelet, t(10, 70, 0))),
            ]),
        };
        let b = Sample {
            at: at + Duration::from_secs(10),
            busy: 400,
            procs: BTreeMap::from([
                (1, (Class::Launcher, t(10, 80, 30))),
                // Pid 2 was reused by a new shim that has used 4 ticks.
                (2, (Class::Shim, t(2000, 4, 0))),
                (3, (Class::Kubelet, t(10, 90, 0))),
                (4, (Class::Launcher, t(1500, 9, 1))),
            ]),
        };
        let u = usage(&a, &b);
        assert_eq!(u.busy, 300);
        assert!((u.secs - 10.0).abs() < 1e-6);
        assert_eq!(u.by_class[&Class::Launcher], 30 + 9);
        assert_eq!(u.launcher_guest, 10 + 1);
        assert_eq!(u.by_class[&Class::Shim], 4);
        assert_eq!(u.by_class[&Class::Kubelet], 20);
        assert_eq!(u.count[&Class::Launcher], 2);
    }

    #[test]
    fn classes_follow_the_executable_and_launchers_only_in_node_pods() {
        assert_eq!(Class::of("virt-launcher", true), Class::Launcher);
        assert_eq!(Class::of("virt-launcher", false), Class::Other);
        assert_eq!(Class::of("etcd", false), Class::ControlPlane);
        assert_eq!(Class::of("virt-handler", true), Class::Microvirt);
        assert_eq!(Class::of("cargo", false), Class::Other);
    }

    #[test]
    fn the_table_states_the_cost_per_object_against_the_empty_cluster() {
        let hz = ticks_per_sec();
        let ticks = |millicores: f64, secs: f64| (millicores / 1000.0 * secs * hz).round() as u64;
        let usage = |busy, launcher, guest| Usage {
            secs: 30.0,
            busy: ticks(busy, 30.0),
            by_class: BTreeMap::from([(Class::Launcher, ticks(launcher, 30.0))]),
            launcher_guest: ticks(guest, 30.0),
            count: BTreeMap::new(),
        };
        let windows = [
            Window {
                title: "empty cluster".into(),
                objects: 0,
                usage: usage(100.0, 0.0, 0.0),
            },
            Window {
                title: "10 idle VMIs".into(),
                objects: 10,
                usage: usage(300.0, 150.0, 50.0),
            },
        ];
        let mut out = String::new();
        table(&windows, &mut out);
        // (300 - 100) / 10 = 20 m per VMI, 5 of it guest; launcher beyond guest (150-50)/10.
        assert!(
            out.contains("per object, 10 idle VMIs: machine +20.00 m"),
            "{out}"
        );
        assert!(out.contains("(5.00 m of it vCPU guest time)"), "{out}");
        assert!(out.contains("launcher beyond guest 10.00 m"), "{out}");
    }
}
