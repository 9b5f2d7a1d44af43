//! The targets as ordinary tests: every seed and every committed corpus input must pass (the
//! corpus is the regression suite: inputs that once found a bug stay in it), and pseudo-random
//! inputs must not trip a target's own checks.

use std::path::Path;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd {
            let p = e.expect("corpus entry").path();
            v.push((
                p.display().to_string(),
                std::fs::read(&p).expect("corpus file"),
            ));
        }
    }
    v.sort();
    v
}

fn target(name: &str) -> microvirt_fuzz::Target {
    microvirt_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no target {name}"))
}

#[test]
fn seeds_pass() {
    for (t, name, bytes) in microvirt_fuzz::seeds::all() {
        eprintln!("{t}: seed {name}");
        target(t)(&bytes);
    }
}

#[test]
fn committed_corpus_passes() {
    for (t, _) in microvirt_fuzz::TARGETS {
        for (path, bytes) in corpus(t) {
            eprintln!("{t}: {path}");
            target(t)(&bytes);
        }
    }
}

#[test]
fn random_inputs_pass() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (t, f) in microvirt_fuzz::TARGETS {
        for _ in 0..40 {
            let len = (next() % 2048) as usize;
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if std::panic::catch_unwind(|| f(&data)).is_err() {
                let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("failure-{t}"));
                std::fs::write(&path, &data).expect("write the failing input");
                panic!("{t}: failing input written to {}", path.display());
            }
        }
    }
}
