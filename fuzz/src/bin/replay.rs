//! Runs one target on input files without libFuzzer (no sanitizer; set
//! `MICROVIRT_FUZZ_TRACE=1` to see what the target does): `replay TARGET FILE...`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((target, files)) = args.split_first() else {
        eprintln!("usage: replay TARGET FILE...");
        std::process::exit(2);
    };
    let Some((_, f)) = microvirt_fuzz::TARGETS.iter().find(|(n, _)| n == target) else {
        eprintln!("unknown target {target}");
        std::process::exit(2);
    };
    for file in files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        f(&data);
        println!("{file}: ok");
    }
}
