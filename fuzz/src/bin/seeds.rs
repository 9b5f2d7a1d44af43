//! Writes every target's seed inputs to `corpus/<target>/seed-<name>` (run from `fuzz/`).

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, name, bytes) in microvirt_fuzz::seeds::all() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        let path = dir.join(format!("seed-{name}"));
        std::fs::write(&path, bytes).expect("write seed");
        println!("{}", path.display());
    }
}
