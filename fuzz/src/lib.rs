//! microvirt's fuzz targets. Each target is a plain function over the fuzzer's bytes (so the
//! committed corpus also runs as an ordinary test, `cargo test` in this directory); the
//! `fuzz_targets/` binaries hand them to libFuzzer. Every target checks invariants of what it
//! drives, not only that nothing panics: see each module's documentation.

/// Prints what a target does when `MICROVIRT_FUZZ_TRACE` is set (to triage a crash input).
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::tracing() {
            eprintln!($($arg)*);
        }
    };
}

/// Whether `MICROVIRT_FUZZ_TRACE` is set.
pub fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MICROVIRT_FUZZ_TRACE").is_some())
}

pub mod backend;
pub mod blk;
pub mod bootdisk;
pub mod dhcp;
pub mod driver;
pub mod input;
pub mod mmio;
pub mod net;
pub mod qcow2;
pub mod scratch;
pub mod seeds;
pub mod snapshot;
pub mod vmi;

/// A target: runs one input, panics when an invariant does not hold.
pub type Target = fn(&[u8]);

/// Every target by name, as `cargo fuzz` and `cargo xtask fuzz` call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("blk_raw", |d| blk::run(d, blk::Backend::Raw)),
    ("blk_overlay", |d| blk::run(d, blk::Backend::Overlay)),
    ("blk_qcow2", qcow2::run),
    ("mmio_transport", mmio::run),
    ("net_rxtx", net::run),
    ("dhcp_parse", dhcp::run),
    ("vmi_document", vmi::run),
    ("snapshot_state", snapshot::run),
    ("bootdisk", bootdisk::run),
    ("bootcfg", bootdisk::run_cfg),
];
