//! Disk read benchmark (issue 21): the stock guest ([`crate::stock`]) reads the same data as a
//! raw disk, as a qcow2 and as a compressed qcow2 (`qemu-img convert -O qcow2 -c`, as
//! containerDisks are packed) with O_DIRECT — sequential 1 MiB reads of the whole disk and 4 KiB
//! reads at random 4 KiB-aligned offsets (`src/bin/diskread.rs`) — under microvm and under QEMU
//! `-M microvm,acpi=on` in one test-host boot.
//!
//! The data ([`data_disks`]): [`DATA_MIB`] MiB of this machine's `/usr/bin` and `/usr/lib` files
//! with every fourth 256 KiB stripe a hole (the recipe of `vmm/benches/qcow2_read.rs`), cached
//! under `~/.cache/microvirt/diskbench/data-<hash>/` keyed by the content and `qemu-img`'s
//! version. A small ext4 "tools" disk (virtio serial `microvirt-tools`) carries `diskread` and
//! the guest's `run` script ([`guest_script`]); the stock init's `diskread` scenario runs it.
//! Each guest boot reads the three disks (serials `raw`, `qcow2`, `qcow2c`) `rounds` times,
//! interleaved; the VMMs' boots alternate.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::median;
use crate::cmd;
use crate::stock::{StockError, StockGuest};

/// Size of each data disk.
pub const DATA_MIB: usize = 64;
/// 4 KiB random reads per disk per round.
pub const RANDOM_READS: u64 = 1000;
/// Bump when the data recipe changes.
const RECIPE_VERSION: &[u8] = b"microvirt-diskbench-v1";
/// The data disks' virtio serials, in the order the guest reads them within a round.
pub const DISKS: &[&str] = &["raw", "qcow2", "qcow2c"];
/// The VMMs compared.
pub const VMMS: &[&str] = &["microvm", "qemu"];
/// The tools disk's virtio serial (the stock init looks for it).
pub const TOOLS_SERIAL: &str = "microvirt-tools";

/// The same data three ways.
#[derive(Debug, Clone)]
pub struct DataDisks {
    pub raw: PathBuf,
    pub qcow2: PathBuf,
    /// zlib-compressed clusters (`-c`).
    pub qcow2c: PathBuf,
}

fn fill_from(dir: &Path, v: &mut Vec<u8>, size: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if v.len() >= size {
            return;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            fill_from(&p, v, size);
        } else if m.is_file() {
            if let Ok(b) = std::fs::read(&p) {
                v.extend_from_slice(&b[..b.len().min(size - v.len())]);
            }
        }
    }
}

/// `size` bytes of `dirs`' files (sorted walk), zero-padded, every fourth 256 KiB stripe zeroed.
pub fn data(dirs: &[&Path], size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    for d in dirs {
        fill_from(d, &mut v, size);
    }
    v.resize(size, 0);
    for (i, c) in v.chunks_mut(256 << 10).enumerate() {
        if i % 4 == 3 {
            c.fill(0);
        }
    }
    v
}

/// Builds (or finds cached) the three data disks.
pub fn data_disks() -> Result<DataDisks, StockError> {
    cmd::ensure_packages(&["qemu-utils"])?;
    let v = data(
        &[Path::new("/usr/bin"), Path::new("/usr/lib")],
        DATA_MIB << 20,
    );
    let qemu_img = cmd::dpkg_version("qemu-utils")?;
    let key = cmd::sha256_hex(&[RECIPE_VERSION, qemu_img.as_bytes(), &v])?;
    let dir = cmd::cache_root()
        .join("diskbench")
        .join(format!("data-{}", &key[..16]));
    let out = DataDisks {
        raw: dir.join("data.raw"),
        qcow2: dir.join("data.qcow2"),
        qcow2c: dir.join("data-c.qcow2"),
    };
    let lock = cmd::cache_root().join("diskbench.lock");
    crate::stock::cached_build_under(&lock, &dir, "the disk benchmark's data disks", || {
        crate::stock::progress("building the disk benchmark's data disks (raw, qcow2, qcow2 -c)");
        cmd::mkdirs(&dir)?;
        cmd::write(&out.raw, &v)?;
        for (img, extra) in [(&out.qcow2, None), (&out.qcow2c, Some("-c"))] {
            cmd::run(
                Command::new("qemu-img")
                    .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
                    .args(extra)
                    .arg(&out.raw)
                    .arg(img),
            )?;
        }
        Ok(())
    })?;
    Ok(out)
}

