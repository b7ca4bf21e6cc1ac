//! The machine's read bandwidth, the ceiling that decode on the CPU is
//! measured against: `threads` threads each sum their share of a buffer
//! far larger than the caches, several rounds, printing GB/s per round.
//!
//! `mem-bandwidth [threads] [MiB] [rounds]` (defaults 1, 2048, 5).

use std::time::Instant;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map(|a| a.parse().expect("arguments are whole numbers"))
            .unwrap_or(default)
    };
    let (threads, mib, rounds) = (arg(1, 1).max(1), arg(2, 2048), arg(3, 5));
    // Written, so every page is real memory rather than the shared zero page.
    let buf: Vec<u64> = (0..(mib << 20) / 8).map(|i| i as u64).collect();
    let share = buf.len().div_ceil(threads);
    for round in 1..=rounds {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(share)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            parts
                .into_iter()
                .map(|p| p.join().expect("reader"))
                .fold(0, u64::wrapping_add)
        });
        let secs = t.elapsed().as_secs_f64();
        println!(
            "threads {threads}, {mib} MiB, round {round}: {:.1} GB/s (checksum {total:x})",
            (buf.len() * 8) as f64 / secs / 1e9
        );
    }
}

/// Sum of `xs` in eight independent lanes, which the compiler vectorises,
/// so the loop is bound by loads, not by an addition chain.
fn sum(xs: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    for c in xs.chunks_exact(8) {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(*v);
        }
    }
    lanes.iter().fold(0, |a, &b| a.wrapping_add(b))
}
