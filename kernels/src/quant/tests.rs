//! Every kernel of every instruction set this CPU has, against the scalar
//! reference, and the reference against plain f64 arithmetic on the
//! dequantized values.

use tokenwire_gguf::GgmlType;

use super::blocks::{dequantize_row, QK_K};
use super::*;

/// The formats of 32-value blocks, which 8-bit activation blocks of 32 meet.
const BLOCK32: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
];

/// The formats of 256-value super-blocks, which 8-bit activation blocks of
/// 256 meet.
const BLOCK256: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// xorshift64*: deterministic bytes for fabricated blocks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Offsets of the f16 fields of one block of `dtype`.
fn f16_fields(dtype: GgmlType) -> &'static [usize] {
    match dtype {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        _ => &[],
    }
}

/// A row of `n` values of `dtype` from random bytes, with its f16 scales set
/// to small finite values (random bits would include NaN and infinity).
fn random_row(dtype: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = dtype.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut row: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    match dtype {
        GgmlType::F32 => {
            for c in row.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.unit().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.unit()).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.unit()).to_le_bytes());
            }
        }
        _ => {
            for block in row.chunks_exact_mut(dtype.block_bytes()) {
                for &at in f16_fields(dtype) {
                    let v = half::f16::from_f32(rng.unit() * 0.05);
                    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    row
}

fn random_acts(n: usize, rng: &mut Rng) -> Vec<f32> {
    // Mostly small with a few outliers, as real hidden states are.
    (0..n)
        .map(|i| rng.unit() * if i % 61 == 0 { 20.0 } else { 1.0 })
        .collect()
}

/// What a kernel must compute: the dequantized weights times the activations
/// as the kernel sees them (after their own quantization), in f64.
fn exact(dtype: GgmlType, w: &[u8], x: &[f32]) -> (f64, f64) {
    let mut wf = vec![0.0f32; x.len()];
    dequantize_row(dtype, w, &mut wf);
    let xs: Vec<f32> = match act_format(dtype) {
        ActFormat::F32 => x.to_vec(),
        ActFormat::Q8 => {
            let mut q = Vec::new();
            quantize_q8(x, &mut q);
            q.iter()
                .flat_map(|b| b.q.iter().map(move |&v| b.d * v as f32))
                .collect()
        }
        ActFormat::Q8K => {
            let mut q = Vec::new();
            quantize_q8k(x, &mut q);
            q.iter()
                .flat_map(|b| b.q.iter().map(move |&v| b.d * v as f32))
                .collect()
        }
    };
    let dot: f64 = wf.iter().zip(&xs).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = wf
        .iter()
        .zip(&xs)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    (dot, mag)
}

/// How far a kernel's f32 sum may be from the exact one: a few ulps per
/// term at most, relative to the sum of the terms' magnitudes `mag`.
fn tolerance(mag: f64) -> f64 {
    mag * 1e-6 + 1e-6
}

/// Asserts that every instruction set's kernel for `dtype` gives `want`
/// within `tol` for `w · x`; `what` names the case in a failure.
fn assert_every_isa_gives(dtype: GgmlType, w: &[u8], x: &[f32], want: f64, tol: f64, what: &str) {
    for isa in Isa::available() {
        let got = run(&Kernels::for_isa(isa), dtype, w, x) as f64;
        assert!(
            (got - want).abs() <= tol,
            "{dtype} {what} {}: got {got}, want {want} (tolerance {tol})",
            isa.name()
        );
    }
}

/// `x` quantized for the 32-block kernels: its blocks and their groups.
fn q8_acts(x: &[f32]) -> (Vec<Q8Block>, Vec<Q8Group>) {
    let mut blocks = Vec::new();
    quantize_q8(x, &mut blocks);
    let mut groups = vec![Q8Group::default(); blocks.len() / 8];
    group_q8(&blocks, &mut groups);
    (blocks, groups)
}

/// The file-layout row `w` in the layout `k`'s kernels read.
fn laid(k: &Kernels, dtype: GgmlType, w: &[u8]) -> Vec<u8> {
    let mut out = vec![0; w.len()];
    match k.layout {
        RowLayout::File => out.copy_from_slice(w),
        RowLayout::Lanes8 => lanes::interleave_row(dtype, w, &mut out),
    }
    out
}

/// `k`'s kernel for `dtype` on the file-layout row `w` and activations `x`.
fn run(k: &Kernels, dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    match act_format(dtype) {
        ActFormat::F32 => match dtype {
            GgmlType::F16 => (k.f16)(w, x),
            GgmlType::BF16 => (k.bf16)(w, x),
            _ => {
                let wf: Vec<f32> = w
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                (k.f32)(&wf, x)
            }
        },
        ActFormat::Q8 => {
            let (blocks, groups) = q8_acts(x);
            let (f, _) = k.for_q8(dtype).expect("a 32-block format");
            f(
                &laid(k, dtype, w),
                &Q8Row {
                    blocks: &blocks,
                    groups: &groups,
                },
            )
        }
        ActFormat::Q8K => {
            let mut q = Vec::new();
            quantize_q8k(x, &mut q);
            let (f, _) = k.for_q8k(dtype).expect("a 256-block format");
            f(w, &q)
        }
    }
}

#[test]
fn every_format_has_kernels_for_the_activations_it_is_given() {
    let k = Kernels::detect();
    for dtype in GgmlType::ALL {
        let format = act_format(dtype);
        assert_eq!(
            k.for_q8(dtype).is_some(),
            format == ActFormat::Q8,
            "{dtype}"
        );
        assert_eq!(
            k.for_q8k(dtype).is_some(),
            format == ActFormat::Q8K,
            "{dtype}"
        );
        assert_eq!(
            BLOCK32.contains(&dtype) || BLOCK256.contains(&dtype),
            format != ActFormat::F32,
            "{dtype}: every quantized format is in this file's lists"
        );
    }
}

#[test]
fn every_kernel_computes_the_dot_product_of_what_it_was_given() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for dtype in GgmlType::ALL {
        // Lengths with a tail for the float kernels' 32-wide loops.
        let lens: &[usize] = match dtype.block_len() {
            1 => &[8, 40, 576, 1000],
            // Whole groups of eight blocks, and groups with a tail: one
            // block, a pair, a pair and one, three pairs and one.
            32 => &[32, 96, 256, 288, 320, 352, 576, 1536, 5632, 224],
            _ => &[QK_K, 2048],
        };
        for &n in lens {
            for _ in 0..20 {
                let w = random_row(dtype, n, &mut rng);
                let x = random_acts(n, &mut rng);
                let (want, mag) = exact(dtype, &w, &x);
                assert_every_isa_gives(dtype, &w, &x, want, tolerance(mag), &format!("n={n}"));
            }
        }
    }
}

#[test]
fn tile_kernels_give_the_one_row_one_token_kernels_bits() {
    let mut rng = Rng(41);
    for isa in Isa::available() {
        let k = Kernels::for_isa(isa);
        for dtype in BLOCK32 {
            let (one, tile) = k.for_q8(dtype).expect("a 32-block format");
            for n in [32, 64, 96, 224, 256, 352, 576, 1536] {
                let rows: Vec<Vec<u8>> = (0..4)
                    .map(|_| laid(&k, dtype, &random_row(dtype, n, &mut rng)))
                    .collect();
                let acts: Vec<(Vec<Q8Block>, Vec<Q8Group>)> =
                    (0..4).map(|_| q8_acts(&random_acts(n, &mut rng))).collect();
                let row = |j: usize| Q8Row {
                    blocks: &acts[j].0,
                    groups: &acts[j].1,
                };
                let got = tile(
                    &[&rows[0], &rows[1], &rows[2], &rows[3]],
                    &[row(0), row(1), row(2), row(3)],
                );
                for (r, w) in rows.iter().enumerate() {
                    for (j, got) in got[r].iter().enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            one(w, &row(j)).to_bits(),
                            "{dtype} n={n} row {r} token {j} {}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn k_quant_tiles_give_the_one_row_one_token_kernels_bits() {
    let mut rng = Rng(43);
    for isa in Isa::available() {
        let k = Kernels::for_isa(isa);
        for dtype in BLOCK256 {
            let (one, tile) = k.for_q8k(dtype).expect("a 256-block format");
            for n in [QK_K, 2048] {
                let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(dtype, n, &mut rng)).collect();
                let acts: Vec<Vec<Q8KBlock>> = (0..4)
                    .map(|_| {
                        let mut q = Vec::new();
                        quantize_q8k(&random_acts(n, &mut rng), &mut q);
                        q
                    })
                    .collect();
                let got = tile(
                    &[&rows[0], &rows[1], &rows[2], &rows[3]],
                    &[&acts[0], &acts[1], &acts[2], &acts[3]],
                );
                for (r, w) in rows.iter().enumerate() {
                    for (j, got) in got[r].iter().enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            one(w, &acts[j]).to_bits(),
                            "{dtype} n={n} row {r} token {j} {}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_x86_tier_gives_the_same_bits() {
    // AVX2's maddubs, AVX-VNNI's and AVX-512 VNNI's vpdpbusd all sum the
    // same exact integers before the same float steps, so a model gives the
    // same tokens whichever tier the CPU has.
    let tiers: Vec<Kernels> = Isa::available()
        .into_iter()
        .filter(|i| *i != Isa::Scalar && *i != Isa::Neon)
        .map(Kernels::for_isa)
        .collect();
    let mut rng = Rng(61);
    for dtype in BLOCK32 {
        for n in [32, 96, 256, 288, 352, 576, 1536] {
            let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(dtype, n, &mut rng)).collect();
            let acts: Vec<(Vec<Q8Block>, Vec<Q8Group>)> =
                (0..4).map(|_| q8_acts(&random_acts(n, &mut rng))).collect();
            let row = |j: usize| Q8Row {
                blocks: &acts[j].0,
                groups: &acts[j].1,
            };
            let results: Vec<(Isa, [[u32; 4]; 4])> = tiers
                .iter()
                .map(|k| {
                    let rows: Vec<Vec<u8>> = rows.iter().map(|w| laid(k, dtype, w)).collect();
                    let (_, tile) = k.for_q8(dtype).expect("a 32-block format");
                    let got = tile(
                        &[&rows[0], &rows[1], &rows[2], &rows[3]],
                        &[row(0), row(1), row(2), row(3)],
                    );
                    (k.isa, got.map(|r| r.map(f32::to_bits)))
                })
                .collect();
            // Off x86 (NEON under qemu in CI) there are no tiers to compare.
            let Some((first, want)) = results.first() else {
                continue;
            };
            for (isa, bits) in &results[1..] {
                assert_eq!(
                    bits,
                    want,
                    "{dtype} n={n}: {} against {}",
                    isa.name(),
                    first.name()
                );
            }
        }
    }
}

#[test]
fn a_wrong_weight_anywhere_in_a_row_is_caught() {
    // Planted errors: one weight changed in the first block, the last lane
    // of a group, both blocks of the pair after the last whole group and
    // the odd block after that. Each kernel must
    // follow the change, and the change must lie outside the tolerance the
    // other tests allow, so a kernel that skipped that block would fail them.
    let mut rng = Rng(67);
    let n = 32 * 19; // two whole groups, then a pair and one block
    for dtype in BLOCK32 {
        let bytes = dtype.block_bytes();
        // Bytes before the first weight byte: scale (and minimum), and a
        // Q5 block's high-bit word.
        let head = match dtype {
            GgmlType::Q4_1 => 4,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 8,
            _ => 2,
        };
        let mut w = random_row(dtype, n, &mut rng);
        for block in [0, 15, 16, 17, 18] {
            // A scale large enough that the planted step shows.
            let at = block * bytes;
            w[at..at + 2].copy_from_slice(&half::f16::from_f32(0.05).to_le_bytes());
        }
        let x: Vec<f32> = (0..n).map(|_| 0.5 + rng.unit().abs()).collect();
        let (want, mag) = exact(dtype, &w, &x);
        for block in [0, 15, 16, 17, 18] {
            let mut planted = w.clone();
            // The first weight byte: for the nibble formats weights 0 and
            // 16, raised or lowered by a few steps.
            let at = block * bytes + head;
            planted[at] = planted[at].wrapping_add(if planted[at] & 0x0F < 8 {
                5
            } else {
                -5i8 as u8
            });
            let (moved, _) = exact(dtype, &planted, &x);
            let tol = tolerance(mag);
            assert!(
                (moved - want).abs() > 100.0 * tol,
                "{dtype} block {block}: the planted change is within tolerance"
            );
            assert_every_isa_gives(dtype, &planted, &x, moved, tol, &format!("block {block}"));
        }
    }
}

#[test]
fn the_largest_products_do_not_overflow_any_tier() {
    // Every weight byte at its extreme (nibbles of 15, Q5's values of 31
    // when the high-bit words are all ones, Q8_0's -128 and 127, Q6_K's
    // 6-bit values of 63, whose pairs of products two x86 vectors sum in
    // one i16 up to 32,004; IQ4's table ends, -127 and 113, and IQ4_XS's
    // scales of -32 and 31) against activations that quantize to ±127
    // everywhere: the largest i16 pairs and sums any kernel forms.
    for dtype in BLOCK32.into_iter().chain(BLOCK256) {
        let n = match dtype.block_len() {
            32 => 32 * 11, // a group, a pair, one block
            _ => QK_K * 2,
        };
        for (fill, sign) in [
            (0xFFu8, 1.0f32),
            (0xFF, -1.0),
            (0x80, 1.0),
            (0x80, -1.0),
            (0x7F, 1.0),
            (0x00, 1.0),
            (0x00, -1.0),
        ] {
            let bytes = dtype.block_bytes();
            let mut w = vec![fill; dtype.row_bytes(n as u64).unwrap() as usize];
            for block in w.chunks_exact_mut(bytes) {
                for &at in f16_fields(dtype) {
                    block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            let x = vec![sign; n];
            let (want, mag) = exact(dtype, &w, &x);
            let what = format!("bytes {fill:#x} x {sign}");
            assert_every_isa_gives(dtype, &w, &x, want, tolerance(mag), &what);
        }
    }
}

#[test]
fn every_instruction_set_quantizes_to_the_same_bits() {
    let mut rng = Rng(71);
    let mut x = random_acts(32 * 40, &mut rng);
    // Blocks of zeros, of a NaN among values, of an infinity, of ties.
    x[32..64].fill(0.0);
    x[70] = f32::NAN;
    x[100] = f32::INFINITY;
    x[130] = -f32::INFINITY;
    x[160..192].copy_from_slice(&[0.5f32, -0.5, 127.0, -1.0].repeat(8));
    // A subnormal largest value (its inverse scale overflows to infinity)
    // and values near f32's largest.
    x[192..224].fill(1e-40);
    x[200] = -3e-41;
    x[224..256].copy_from_slice(&[3e38f32, -1e38, 2.5e38, -3.4e38].repeat(8));
    let mut want = vec![Q8Block::default(); 40];
    quantize_q8_into(&x, &mut want);
    // Never -128 (the sign trick negates activations), infinities and the
    // subnormal block's infinite inverse scale included.
    assert!(want.iter().all(|b| b.q.iter().all(|&q| q >= -127)));
    assert!(want[6].q.contains(&-127), "the subnormal block clamps");
    for isa in Isa::available() {
        let mut got = vec![Q8Block::default(); 40];
        (Kernels::for_isa(isa).quantize_q8)(&x, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                (g.d.to_bits(), g.s.to_bits(), g.q, g.neg128_sum),
                (w.d.to_bits(), w.s.to_bits(), w.q, w.neg128_sum),
                "block {i} {}",
                isa.name()
            );
        }
    }
}

#[test]
fn groups_hold_each_block_in_its_own_lane() {
    let mut rng = Rng(53);
    let mut blocks = Vec::new();
    quantize_q8(&random_acts(32 * 20, &mut rng), &mut blocks);
    // 20 blocks make two whole groups; the last four blocks have none.
    let mut groups = vec![Q8Group::default(); 3];
    group_q8(&blocks, &mut groups);
    assert_eq!(groups[2], Q8Group::default());
    for (g, group) in groups[..2].iter().enumerate() {
        for (b, x) in blocks[8 * g..8 * g + 8].iter().enumerate() {
            assert_eq!(
                (group.d[b], group.s[b], group.neg128_sum[b]),
                (x.d, x.s, x.neg128_sum)
            );
            for (v, &q) in x.q.iter().enumerate() {
                assert_eq!(
                    group.q[v / 4][4 * b + v % 4],
                    q,
                    "group {g} block {b} value {v}"
                );
            }
        }
    }
}

#[test]
fn kernels_without_groups_read_the_blocks_alone() {
    // Kernels that read the file's layout (scalar, NEON) need no groups: a
    // row given none is the same dot product, block by block.
    let mut rng = Rng(59);
    for isa in Isa::available() {
        let k = Kernels::for_isa(isa);
        if k.layout != RowLayout::File {
            continue;
        }
        for dtype in BLOCK32 {
            let (f, _) = k.for_q8(dtype).expect("a 32-block format");
            let w = random_row(dtype, 576, &mut rng);
            let x = random_acts(576, &mut rng);
            let (want, mag) = exact(dtype, &w, &x);
            let (blocks, _) = q8_acts(&x);
            let got = f(
                &w,
                &Q8Row {
                    blocks: &blocks,
                    groups: &[],
                },
            ) as f64;
            assert!(
                (got - want).abs() <= tolerance(mag),
                "{dtype} {}: got {got}, want {want}",
                isa.name()
            );
        }
    }
}

#[test]
fn the_f16_tile_gives_the_one_token_kernels_bits() {
    let mut rng = Rng(47);
    for isa in Isa::available() {
        let k = Kernels::for_isa(isa);
        for n in [8, 40, 576, 2048] {
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| random_row(GgmlType::F16, n, &mut rng))
                .collect();
            let xs: Vec<Vec<f32>> = (0..4).map(|_| random_acts(n, &mut rng)).collect();
            let got = (k.f16_tile)(
                &[&rows[0], &rows[1], &rows[2], &rows[3]],
                &[&xs[0], &xs[1], &xs[2], &xs[3]],
            );
            for (r, w) in rows.iter().enumerate() {
                for (j, x) in xs.iter().enumerate() {
                    assert_eq!(
                        got[r][j].to_bits(),
                        (k.f16)(w, x).to_bits(),
                        "n={n} row {r} token {j} {}",
                        isa.name()
                    );
                }
            }
        }
    }
}

#[test]
fn activations_quantize_within_half_a_step() {
    let mut rng = Rng(7);
    let x = random_acts(512, &mut rng);
    let (mut q8, mut q8k) = (Vec::new(), Vec::new());
    quantize_q8(&x, &mut q8);
    quantize_q8k(&x, &mut q8k);
    for (b, xs) in q8.iter().zip(x.chunks_exact(32)) {
        let sum: i32 = b.q.iter().map(|&q| q as i32).sum();
        assert_eq!(b.s, b.d * sum as f32);
        for (&q, &v) in b.q.iter().zip(xs) {
            assert!((b.d * q as f32 - v).abs() <= b.d * 0.5 + 1e-6);
        }
    }
    for (b, xs) in q8k.iter().zip(x.chunks_exact(256)) {
        for (g, &s) in b.bsums.iter().enumerate() {
            let want: i16 = b.q[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(s, want);
        }
        for (&q, &v) in b.q.iter().zip(xs) {
            assert!((b.d * q as f32 - v).abs() <= b.d * 0.5 + 1e-6);
        }
    }
    // An all-zero block has scale 0 and all-zero values, not NaN.
    quantize_q8(&[0.0; 32], &mut q8);
    assert_eq!((q8[0].d, q8[0].s, q8[0].q), (0.0, 0.0, [0; 32]));
}

#[test]
fn the_detected_kernels_are_the_best_available() {
    let best = Isa::detect();
    assert_eq!(Kernels::detect().isa, best);
    assert_eq!(Isa::available().last(), Some(&best));
    assert_eq!(Kernels::for_isa(Isa::Scalar).isa, Isa::Scalar);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn q4_k_scales_unpack_four_bytes_at_a_time_as_the_reference_unpacks_them() {
    // Every bit of the twelve bytes lands somewhere; random patterns set
    // and clear each of them many times.
    let mut rng = Rng(71);
    for _ in 0..2000 {
        let bytes: [u8; 12] = std::array::from_fn(|_| rng.next() as u8);
        let (scales, mins) = super::x86::q4k_scales_mins(&bytes);
        for j in 0..8 {
            let (sc, m) = super::blocks::q4k_scale_min(&bytes, j);
            assert_eq!((scales >> (8 * j)) as u8, sc, "scale {j} of {bytes:?}");
            assert_eq!((mins >> (8 * j)) as u8, m, "minimum {j} of {bytes:?}");
        }
    }
}

#[test]
fn the_q4_k_lane_order_moves_every_value_once_and_keeps_a_word_in_one_sub_block() {
    let mut seen = [false; QK_K];
    for i in 0..QK_K {
        let src = super::acts::q4k_lane_source(i);
        assert!(!seen[src], "value {src} placed twice");
        seen[src] = true;
        // Word lane `l` of vector `v = 2 r + h`: sub-block `2 (l % 4) + h`.
        let (v, l) = (i / 32, i % 32 / 4);
        assert_eq!(src / 32, 2 * (l % 4) + v % 2, "byte {i}");
    }
    let x = random_acts(QK_K, &mut Rng(5));
    let mut blocks = Vec::new();
    quantize_q8k(&x, &mut blocks);
    for (i, &q) in blocks[0].q_lanes.iter().enumerate() {
        assert_eq!(q, blocks[0].q[super::acts::q4k_lane_source(i)]);
    }
}
