//! Writes every target's seed inputs to `corpus/<target>/seed-<name>` (run from `fuzz/`); the
//! `bootdisk` seeds need mkfs.ext4 (e2fsprogs) and sfdisk (fdisk).

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, name, bytes) in microvirt_fuzz::seeds::all() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        let path = dir.join(format!("seed-{name}"));
        std::fs::write(&path, bytes).expect("write seed");
        println!("{}", path.display());
    }
    // Disk images built with mkfs.ext4 and sfdisk (not part of `seeds::all`, which the tests
    // run without those tools).
    let dir = root.join("bootdisk");
    std::fs::create_dir_all(&dir).expect("corpus directory");
    for (name, bytes) in microvirt_fuzz::bootdisk::image_seeds() {
        let path = dir.join(format!("seed-{name}"));
        std::fs::write(&path, bytes).expect("write seed");
        println!("{}", path.display());
    }
}
