//! VM-exit accounting.
//!
//! Two sources, both reported when the VM ends:
//! - the VMM's own counters: every return of `KVM_RUN` to the vCPU thread, by kind, port I/O by
//!   port and MMIO by address (resolved to the device and register when reported). Each vCPU
//!   thread owns its [`VcpuExitCounters`] (no atomics, no sharing) and hands them back when it
//!   stops;
//! - KVM's binary statistics (`KVM_GET_STATS_FD` on the vCPU fd, Linux 5.14+): every exit,
//!   including those the kernel handles without returning to the VMM (HLT with an in-kernel
//!   LAPIC, interrupt windows, MSR and APIC accesses, ioeventfd notifications). Read once, by the
//!   vCPU thread, just before it ends; nothing is opened while the guest boots.
//!
//! Parsing the statistics file is pure ([`parse_binary_stats`]) and unit-tested on hand-built
//! buffers.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};

use kvm_bindings::{kvm_stats_desc, kvm_stats_header};

/// What made `KVM_RUN` return to the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExitKind {
    PioIn,
    PioOut,
    MmioRead,
    MmioWrite,
    Hlt,
    SystemEvent,
    /// `KVM_RUN` returned EINTR/EAGAIN (a kick signal: pause, stop).
    Interrupted,
    /// Faults and anything else that ends the vCPU.
    Other,
}

