//! microvirt's fuzz targets. Each target is a plain function over the fuzzer's bytes (so the
//! committed corpus also runs as an ordinary test, `cargo test` in this directory); the
//! `fuzz_targets/` binaries hand them to libFuzzer. Every target checks invariants of what it
//! drives, not only that nothing panics: see each module's documentation.

pub mod backend;
pub mod blk;
pub mod driver;
pub mod input;
pub mod mmio;
pub mod net;
pub mod scratch;
pub mod seeds;

/// Every target by name, as `cargo fuzz` and `cargo xtask fuzz` call them.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("blk_raw", |d| blk::run(d, blk::Backend::Raw)),
    ("blk_overlay", |d| blk::run(d, blk::Backend::Overlay)),
    ("mmio_transport", mmio::run),
    ("net_rxtx", net::run),
];
