//! The shared CPU sampler's cost per row: `sampler-bench [--rows N]`
//! prints microseconds a row for each vocabulary and parameter set, on
//! seeded rows of normally distributed logits (a spread of 2 and of 4,
//! where top-p keeps fewer and more of the row).

use std::time::Instant;

use tokenwire_core::rng::Rng;
use tokenwire_core::SamplingParams;
use tokenwire_kernels::Sampler;

/// A row of `n` logits, normal with standard deviation `spread`.
fn row(rng: &mut Rng, n: usize, spread: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Box-Muller.
            let u = rng.next_f64().max(1e-300);
            let v = rng.next_f64();
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * spread) as f32
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut rows = 64usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rows" => rows = args.next().and_then(|v| v.parse().ok()).unwrap_or(rows),
            other => {
                eprintln!("usage: sampler-bench [--rows N] (unknown argument {other})");
                std::process::exit(2);
            }
        }
    }
    let sets: [(&str, SamplingParams); 6] = [
        ("greedy", SamplingParams::greedy()),
        ("t 1.0", SamplingParams::default()),
        (
            "t 0.8",
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::default()
            },
        ),
        (
            "t 0.8 top-p 0.95",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                ..SamplingParams::default()
            },
        ),
        (
            "t 0.8 top-k 40",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                ..SamplingParams::default()
            },
        ),
        (
            "t 0.8 top-p 0.95 freq 0.5",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
        ),
    ];
    println!(
        "{:>8} {:>7} {:<28} {:>10}",
        "vocab", "spread", "params", "us/row"
    );
    let mut sampler = Sampler::new();
    let history: Vec<u32> = (0..256u32).map(|i| i * 97 % 30_000).collect();
    let mut sink = 0u64;
    for vocab in [32_000usize, 49_152, 128_256] {
        for spread in [2.0, 4.0] {
            let mut rng = Rng::new(vocab as u64 ^ spread as u64);
            let logits: Vec<Vec<f32>> = (0..rows).map(|_| row(&mut rng, vocab, spread)).collect();
            for (name, params) in &sets {
                let start = Instant::now();
                for (i, l) in logits.iter().enumerate() {
                    let p = SamplingParams {
                        seed: i as u64,
                        ..params.clone()
                    };
                    sink += sampler.sample(l, &p, i as u32, &history, None).0 as u64;
                }
                let us = start.elapsed().as_secs_f64() * 1e6 / rows as f64;
                println!("{vocab:>8} {spread:>7} {name:<28} {us:>10.1}");
            }
        }
    }
    eprintln!("(checksum {sink})");
}
