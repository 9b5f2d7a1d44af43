//! `diskread`: reads a block device (or file) with O_DIRECT, for the disk benchmark in the stock
//! guest (`cargo xtask bench-disk`, `microvirt_testhost::diskbench`).
//!
//! usage: diskread [--label L] [--seq-mib N] [--random N] [--seed S] DEVICE
//!
//! - sequential: 1 MiB reads at 1 MiB-aligned offsets from 0 through the first `--seq-mib` MiB
//!   (default: the whole device; a last partial MiB is read as far as it is 4 KiB-aligned);
//! - random: `--random` (default 2000) 4 KiB reads at 4 KiB-aligned offsets drawn from a
//!   xorshift64 PRNG seeded with `--seed` (default fixed), over the whole device.
//!
//! Prints one line per measurement:
//! `diskread L seq bytes=N secs=F mib_s=F` and
//! `diskread L rand reads=N secs=F iops=F mean_us=F`
//! (L defaults to the device's path). Errors go to stderr as `diskread L error: ...`, exit 1.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Reads DEVICE with O_DIRECT: sequentially in 1 MiB reads, then 4 KiB reads at random
/// 4 KiB-aligned offsets.
#[derive(Parser, Debug)]
#[command(name = "diskread")]
struct Opts {
    /// Names the measurement in the output lines (default: DEVICE).
    #[arg(long)]
    label: Option<String>,
    /// Read only the first N MiB sequentially (default: the whole device).
    #[arg(long, value_name = "N")]
    seq_mib: Option<u64>,
    /// Number of random 4 KiB reads.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    random: u64,
    /// Seed of the xorshift64 PRNG that draws the offsets (0 is taken as 1).
    #[arg(long, default_value_t = 0x2545_f491_4f6c_dd1d)]
    seed: u64,
    /// The block device (or file) to read.
    device: String,
}

fn parse(args: &[String]) -> Result<Opts, clap::Error> {
    let mut o =
        Opts::try_parse_from(std::iter::once("diskread".to_string()).chain(args.iter().cloned()))?;
    if o.seed == 0 {
        // xorshift stays at 0 forever.
        o.seed = 1;
    }
    Ok(o)
}

/// A `len`-byte slice of `storage` that starts at a 4 KiB-aligned address (O_DIRECT needs it).
fn aligned(storage: &mut [u8], len: usize) -> &mut [u8] {
    let skip = storage.as_ptr().align_offset(PAGE as usize);
    &mut storage[skip..skip + len]
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Reads exactly `buf.len()` bytes at `off` (O_DIRECT reads may come back short).
fn read_at(f: &File, buf: &mut [u8], off: u64) -> Result<()> {
    f.read_exact_at(buf, off)
        .with_context(|| format!("reading {} bytes at {off}", buf.len()))
}

fn run(o: &Opts, label: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&o.device)
        .with_context(|| format!("opening {} with O_DIRECT", o.device))?;
    let size = f
        .seek(SeekFrom::End(0))
        .with_context(|| format!("size of {}", o.device))?;
    let size = size - size % PAGE;
    if size == 0 {
        bail!("{} is smaller than 4 KiB", o.device);
    }
    let mut storage = vec![0u8; (MIB + PAGE) as usize];

    let end = o.seq_mib.map_or(size, |m| size.min(m * MIB));
    let buf = aligned(&mut storage, MIB as usize);
    let t = Instant::now();
    let mut off = 0;
    while off < end {
        let n = (end - off).min(MIB) as usize;
        read_at(&f, &mut buf[..n], off)?;
        off += n as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "diskread {label} seq bytes={end} secs={secs:.4} mib_s={:.2}",
        end as f64 / MIB as f64 / secs.max(1e-9)
    );

    let pages = size / PAGE;
    let buf = aligned(&mut storage, PAGE as usize);
    let mut x = o.seed;
    let t = Instant::now();
    for _ in 0..o.random {
        let off = (xorshift(&mut x) % pages) * PAGE;
        read_at(&f, buf, off)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let n = o.random as f64;
    println!(
        "diskread {label} rand reads={} secs={secs:.4} iops={:.1} mean_us={:.1}",
        o.random,
        n / secs.max(1e-9),
        if o.random == 0 { 0.0 } else { secs * 1e6 / n }
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => e.exit(),
    };
    let label = o.label.clone().unwrap_or_else(|| o.device.clone());
    if let Err(e) = run(&o, &label) {
        eprintln!("diskread {label} error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn options_parse_and_refuse() {
        let o = parse(&args("--label a:1:raw --seq-mib 8 --random 10 /dev/vdc")).unwrap();
        assert_eq!(o.label.as_deref(), Some("a:1:raw"));
        assert_eq!(
            (o.seq_mib, o.random, o.device.as_str()),
            (Some(8), 10, "/dev/vdc")
        );
        assert!(parse(&args("--random x /dev/vdc")).is_err());
        assert!(parse(&args("--seq-mib")).is_err());
        assert!(parse(&args("/dev/a /dev/b")).is_err());
        assert!(parse(&args("")).is_err());
        assert_eq!(parse(&args("--seed 0 d")).unwrap().seed, 1);
    }

    #[test]
    fn the_buffer_is_page_aligned() {
        let mut s = vec![0u8; (MIB + PAGE) as usize];
        let b = aligned(&mut s, MIB as usize);
        assert_eq!(b.as_ptr() as usize % PAGE as usize, 0);
        assert_eq!(b.len(), MIB as usize);
    }
}
