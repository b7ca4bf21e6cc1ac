//! `quant-kernels`: one CPU dot-product kernel alone, on rows that fit in
//! cache or stream from memory, so a kernel's arithmetic can be told apart
//! from the memory feeding it.
//!
//! ```text
//! quant-kernels q8_0|q4_0|q4_1|q5_0|q5_1|q3_k|q4_k|q5_k|q6_k K ROWS row|tile [SECONDS]
//! ```
//!
//! `ROWS` random rows of `K` weights, interleaved as the engine keeps them
//! ([`RowLayout`] of the kernels this CPU gets, `TOKENWIRE_CPU_KERNELS`
//! choosing as in the server), against random activations quantized as the
//! engine quantizes them. `row` runs the decode kernel (one row against one
//! token, rows in order, as a decode step streams a matrix); `tile` runs the
//! four-rows-by-four-tokens kernel over 32 tokens (a batched decode step).
//! Prints multiply-adds per second and the matrix's bytes per second (for
//! `tile`, each row is read once for all 32 tokens): a few hundred rows stay
//! in L2, tens of thousands stream from memory. `K` need not be a multiple
//! of 256: the blocks past the last whole eight take the kernels' tail path,
//! as SmolLM2's 576-wide rows do. The K-quants (256-value super-blocks,
//! against activations quantized to 8 bits per 256) need `K` a multiple of
//! 256.

use std::time::{Duration, Instant};

use tokenwire_core::rng::Rng;
use tokenwire_kernels::gguf::GgmlType;
use tokenwire_kernels::quant::{
    group_q8, lanes, quantize_q8, quantize_q8k, Kernels, Q8Block, Q8Group, Q8KBlock, Q8Row,
    RowLayout,
};