/// The guest's `run` script (on the tools disk, mounted on /tmp): `rounds` rounds of
/// `diskread` over each data disk, found by its virtio serial, labelled
/// `VMM:BOOT:ROUND:DISK` (`microvirt.vmm=` and `microvirt.boot=` on the command line).
pub fn guest_script(rounds: usize) -> String {
    let disks = DISKS.join(" ");
    format!(
        r#"vmm=unknown; boot=0
for w in $(cat /proc/cmdline); do
	case "$w" in microvirt.vmm=*) vmm=${{w#*=}} ;; microvirt.boot=*) boot=${{w#*=}} ;; esac
done
for r in $(seq 1 {rounds}); do
	for d in {disks}; do
		dev=
		for b in /sys/class/block/vd*; do
			[ "$(cat "$b/serial" 2>/dev/null)" = "$d" ] && dev=/dev/${{b##*/}}
		done
		if [ -z "$dev" ]; then echo "diskread $vmm:$boot:$r:$d error: no disk with serial $d"; continue; fi
		/tmp/diskread --label "$vmm:$boot:$r:$d" --random {RANDOM_READS} "$dev" 2>&1
	done
done
"#
    )
}

/// An ext4 file system image (no partition table) with `diskread` and the `run` script.
pub fn tools_disk(dir: &Path, diskread: &Path, rounds: usize) -> Result<PathBuf, StockError> {
    let stage = dir.join("tools-stage");
    cmd::remove_dir(&stage)?;
    cmd::mkdirs(&stage)?;
    cmd::copy(diskread, &stage.join("diskread"))?;
    cmd::write(&stage.join("run"), guest_script(rounds))?;
    cmd::sh(&format!(
        "chmod 0755 {}",
        cmd::quote(&stage.join("diskread"))
    ))?;
    let img = dir.join("tools.ext4");
    let _ = std::fs::remove_file(&img);
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "tools", "-E", "root_owner=0:0", "-d"])
            .arg(&stage)
            .arg(&img)
            .arg("8M"),
    )?;
    cmd::remove_dir(&stage)?;
    Ok(img)
}

/// The test-host shell: `boots` boots of the stock guest under microvm and under QEMU
/// `-M microvm,acpi=on`, alternating, each with the root disk, the tools disk and the three data
/// disks (read-only) and `microvirt.scenario=diskread`; the console goes through prefixed
/// with `[VMM BOOT]`.
pub fn bench_body(boots: usize) -> String {
    let defaults = "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce";
    let args = "root=/dev/vda1 ro quiet microvirt.scenario=diskread";
    let microvm_disks: String = DISKS
        .iter()
        .map(|d| {
            format!(
                " --disk path=\"$DISK_{}\",ro,id={d}",
                d.to_ascii_uppercase()
            )
        })
        .collect();
    let qemu_disks: String = DISKS
        .iter()
        .map(|d| {
            let fmt = if *d == "raw" { "raw" } else { "qcow2" };
            format!(
                " -drive id={d},file=\"$DISK_{}\",format={fmt},if=none,readonly=on -device virtio-blk-device,drive={d},serial={d}",
                d.to_ascii_uppercase()
            )
        })
        .collect();
    format!(
        r#"export WORK=/tmp/disk-bench; mkdir -p $WORK; cd $WORK
for i in $(seq 1 {boots}); do
	cp "$STOCK_DISK" root.img
	/bin/microvm --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
		--disk path=root.img --disk path="$DISK_TOOLS",ro,id={TOOLS_SERIAL}{microvm_disks} \
		--cmdline "{args} microvirt.vmm=microvm microvirt.boot=$i" 2>&1 | sed "s/^/[microvm $i] /"
	cp "$STOCK_DISK" root.img
	/bin/qemu-system-x86_64 -L /usr/share/qemu -M microvm,acpi=on,x-option-roms=off,rtc=off -accel kvm -cpu host \
		-m 512 -smp 2 -nodefaults -no-user-config -nographic -serial stdio -monitor none -no-reboot \
		-kernel "$STOCK_VMLINUZ" -initrd "$STOCK_INITRD" -append "{defaults} {args} microvirt.vmm=qemu microvirt.boot=$i" \
		-drive id=d0,file=root.img,format=raw,if=none -device virtio-blk-device,drive=d0 \
		-drive id=tools,file="$DISK_TOOLS",format=raw,if=none,readonly=on -device virtio-blk-device,drive=tools,serial={TOOLS_SERIAL}{qemu_disks} \
		2>&1 | sed "s/^/[qemu $i] /"
done
"#
    )
}

/// What one `diskread` line measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// Sequential 1 MiB reads: MiB/s.
    Seq { mib_s: f64 },
    /// 4 KiB random reads: IOPS and mean latency.
    Rand { iops: f64, mean_us: f64 },
}

/// One `diskread` result line.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskSample {
    pub vmm: String,
    pub boot: usize,
    pub round: usize,
    pub disk: String,
    pub measure: Measure,
}