impl ExitKind {
    pub const ALL: [ExitKind; 8] = [
        ExitKind::PioIn,
        ExitKind::PioOut,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::Hlt,
        ExitKind::SystemEvent,
        ExitKind::Interrupted,
        ExitKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ExitKind::PioIn => "pio-in",
            ExitKind::PioOut => "pio-out",
            ExitKind::MmioRead => "mmio-read",
            ExitKind::MmioWrite => "mmio-write",
            ExitKind::Hlt => "hlt",
            ExitKind::SystemEvent => "system-event",
            ExitKind::Interrupted => "interrupted",
            ExitKind::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Direction of a port or MMIO access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// One vCPU's own exit counters (owned by the vCPU thread).
#[derive(Clone, Debug, Default)]
pub struct VcpuExitCounters {
    kinds: [u64; ExitKind::ALL.len()],
    pio: HashMap<(u16, Access), u64>,
    mmio: HashMap<(u64, Access), u64>,
}

impl VcpuExitCounters {
    pub fn count(&mut self, kind: ExitKind) {
        self.kinds[kind.index()] += 1;
    }

    pub fn pio(&mut self, port: u16, access: Access) {
        self.count(match access {
            Access::Read => ExitKind::PioIn,
            Access::Write => ExitKind::PioOut,
        });
        *self.pio.entry((port, access)).or_default() += 1;
    }

    pub fn mmio(&mut self, addr: u64, access: Access) {
        self.count(match access {
            Access::Read => ExitKind::MmioRead,
            Access::Write => ExitKind::MmioWrite,
        });
        *self.mmio.entry((addr, access)).or_default() += 1;
    }

    pub fn get(&self, kind: ExitKind) -> u64 {
        self.kinds[kind.index()]
    }
}

/// What a vCPU thread hands back when it ends.
#[derive(Clone, Debug, Default)]
pub struct VcpuExitReport {
    pub counters: VcpuExitCounters,
    /// KVM's statistics of this vCPU (name, value); empty when the kernel has no stats fd.
    pub kvm: Vec<(String, u64)>,
}

/// Names an address for the report: (device, register or offset).
pub trait AddressNames {
    fn pio_name(&self, port: u16) -> Option<(String, String)>;
    fn mmio_name(&self, addr: u64) -> Option<(String, String)>;
}

/// The whole VM's exits: the sum over its vCPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExitStats {
    pub vcpus: usize,
    /// Returns of KVM_RUN to the VMM by kind.
    pub kinds: BTreeMap<&'static str, u64>,
    /// Port I/O exits: (device, register, access) → count.
    pub pio: BTreeMap<(String, String, &'static str), u64>,
    /// MMIO exits: (device, register, access) → count.
    pub mmio: BTreeMap<(String, String, &'static str), u64>,
    /// KVM's statistics summed over the vCPUs (every counter, not only exits).
    pub kvm: BTreeMap<String, u64>,
}

impl ExitStats {
    /// Sums the vCPUs' reports, naming addresses with `names`.
    pub fn collect(reports: &[VcpuExitReport], names: &dyn AddressNames) -> Self {
        let mut s = ExitStats {
            vcpus: reports.len(),
            ..Default::default()
        };
        for k in ExitKind::ALL {
            s.kinds.insert(k.name(), 0);
        }
        for r in reports {
            for k in ExitKind::ALL {
                *s.kinds.entry(k.name()).or_default() += r.counters.get(k);
            }
            for (&(port, acc), &n) in &r.counters.pio {
                let (dev, reg) = names
                    .pio_name(port)
                    .unwrap_or_else(|| ("unknown".into(), format!("{port:#x}")));
                *s.pio.entry((dev, reg, acc.name())).or_default() += n;
            }
            for (&(addr, acc), &n) in &r.counters.mmio {
                let (dev, reg) = names
                    .mmio_name(addr)
                    .unwrap_or_else(|| ("unknown".into(), format!("{addr:#x}")));
                *s.mmio.entry((dev, reg, acc.name())).or_default() += n;
            }
            for (name, v) in &r.kvm {
                *s.kvm.entry(name.clone()).or_default() += v;
            }
        }
        s
    }

    /// Returns of KVM_RUN to the VMM (all kinds).
    pub fn vmm_exits(&self) -> u64 {
        self.kinds.values().sum()
    }

    /// KVM's count of all exits (including those handled in the kernel), if known.
    pub fn kvm_exits(&self) -> Option<u64> {
        self.kvm.get("exits").copied()
    }

    /// Non-zero kinds in [`ExitKind::ALL`] order.
    fn kinds_in_order(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        ExitKind::ALL.iter().filter_map(|k| {
            let v = self.kinds.get(k.name()).copied().unwrap_or(0);
            (v > 0).then_some((k.name(), v))
        })
    }

    /// One line: `exits=N (kvm) vmm=N pio=N mmio=N hlt=N ...`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        match self.kvm_exits() {
            Some(n) => {
                let _ = write!(s, "exits={n}");
            }
            None => s.push_str("exits=?"),
        }
        let _ = write!(s, " to-vmm={}", self.vmm_exits());
        for (k, v) in self.kinds_in_order() {
            let _ = write!(s, " {k}={v}");
        }
        for k in KVM_EXIT_STATS {
            if let Some(v) = self.kvm.get(*k).filter(|v| **v > 0) {
                let _ = write!(s, " kvm.{k}={v}");
            }
        }
        s
    }

    /// A multi-line table (for `--exit-stats` and the benchmark).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "exit statistics ({} vCPU{}):",
            self.vcpus,
            if self.vcpus == 1 { "" } else { "s" }
        );
        match self.kvm_exits() {
            Some(n) => {
                let _ = writeln!(s, "  all VM exits (KVM): {n}");
            }
            None => {
                let _ = writeln!(s, "  all VM exits (KVM): unknown (no binary stats fd)");
            }
        }
        for k in KVM_EXIT_STATS {
            if let Some(v) = self.kvm.get(*k).filter(|v| **v > 0) {
                let _ = writeln!(s, "    {k:<24} {v:>9}");
            }
        }
        let _ = writeln!(s, "  returned to the VMM: {}", self.vmm_exits());
        for (k, v) in self.kinds_in_order() {
            let _ = writeln!(s, "    {k:<24} {v:>9}");
        }
        for (title, map) in [("port I/O", &self.pio), ("MMIO", &self.mmio)] {
            if map.is_empty() {
                continue;
            }
            let _ = writeln!(s, "  {title} by device and register:");
            let mut rows: Vec<_> = map.iter().collect();
            rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for ((dev, reg, acc), n) in rows {
                let _ = writeln!(s, "    {:<40} {n:>9}", format!("{dev} {reg} {acc}"));
            }
        }
        s
    }
}

/// KVM statistics shown in summaries, in this order (the rest only in the full `kvm` map).
pub const KVM_EXIT_STATS: &[&str] = &[
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_window_exits",
    "nmi_window_exits",
    "irq_exits",
    "signal_exits",
    "request_irq_exits",
    "insn_emulation",
    "hypercalls",
    "irq_injections",
    "halt_wakeup",
];

