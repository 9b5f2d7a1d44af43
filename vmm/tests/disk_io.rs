//! Disk I/O off the event loop: a disk whose writes block (its file system frozen with
//! FIFREEZE, a real kernel mechanism) stalls only its own requests; the VM's other disk keeps
//! being served meanwhile, and the blocked write completes once the file system thaws.

mod common;
mod snapshot_common;

use common::guest;
use snapshot_common::*;

/// One line of the slowdisk scenario that decides the test: the first that is not an `ok`
/// round with vda pending, or round `n`.
fn decisive(l: &str, n: u64) -> bool {
    let Some(rest) = l.strip_prefix("slowdisk: vdb ") else {
        return l.starts_with("slowdisk: ")
            && !["slowdisk: ready", "slowdisk: vda submitted"].contains(&l);
    };
    let mut it = rest.split_whitespace();
    let i: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let ok = it.next() == Some("ok") && it.next() == Some("vda=pending");
    !ok || i >= n
}

#[test]
fn a_blocked_disk_does_not_stall_the_other_disk() {
    const ROUNDS: u64 = 20;
    let t = TempDir::new("slowdisk");
    let img = ext4_image(&t, "slow.ext4", &[("vda.img", 1 << 20)]);
    let vdb = t.join("vdb.img");
    std::fs::write(&vdb, vec![0u8; 1 << 20]).unwrap();
    let mnt = t.join("mnt");
    let kernel = guest().pvh.display().to_string();
    let vda = mnt.join("vda.img");
    let mut vm = microvm_with_mount(
        &img,
        &mnt,
        &[
            "--kernel",
            &kernel,
            "--disk",
            &format!("path={}", vda.display()),
            "--disk",
            &format!("path={}", vdb.display()),
            "--cmdline",
            "testguest.scenario=slowdisk",
        ],
        true,
    );
    vm.wait_line("slowdisk ready", |l| l == "slowdisk: ready");
    // From here until the thaw, a write to vda blocks in the kernel.
    let mut frozen = Frozen::freeze(vm.pid(), &mnt);
    vm.send("go\n");
    let l = vm.wait_line("vdb rounds while vda is blocked", |l| decisive(l, ROUNDS));
    assert_eq!(
        l,
        format!("slowdisk: vdb {ROUNDS} ok vda=pending"),
        "vdb was not served while vda's write was blocked; {}",
        vm.context()
    );
    // The write really is stuck in vda's I/O thread (not lost, not done).
    wait_thread_state(vm.pid(), "blk-io0", 'D');
    frozen.thaw();
    let done = vm.wait_line("vda done", |l| l.starts_with("slowdisk: vda done"));
    assert!(
        done.starts_with("slowdisk: vda done status=0 after="),
        "{done}"
    );
    vm.wait_line("vda read back", |l| l == "slowdisk: vda read-back ok");
    vm.wait_line("the end", |l| l == "slowdisk: end");
    assert!(vm.wait_exit(WAIT).success(), "{}", vm.context());
    // The guest's write reached the image: sector 0 holds the test pattern.
    let data = std::fs::read(frozen.path("vda.img")).unwrap();
    for w in 0..64u64 {
        let word = u64::from_le_bytes(data[w as usize * 8..][..8].try_into().unwrap());
        assert_eq!(
            word,
            0x6d76_0000_0000_0000 ^ (w << 8),
            "word {w} of sector 0"
        );
    }
}