fn field(words: &[&str], key: &str) -> Option<f64> {
    words
        .iter()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Parses the `diskread VMM:BOOT:ROUND:DISK seq|rand k=v...` lines (anywhere in a console line);
/// also returns the `diskread ... error:` lines as they are.
pub fn parse(lines: &[String]) -> (Vec<DiskSample>, Vec<String>) {
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for l in lines {
        // `diskread ` as a word (not the init's `microvirt.scenario=diskread `).
        let Some(at) = l
            .match_indices("diskread ")
            .map(|(i, _)| i)
            .find(|&i| i == 0 || matches!(l.as_bytes()[i - 1], b' ' | b']'))
        else {
            continue;
        };
        let rest = &l[at + "diskread ".len()..];
        if rest.contains(" error:") || rest.starts_with("error:") {
            errors.push(rest.to_string());
            continue;
        }
        let w: Vec<&str> = rest.split_whitespace().collect();
        let (Some(label), Some(kind)) = (w.first(), w.get(1)) else {
            continue;
        };
        let l: Vec<&str> = label.split(':').collect();
        let [vmm, boot, round, disk] = l[..] else {
            continue;
        };
        let (Ok(boot), Ok(round)) = (boot.parse(), round.parse()) else {
            continue;
        };
        let measure = match *kind {
            "seq" => match field(&w, "mib_s") {
                Some(mib_s) => Measure::Seq { mib_s },
                None => continue,
            },
            "rand" => match (field(&w, "iops"), field(&w, "mean_us")) {
                (Some(iops), Some(mean_us)) => Measure::Rand { iops, mean_us },
                _ => continue,
            },
            _ => continue,
        };
        samples.push(DiskSample {
            vmm: vmm.into(),
            boot,
            round,
            disk: disk.into(),
            measure,
        });
    }
    (samples, errors)
}

/// Medians of one VMM × disk: (sequential MiB/s, random IOPS, random mean µs, samples).
pub fn medians(
    s: &[DiskSample],
    vmm: &str,
    disk: &str,
) -> (Option<f64>, Option<f64>, Option<f64>, usize) {
    let of = |f: &dyn Fn(&Measure) -> Option<f64>| -> Vec<f64> {
        s.iter()
            .filter(|x| x.vmm == vmm && x.disk == disk)
            .filter_map(|x| f(&x.measure))
            .collect()
    };
    let seq = of(&|m| match m {
        Measure::Seq { mib_s } => Some(*mib_s),
        _ => None,
    });
    let n = seq.len();
    (
        median(seq),
        median(of(&|m| match m {
            Measure::Rand { iops, .. } => Some(*iops),
            _ => None,
        })),
        median(of(&|m| match m {
            Measure::Rand { mean_us, .. } => Some(*mean_us),
            _ => None,
        })),
        n,
    )
}

fn num(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.prec$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

/// The Markdown tables: medians per VMM × disk, then the ratios (qcow2 / raw per VMM, microvm /
/// QEMU per disk; higher is better for both throughput columns).
pub fn table(s: &[DiskSample]) -> String {
    let mut out = String::from(
        "| VMM | disk | seq 1 MiB (MiB/s) | random 4 KiB (IOPS) | random mean (µs) | rounds |\n|---|---|---|---|---|---|\n",
    );
    for vmm in VMMS {
        for disk in DISKS {
            let (seq, iops, us, n) = medians(s, vmm, disk);
            out += &format!(
                "| {vmm} | {disk} | {} | {} | {} | {n} |\n",
                num(seq, 1),
                num(iops, 0),
                num(us, 0)
            );
        }
    }
    out += "\n| ratio | seq | random IOPS |\n|---|---|---|\n";
    for vmm in VMMS {
        let (rs, ri, _, _) = medians(s, vmm, "raw");
        for disk in &DISKS[1..] {
            let (qs, qi, _, _) = medians(s, vmm, disk);
            out += &format!(
                "| {vmm} {disk} / raw (goal >= 0.9x) | {} | {} |\n",
                ratio(qs, rs),
                ratio(qi, ri)
            );
        }
    }
    for disk in DISKS {
        let (ms, mi, _, _) = medians(s, "microvm", disk);
        let (qs, qi, _, _) = medians(s, "qemu", disk);
        out += &format!(
            "| microvm / QEMU, {disk} | {} | {} |\n",
            ratio(ms, qs),
            ratio(mi, qi)
        );
    }
    out
}

/// Options of [`bench`].
#[derive(Debug, Clone)]
pub struct DiskBenchOptions {
    /// Rounds over the three disks per guest boot.
    pub rounds: usize,
    /// Boots per VMM (alternating).
    pub boots: usize,
}

/// Builds the pieces and runs the benchmark in one test-host boot; returns the samples, the
/// `diskread` error lines and the console.
pub fn bench(
    prep: &crate::scenarios::Prepared,
    guest: &StockGuest,
    opts: &DiskBenchOptions,
    echo: bool,
) -> Result<(Vec<DiskSample>, Vec<String>, crate::qemu::Console), crate::scenarios::ScenarioError> {
    let disks = data_disks()?;
    let diskread = crate::scenarios::cargo_build_release_static("microvirt-testhost", "diskread")?;
    let tools = tools_disk(&prep.workdir, &diskread, opts.rounds)?;
    let extra = vec![
        ("DISK_TOOLS".to_string(), tools),
        ("DISK_RAW".to_string(), disks.raw),
        ("DISK_QCOW2".to_string(), disks.qcow2),
        ("DISK_QCOW2C".to_string(), disks.qcow2c),
    ];
    // Per guest boot: ~100 s of test-host time to the init, then the reads.
    let per_boot = 200 + 60 * opts.rounds as u64;
    let console = crate::stock::run_in_test_host(
        prep,
        guest.guest_files().into_iter().chain(extra).collect(),
        Vec::new(),
        &bench_body(opts.boots),
        "disk-bench",
        std::time::Duration::from_secs(180 + 2 * per_boot * opts.boots as u64),
        echo,
    )?;
    let (samples, errors) = parse(&console.lines);
    Ok((samples, errors, console))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn diskread_lines_parse_and_tabulate() {
        let (s, errors) = parse(&lines(&[
            "[l1   79.16] [microvm 1] diskread microvm:1:1:raw seq bytes=67108864 secs=1.0 mib_s=64.00",
            "[l1   79.20] [microvm 1] diskread microvm:1:1:raw rand reads=1000 secs=2.0 iops=500.0 mean_us=2000.0",
            "[microvm 1] diskread microvm:1:1:qcow2 seq bytes=67108864 secs=1.0 mib_s=48.00",
            "[microvm 1] diskread microvm:1:1:qcow2 rand reads=1000 secs=2.0 iops=450.0 mean_us=2222.2",
            "diskread qemu:1:1:qcow2 seq bytes=67108864 secs=1.0 mib_s=32.00",
            "diskread qemu:1:1:qcow2 rand reads=1000 secs=2.0 iops=300.0 mean_us=3333.3",
            "[qemu 1] diskread qemu:1:2:qcow2c error: no disk with serial qcow2c",
            "diskread qemu:1:x:raw seq mib_s=1",
            "diskread qemu:1:1:raw seq bytes=1",
            "diskread bad seq mib_s=1",
            "noise",
            "[microvm 1] microvirt: cmdline quiet microvirt.scenario=diskread microvirt.vmm=microvm error: x",
        ]));
        assert_eq!(s.len(), 6, "{s:?}");
        assert_eq!(
            s[1],
            DiskSample {
                vmm: "microvm".into(),
                boot: 1,
                round: 1,
                disk: "raw".into(),
                measure: Measure::Rand {
                    iops: 500.0,
                    mean_us: 2000.0
                }
            }
        );
        assert_eq!(
            errors,
            vec!["qemu:1:2:qcow2c error: no disk with serial qcow2c"]
        );
        assert_eq!(
            medians(&s, "microvm", "qcow2"),
            (Some(48.0), Some(450.0), Some(2222.2), 1)
        );
        let t = table(&s);
        assert!(
            t.contains("| microvm | raw | 64.0 | 500 | 2000 | 1 |"),
            "{t}"
        );
        assert!(t.contains("| qemu | raw | - | - | - | 0 |"), "{t}");
        assert!(
            t.contains("| microvm qcow2 / raw (goal >= 0.9x) | 0.75x | 0.90x |"),
            "{t}"
        );
        assert!(
            t.contains("| microvm / QEMU, qcow2 | 1.50x | 1.50x |"),
            "{t}"
        );
        assert!(t.contains("| microvm / QEMU, raw | - | - |"), "{t}");
    }

    #[test]
    fn medians_of_even_counts_average() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn the_data_has_holes_and_the_scripts_name_every_disk() {
        let v = data(&[Path::new("/nonexistent")], 1 << 20);
        assert_eq!(v.len(), 1 << 20);
        let dir = std::env::temp_dir().join(format!("diskbench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), vec![7u8; 2 << 20]).unwrap();
        let v = data(&[&dir], 1 << 20);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(v[..768 << 10].iter().all(|b| *b == 7));
        assert!(v[768 << 10..].iter().all(|b| *b == 0));
        let body = bench_body(2);
        assert!(body.contains("seq 1 2") && body.contains("acpi=on"));
        for d in DISKS {
            assert!(
                body.contains(&format!("id={d},ro")) || body.contains(&format!(",id={d}")),
                "{body}"
            );
            assert!(body.contains(&format!("serial={d}")), "{body}");
        }
        assert!(
            guest_script(3).contains("seq 1 3") && guest_script(3).contains("raw qcow2 qcow2c")
        );
    }
}