/// Errors reading KVM's binary statistics.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatsError {
    #[error("KVM_GET_STATS_FD: errno {0}")]
    Ioctl(i32),
    #[error("reading the stats fd: {0}")]
    Read(String),
    #[error("stats data is truncated or inconsistent: {0}")]
    Malformed(&'static str),
}

const DESC_FIXED: usize = std::mem::size_of::<kvm_stats_desc>();
const HEADER_SIZE: usize = std::mem::size_of::<kvm_stats_header>();

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Parses the content of a KVM binary stats file (header, descriptors, data) into
/// `(name, value)` for every single-value statistic; histograms are left out.
pub fn parse_binary_stats(b: &[u8]) -> Result<Vec<(String, u64)>, StatsError> {
    if b.len() < HEADER_SIZE {
        return Err(StatsError::Malformed("no header"));
    }
    let h = |i: usize| u32_at(b, i * 4).unwrap_or(0) as usize;
    let (name_size, num_desc, desc_offset, data_offset) = (h(1), h(2), h(4), h(5));
    let desc_len = DESC_FIXED
        .checked_add(name_size)
        .ok_or(StatsError::Malformed("name size"))?;
    let mut out = Vec::with_capacity(num_desc.min(256));
    for i in 0..num_desc {
        let d = i
            .checked_mul(desc_len)
            .and_then(|o| o.checked_add(desc_offset))
            .ok_or(StatsError::Malformed("descriptor offset"))?;
        let size = u16_at(b, d + 6).ok_or(StatsError::Malformed("descriptor"))?;
        let offset = u32_at(b, d + 8).ok_or(StatsError::Malformed("descriptor"))? as usize;
        let name = b
            .get(d + DESC_FIXED..d + desc_len)
            .ok_or(StatsError::Malformed("descriptor name"))?;
        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
        if size != 1 {
            continue;
        }
        let v = data_offset
            .checked_add(offset)
            .and_then(|o| u64_at(b, o))
            .ok_or(StatsError::Malformed("value outside the data block"))?;
        out.push((String::from_utf8_lossy(name).into_owned(), v));
    }
    Ok(out)
}

vmm_sys_util::ioctl_io_nr!(KVM_GET_STATS_FD, kvm_bindings::KVMIO, 0xce);