/// Tokens the `tile` shape runs (a batched decode step's worth).
const TILE_TOKENS: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: quant-kernels q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_xs K ROWS row|tile [SECONDS]";
    let dtype = match args.first().map(String::as_str) {
        Some("q8_0") => GgmlType::Q8_0,
        Some("q4_0") => GgmlType::Q4_0,
        Some("q4_1") => GgmlType::Q4_1,
        Some("q5_0") => GgmlType::Q5_0,
        Some("q5_1") => GgmlType::Q5_1,
        Some("q2_k") => GgmlType::Q2_K,
        Some("q3_k") => GgmlType::Q3_K,
        Some("q4_k") => GgmlType::Q4_K,
        Some("q5_k") => GgmlType::Q5_K,
        Some("q6_k") => GgmlType::Q6_K,
        Some("iq4_nl") => GgmlType::IQ4_NL,
        Some("iq4_xs") => GgmlType::IQ4_XS,
        _ => fail(usage),
    };
    let number = |i: usize| -> usize {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| fail(usage))
    };
    let (k, rows) = (number(1), number(2));
    let tile = match args.get(3).map(String::as_str) {
        Some("row") => false,
        Some("tile") => true,
        _ => fail(usage),
    };
    let seconds = args.get(4).map_or(2.0, |a| a.parse().unwrap_or(2.0));
    let per = dtype.block_len();
    if k == 0 || k % per != 0 || rows == 0 || rows % 4 != 0 {
        fail(&format!(
            "K must be a positive multiple of {per} (whole blocks) and ROWS of 4"
        ));
    }

    let kernels = Kernels::detect();
    let row_bytes = dtype.row_bytes(k as u64).expect("whole blocks") as usize;
    // Seeded, so runs compare.
    let mut rng = Rng::new(7);
    let weights = random_rows(dtype, row_bytes, rows, kernels.layout, &mut rng);
    let tokens: Vec<(Vec<Q8Block>, Vec<Q8Group>)> = (0..TILE_TOKENS)
        .map(|_| {
            let x: Vec<f32> = (0..k).map(|_| unit(&mut rng)).collect();
            let mut blocks = Vec::new();
            quantize_q8(&x, &mut blocks);
            let mut groups = vec![Q8Group::default(); k / 256];
            group_q8(&blocks, &mut groups);
            (blocks, groups)
        })
        .collect();
    let k_tokens: Vec<Vec<Q8KBlock>> = (0..TILE_TOKENS)
        .filter(|_| per == 256)
        .map(|_| {
            let x: Vec<f32> = (0..k).map(|_| unit(&mut rng)).collect();
            let mut blocks = Vec::new();
            quantize_q8k(&x, &mut blocks);
            blocks
        })
        .collect();
    let acts: Vec<Q8Row<'_>> = tokens
        .iter()
        .map(|(blocks, groups)| Q8Row { blocks, groups })
        .collect();
    let row = |r: usize| &weights[r * row_bytes..(r + 1) * row_bytes];

    let budget = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let (mut sweeps, mut sink) = (0usize, 0.0f32);
    while start.elapsed() < budget {
        if per == 256 {
            let (one, four) = kernels.for_q8k(dtype).expect("a 256-block format");
            if tile {
                for r in (0..rows).step_by(4) {
                    let w = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                    for t in (0..TILE_TOKENS).step_by(4) {
                        let a = [0, 1, 2, 3].map(|i| k_tokens[t + i].as_slice());
                        sink += four(&w, &a)[0][0];
                    }
                }
            } else {
                for r in 0..rows {
                    sink += one(row(r), &k_tokens[r % TILE_TOKENS]);
                }
            }
        } else if tile {
            let (_, dot) = kernels.for_q8(dtype).expect("a 32-block format");
            for r in (0..rows).step_by(4) {
                let w = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                for t in (0..TILE_TOKENS).step_by(4) {
                    let a = [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]];
                    sink += dot(&w, &a)[0][0];
                }
            }
        } else {
            let (dot, _) = kernels.for_q8(dtype).expect("a 32-block format");
            for r in 0..rows {
                sink += dot(row(r), &acts[r % TILE_TOKENS]);
            }
        }
        sweeps += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let tokens = if tile { TILE_TOKENS } else { 1 };
    let macs = (sweeps * rows * k * tokens) as f64;
    let bytes = (sweeps * rows * row_bytes) as f64;
    println!(
        "{dtype:?} {} kernels, {} x {k}, {rows} rows ({:.1} MiB): {:.2} G multiply-adds/s, \
         matrix at {:.2} GB/s (checksum {sink:.3})",
        kernels.isa.name(),
        if tile { "tile" } else { "row" },
        (rows * row_bytes) as f64 / (1u64 << 20) as f64,
        macs / secs / 1e9,
        bytes / secs / 1e9,
    );
}

/// `rows` rows of random blocks with small finite scales, laid out as
/// `layout` says.
fn random_rows(
    dtype: GgmlType,
    row_bytes: usize,
    rows: usize,
    layout: RowLayout,
    rng: &mut Rng,
) -> Vec<u8> {
    let mut file = vec![0u8; row_bytes * rows];
    rng.fill(&mut file);
    // The f16 fields: the scale; Q4_1's and Q5_1's minimum after it (Q4_K's
    // and Q5_K's too); Q3_K's and Q6_K's at their blocks' ends; IQ4_XS's
    // at 0, before its scale bits.
    let fields: &[usize] = match dtype {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for block in file.chunks_exact_mut(dtype.block_bytes()) {
        for &at in fields {
            let v = half::f16::from_f32(unit(rng) * 0.05);
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    if !lanes::changes(dtype, layout) {
        return file;
    }
    let mut out = vec![0u8; file.len()];
    for (src, dst) in file
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        lanes::interleave_row(dtype, src, dst);
    }
    out
}

/// Uniform in [-1, 1).
fn unit(rng: &mut Rng) -> f32 {
    (rng.next_f64() * 2.0 - 1.0) as f32
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}