/// Reads a vCPU's (or VM's) KVM statistics through a fresh stats fd.
pub fn read_kvm_stats(fd: &impl AsRawFd) -> Result<Vec<(String, u64)>, StatsError> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
    let raw = unsafe { vmm_sys_util::ioctl::ioctl(fd, KVM_GET_STATS_FD()) };
    if raw < 0 {
        return Err(StatsError::Ioctl(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    // SAFETY: `raw` is a fresh fd that nothing else owns.
    let mut f = unsafe { std::fs::File::from_raw_fd(raw) };
    let mut buf = Vec::with_capacity(16 * 1024);
    f.read_to_end(&mut buf)
        .map_err(|e| StatsError::Read(e.to_string()))?;
    parse_binary_stats(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stats file with the layout KVM uses: header, id, descriptors, data.
    fn stats_file(stats: &[(&str, u16, &[u64])]) -> Vec<u8> {
        let name_size = 48usize;
        let desc_offset = HEADER_SIZE + 64;
        let data_offset = desc_offset + stats.len() * (DESC_FIXED + name_size);
        let mut b = vec![0u8; data_offset];
        let hdr = [
            0u32,
            name_size as u32,
            stats.len() as u32,
            HEADER_SIZE as u32,
            desc_offset as u32,
            data_offset as u32,
        ];
        for (i, v) in hdr.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        let mut data = Vec::new();
        for (i, (name, size, vals)) in stats.iter().enumerate() {
            let d = desc_offset + i * (DESC_FIXED + name_size);
            b[d + 6..d + 8].copy_from_slice(&size.to_le_bytes());
            b[d + 8..d + 12].copy_from_slice(&((data.len() * 8) as u32).to_le_bytes());
            b[d + DESC_FIXED..d + DESC_FIXED + name.len()].copy_from_slice(name.as_bytes());
            data.extend_from_slice(vals);
        }
        for v in data {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn parses_single_values_and_skips_histograms() {
        let f = stats_file(&[
            ("exits", 1, &[1234]),
            ("halt_wait_hist", 4, &[1, 2, 3, 4]),
            ("io_exits", 1, &[56]),
        ]);
        assert_eq!(
            parse_binary_stats(&f).unwrap(),
            vec![("exits".to_string(), 1234), ("io_exits".to_string(), 56)]
        );
    }

    #[test]
    fn truncated_or_lying_files_are_errors_not_panics() {
        let f = stats_file(&[("exits", 1, &[7]), ("io_exits", 1, &[8])]);
        assert!(parse_binary_stats(&f[..10]).is_err());
        for cut in [HEADER_SIZE + 70, f.len() - 4] {
            assert!(parse_binary_stats(&f[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = f.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes()); // num_desc
        assert!(parse_binary_stats(&bad).is_err());
        let mut bad = f.clone();
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes()); // name_size
        assert!(parse_binary_stats(&bad).is_err());
    }

    struct Names;
    impl AddressNames for Names {
        fn pio_name(&self, port: u16) -> Option<(String, String)> {
            (0x3f8..0x400)
                .contains(&port)
                .then(|| ("serial".into(), format!("+{}", port - 0x3f8)))
        }
        fn mmio_name(&self, addr: u64) -> Option<(String, String)> {
            (addr >= 0x1000).then(|| ("blk".into(), format!("{:#x}", addr - 0x1000)))
        }
    }

    #[test]
    fn collects_counters_over_vcpus_with_names() {
        let mut a = VcpuExitCounters::default();
        a.pio(0x3f8, Access::Write);
        a.pio(0x3f8, Access::Write);
        a.pio(0x3fd, Access::Read);
        a.pio(0x70, Access::Write);
        a.mmio(0x1060, Access::Read);
        a.count(ExitKind::Interrupted);
        let mut b = VcpuExitCounters::default();
        b.pio(0x3f8, Access::Write);
        b.mmio(0x1064, Access::Write);
        b.count(ExitKind::SystemEvent);
        let reports = [
            VcpuExitReport {
                counters: a,
                kvm: vec![("exits".into(), 100), ("io_exits".into(), 4)],
            },
            VcpuExitReport {
                counters: b,
                kvm: vec![("exits".into(), 50), ("io_exits".into(), 1)],
            },
        ];
        let s = ExitStats::collect(&reports, &Names);
        assert_eq!(s.vcpus, 2);
        assert_eq!(s.kinds["pio-out"], 4);
        assert_eq!(s.kinds["pio-in"], 1);
        assert_eq!(s.kinds["mmio-read"], 1);
        assert_eq!(s.kinds["system-event"], 1);
        assert_eq!(s.vmm_exits(), 9);
        assert_eq!(s.kvm_exits(), Some(150));
        assert_eq!(s.kvm["io_exits"], 5);
        assert_eq!(s.pio[&("serial".into(), "+0".into(), "write")], 3);
        assert_eq!(s.pio[&("unknown".into(), "0x70".into(), "write")], 1);
        assert_eq!(s.mmio[&("blk".into(), "0x64".into(), "write")], 1);
        let line = s.summary();
        assert!(line.starts_with("exits=150 to-vmm=9 pio-in=1 "), "{line}");
        assert!(line.contains("kvm.io_exits=5"), "{line}");
        let t = s.table();
        assert!(t.contains("all VM exits (KVM): 150"), "{t}");
        // Busiest register first.
        let serial = t.find("serial +0 write").unwrap();
        assert!(serial < t.find("unknown 0x70 write").unwrap(), "{t}");
        assert!(t.contains("blk 0x60 read"), "{t}");
    }

    #[test]
    fn without_kvm_stats_the_summary_says_so() {
        let s = ExitStats::collect(&[VcpuExitReport::default()], &Names);
        assert_eq!(s.kvm_exits(), None);
        assert!(s.summary().starts_with("exits=? to-vmm=0"));
        assert!(s.table().contains("unknown (no binary stats fd)"));
    }
}
