//! Every WGSL kernel of the wgpu backend against a CPU reference, on shapes
//! drawn from seeded generators: sizes that are not multiples of the tiles
//! (and odd, for the packed 2-byte weights), 1 to 9 sequences, contexts that
//! cross block boundaries, shuffled block tables, weights split into chunks.
//! Each kernel has its own normalised-mean-squared-error bound.

mod wgpu_support;

use tokenwire_core::rng::Rng;
use tokenwire_core::SamplingParams;
use tokenwire_kernels::backend::wgpu::lab::{
    AttnKernel, HeadShape, KernelLab, LabProduct, LabSeq, RopeCase,
};
use tokenwire_kernels::backend::wgpu::{SplitPolicy, WeightDtype, WgpuOptions};
use tokenwire_kernels::gguf::{GgmlType, GgufFile};
use tokenwire_kernels::{rope, sample, RopeScaling, WeightMatrix};
use wgpu_support::*;

/// f32 accumulation in a different order than the f64 reference.
const NMSE_LINEAR: f64 = 1e-10;
const NMSE_NORM: f64 = 1e-11;
const NMSE_ROPE: f64 = 1e-12;
const NMSE_ATTN: f64 = 1e-10;
const NMSE_SILU: f64 = 1e-11;
/// The cooperative-matrix product against the product of its f16-rounded
/// inputs: each f16 x f16 product is exact in f32, so only the f32 sums'
/// order differs (about 1e-14 on lavapipe), while the f32 inputs' product
/// is about 3e-8 away.
const NMSE_COOP: f64 = 1e-12;

fn uniform(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
        .collect()
}

fn range(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + rng.below((hi - lo + 1) as u64) as usize
}

fn round(dtype: WeightDtype, v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| match dtype {
            WeightDtype::F32 => x,
            WeightDtype::F16 | WeightDtype::F16Native => half::f16::from_f32(x).to_f32(),
            WeightDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
            q => panic!("{q:?} is not a float type"),
        })
        .collect()
}

fn dtypes(lab: &KernelLab) -> Vec<WeightDtype> {
    let mut v = vec![WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16];
    if lab.f16_native() {
        v.push(WeightDtype::F16Native);
    }
    v
}

fn linear_ref(x: &[f32], cols: usize, w: &[f32], k: usize, b: Option<&[f32]>) -> Vec<f32> {
    let n = w.len() / k;
    let mut y = vec![0.0f32; cols * n];
    for c in 0..cols {
        for o in 0..n {
            let s: f64 = (0..k)
                .map(|i| w[o * k + i] as f64 * x[c * k + i] as f64)
                .sum();
            y[c * n + o] = (s + b.map_or(0.0, |b| b[o] as f64)) as f32;
        }
    }
    y
}

fn check_linear(
    lab: &mut KernelLab,
    rng: &mut Rng,
    kernel: LabProduct,
    max_cols: usize,
    cases: usize,
) {
    for case in 0..cases {
        let dts = dtypes(lab);
        let dtype = dts[case % dts.len()];
        // Half the cases a multiple of 8 (the kernels' 8-wide path).
        let k = if case % 2 == 0 {
            8 * range(rng, 1, 25)
        } else {
            range(rng, 1, 200)
        };
        let n = range(rng, 1, 300);
        let cols = range(rng, 1, max_cols);
        let w = round(dtype, &uniform(rng, n * k, 1.0));
        let x = uniform(rng, cols * k, 1.0);
        let bias = (rng.below(2) == 0).then(|| uniform(rng, n, 1.0));
        let chunk = (rng.below(2) == 0).then(|| range(rng, 1, n));
        let got = lab
            .linear(&x, cols, &w, k, bias.as_deref(), dtype, kernel, chunk)
            .expect("linear");
        let want = linear_ref(&x, cols, &w, k, bias.as_deref());
        let e = nmse(&got, &want);
        assert!(
            e < NMSE_LINEAR,
            "case {case}: {dtype:?} {kernel:?} [{n}x{k}] x {cols} cols, chunk {chunk:?}: nmse {e:e}"
        );
    }
}

/// A lab for each mat-vec variant: rows split over invocations (GPUs),
/// reduced with subgroup shuffles where the adapter has them and through
/// workgroup memory alone, and one invocation per row (CPU adapters),
/// whichever this adapter defaults to; each with its default weight loads
/// in flight and with another. None without an adapter (outside CI).
fn mat_vec_variants() -> Vec<(bool, KernelLab)> {
    let mut labs = Vec::new();
    let variants = [
        (true, true, None),
        (true, false, Some(1)),
        (false, true, None),
        (false, true, Some(4)),
    ];
    for (split_k, subgroups, unroll) in variants {
        let opts = tokenwire_kernels::WgpuOptions {
            split_k: Some(split_k),
            subgroups,
            mat_vec_unroll: unroll,
            ..Default::default()
        };
        match lab_with(&opts) {
            Some(lab) => labs.push((split_k, lab)),
            None => return Vec::new(),
        }
    }
    labs
}

#[test]
fn wgpu_mat_vec_matches_reference() {
    for (split_k, mut lab) in mat_vec_variants() {
        let mut rng = Rng::new(1 + split_k as u64);
        // 1..=140 columns: every column variant (powers of two up to 64
        // split over invocations, up to 8 one invocation per row) and
        // several groups of either.
        check_linear(&mut lab, &mut rng, LabProduct::MatVec, 140, 16);
    }
    // Rows of up to 1,200 values: 32 and 64 invocations per row, so runs of
    // shuffles cover only part of a row wherever a subgroup is narrower.
    for (split_k, mut lab) in mat_vec_variants() {
        let mut rng = Rng::new(30 + split_k as u64);
        for case in 0..4 {
            let dtype = dtypes(&lab)[case % 3];
            let k = 8 * range(&mut rng, 33, 150);
            let n = range(&mut rng, 1, 40);
            let cols = range(&mut rng, 1, 70);
            let w = round(dtype, &uniform(&mut rng, n * k, 1.0));
            let x = uniform(&mut rng, cols * k, 1.0);
            let got = lab
                .linear(&x, cols, &w, k, None, dtype, LabProduct::MatVec, None)
                .expect("linear");
            let e = nmse(&got, &linear_ref(&x, cols, &w, k, None));
            assert!(
                e < NMSE_LINEAR,
                "{dtype:?} [{n}x{k}] x {cols} cols: nmse {e:e}"
            );
        }
    }
}

#[test]
fn wgpu_mat_vec_unroll_keeps_the_bits() {
    // However many weight loads an invocation issues together, its sums run
    // in the same order: the same bits, row split or not, SwiGLU or not, for
    // rows with a partial last round of loads (k / 8 not a multiple of 4).
    let mut rng = Rng::new(77);
    let (n, k, cols) = (37, 8 * 45, 3);
    let w = round(WeightDtype::Bf16, &uniform(&mut rng, 2 * n * k, 1.0));
    let x = uniform(&mut rng, cols * k, 1.0);
    for split_k in [true, false] {
        let mut outs = Vec::new();
        for unroll in [1, 2, 4] {
            let opts = tokenwire_kernels::WgpuOptions {
                split_k: Some(split_k),
                mat_vec_unroll: Some(unroll),
                ..Default::default()
            };
            let Some(mut lab) = lab_with(&opts) else {
                return;
            };
            let y = lab
                .linear(
                    &x,
                    cols,
                    &w,
                    k,
                    None,
                    WeightDtype::Bf16,
                    LabProduct::MatVec,
                    None,
                )
                .expect("linear");
            let a = lab.glu(&x, cols, &w, k, WeightDtype::Bf16).expect("glu");
            outs.push((unroll, y, a));
        }
        for (unroll, y, a) in &outs[1..] {
            assert_eq!(y, &outs[0].1, "split_k={split_k}, unroll {unroll}");
            assert_eq!(a, &outs[0].2, "split_k={split_k}, unroll {unroll} (SwiGLU)");
        }
    }
}

/// silu(gate) * up for each column of `gu` (`[cols, 2 inter]`, gate then up).
fn swiglu_ref(gu: &[f32], cols: usize, inter: usize) -> Vec<f32> {
    (0..cols * inter)
        .map(|e| {
            let (c, i) = (e / inter, e % inter);
            let g = gu[c * 2 * inter + i] as f64;
            let u = gu[c * 2 * inter + inter + i] as f64;
            (g / (1.0 + (-g).exp()) * u) as f32
        })
        .collect()
}

#[test]
fn wgpu_fused_swiglu_matches_reference() {
    for (split_k, mut lab) in mat_vec_variants() {
        let mut rng = Rng::new(40 + split_k as u64);
        for case in 0..12 {
            let dts = dtypes(&lab);
            let dtype = dts[case % dts.len()];
            let k = if case % 2 == 0 {
                8 * range(&mut rng, 1, 25)
            } else {
                range(&mut rng, 1, 200)
            };
            let inter = range(&mut rng, 1, 300);
            // Up to 80 columns: every variant (to 32 split over invocations,
            // 8 one invocation per row) and several groups.
            let cols = range(&mut rng, 1, 80);
            let w = round(dtype, &uniform(&mut rng, 2 * inter * k, 1.0));
            let x = uniform(&mut rng, cols * k, 1.0);
            let got = lab.glu(&x, cols, &w, k, dtype).expect("glu");
            let want = swiglu_ref(&linear_ref(&x, cols, &w, k, None), cols, inter);
            let e = nmse(&got, &want);
            assert!(
                e < NMSE_LINEAR,
                "case {case}: {dtype:?} split_k={split_k} [2x{inter}x{k}] x {cols} cols: nmse {e:e}"
            );
        }
        // Every block type, unpacked for the gate and the up rows.
        for (case, t) in QUANT_TYPES.into_iter().enumerate() {
            let per = t.block_len();
            let k = per * range(&mut rng, 1, if per == 256 { 3 } else { 9 });
            let inter = range(&mut rng, 1, 100);
            let cols = range(&mut rng, 1, 40);
            let raw = random_blocks(&mut rng, t, 2 * inter * k, 1.0);
            let m = WeightMatrix::from_bytes(t, 2 * inter, k, raw).expect("whole blocks");
            let mut w = Vec::new();
            m.dequantize_rows(0, 2 * inter, &mut w);
            let x = uniform(&mut rng, cols * k, 1.0);
            let got = lab.glu_matrix(&x, cols, &m).expect("glu");
            let want = swiglu_ref(&linear_ref(&x, cols, &w, k, None), cols, inter);
            let e = nmse(&got, &want);
            assert!(
                e < NMSE_LINEAR,
                "case {case}: {t} split_k={split_k} [2x{inter}x{k}] x {cols} cols: nmse {e:e}"
            );
        }
    }
}

#[test]
fn wgpu_tiled_matmul_matches_reference() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(2);
    check_linear(&mut lab, &mut rng, LabProduct::Tiled, 70, 10);
}

/// Values rounded to f16, as the cooperative-matrix product stores its
/// weight and x tiles.
fn f16_rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// The cooperative-matrix product of `x` (`cols` columns) through `w` (`k`
/// wide) against the reference on f16-rounded inputs, and two planted
/// errors the bound must catch: the product of the unrounded inputs (what
/// the f32 kernels compute: so this case did run on f16 tiles), and the
/// rounded product without the last k value (a slab or run left out).
fn check_coop(
    got: &[f32],
    x: &[f32],
    cols: usize,
    w: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    what: &str,
) {
    let (xr, wr) = (f16_rounded(x), f16_rounded(w));
    let e = nmse(got, &linear_ref(&xr, cols, &wr, k, bias));
    assert!(e < NMSE_COOP, "{what}: nmse {e:e}");
    let exact = nmse(got, &linear_ref(x, cols, w, k, bias));
    assert!(
        exact > 100.0 * NMSE_COOP,
        "{what}: as close to the f32 product ({exact:e}) as to the f16 one ({e:e})"
    );
    let mut short = wr.clone();
    for row in short.chunks_exact_mut(k) {
        row[k - 1] = 0.0;
    }
    let planted = nmse(got, &linear_ref(&xr, cols, &short, k, bias));
    eprintln!("{what}: nmse {e:e}, against f32 inputs {exact:e}, last k left out {planted:e}");
    assert!(
        planted > 100.0 * NMSE_COOP,
        "{what}: the last k value left out passes ({planted:e})"
    );
}

#[test]
fn wgpu_coop_matmul_matches_reference() {
    // f16 tiles, f32 sums: against the product of the f16-rounded inputs,
    // on every float weight type (bf16 and f32 rounded to f16 on the way
    // into workgroup memory), k a multiple of 8 and not, across several
    // k slabs, tokens and rows over several tiles, chunked weights and
    // biases; with the largest k slab the adapter allows, and with 32;
    // then with k split over workgroups wherever it has 8 slabs or more
    // (partial sums added by split_sum.wgsl).
    // The split products' splits summed by split_sum.wgsl's dispatch, and
    // by the split that finishes last (the same shapes: the seed leaves the
    // fold out), its counters checked back at zero by the lab.
    // Then on the wide tile (eight subgroups) for every pass, unsplit and
    // split; then on the tall tile (rows by two sides of tokens) for
    // passes that fit it, unsplit and split; the others on the default
    // tile only.
    let (square, wide) = (usize::MAX, 1);
    let split_everything = Some(1 << 20);
    for (slab, split, wide_rows, tall, fold) in [
        (None, None, square, false, true),
        (Some(32), None, square, false, true),
        (Some(32), split_everything, square, false, false),
        (Some(32), split_everything, square, false, true),
        (None, None, wide, false, true),
        (Some(32), split_everything, wide, false, true),
        (None, None, square, true, true),
        (Some(32), split_everything, square, true, true),
    ] {
        let opts = tokenwire_kernels::WgpuOptions {
            coop_k_slab: slab,
            coop_split_workgroups: split,
            coop_wide_rows: wide_rows,
            coop_tall: tall,
            coop_fold_splits: fold,
            ..Default::default()
        };
        let Some(mut lab) = coop_lab(&opts) else {
            return;
        };
        // Every Vulkan adapter has the coherent storage folding needs:
        // without it a folded run would quietly take split_sum's dispatch.
        let folds = lab.coop().is_some_and(|c| c.fold);
        assert_eq!(folds, fold, "{}: the split sum folded", lab.adapter());
        // The tall tile's passes: up to its tokens (16 at side 8, 32 at 16).
        let max_cols = match lab.coop_tall() {
            Some(t) if tall => t.tile_tokens() as usize,
            None if tall => panic!("no tall coop tile on an adapter with coop"),
            _ => 140,
        };
        let seed = 50
            + slab.unwrap_or(0) as u64
            + u64::from(split.is_some())
            + 2 * u64::from(wide_rows == wide)
            + 4 * u64::from(tall);
        check_coop_shapes(&mut lab, seed, max_cols);
    }
}

/// [`check_coop`] on drawn shapes of up to `max_cols` tokens: every float
/// type, then every block type.
fn check_coop_shapes(lab: &mut KernelLab, seed: u64, max_cols: usize) {
    let mut rng = Rng::new(seed);
    for case in 0..14 {
        let dts = dtypes(lab);
        let dtype = dts[case % dts.len()];
        let k = if case % 2 == 0 {
            8 * range(&mut rng, 1, 40)
        } else {
            range(&mut rng, 1, 200)
        };
        let n = range(&mut rng, 1, 300);
        let cols = range(&mut rng, 1, max_cols);
        let w = round(dtype, &uniform(&mut rng, n * k, 1.0));
        let x = uniform(&mut rng, cols * k, 1.0);
        let bias = (rng.below(2) == 0).then(|| uniform(&mut rng, n, 1.0));
        let chunk = (rng.below(2) == 0).then(|| range(&mut rng, 1, n));
        let got = lab
            .linear(
                &x,
                cols,
                &w,
                k,
                bias.as_deref(),
                dtype,
                LabProduct::Coop,
                chunk,
            )
            .expect("linear");
        let what = format!("case {case}: {dtype:?} [{n}x{k}] x {cols} cols, chunk {chunk:?}");
        check_coop(&got, &x, cols, &w, k, bias.as_deref(), &what);
    }
    // Every GGUF block type, unpacked into the f16 weight tile.
    for (case, t) in QUANT_TYPES.into_iter().enumerate() {
        let per = t.block_len();
        let k = per * range(&mut rng, 1, if per == 256 { 3 } else { 9 });
        let n = range(&mut rng, 1, 150);
        let cols = range(&mut rng, 1, max_cols.min(80));
        let raw = random_blocks(&mut rng, t, n * k, 1.0);
        let m = WeightMatrix::from_bytes(t, n, k, raw).expect("whole blocks");
        let mut w = Vec::new();
        m.dequantize_rows(0, n, &mut w);
        let x = uniform(&mut rng, cols * k, 1.0);
        let chunk = (rng.below(2) == 0).then(|| range(&mut rng, 1, n));
        let got = lab
            .linear_matrix(&x, cols, &m, None, LabProduct::Coop, chunk)
            .expect("linear");
        let what = format!("case {case}: {t} [{n}x{k}] x {cols} cols, chunk {chunk:?}");
        check_coop(&got, &x, cols, &w, k, None, &what);
    }
}

#[test]
fn wgpu_embedding_gather_is_exact() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(3);
    for case in 0..10 {
        let dts = dtypes(&lab);
        let dtype = dts[case % dts.len()];
        let vocab = range(&mut rng, 1, 300);
        let h = range(&mut rng, 1, 100);
        let table = round(dtype, &uniform(&mut rng, vocab * h, 2.0));
        let tokens: Vec<u32> = (0..range(&mut rng, 1, 9))
            .map(|_| rng.below(vocab as u64) as u32)
            .collect();
        let chunk = (rng.below(2) == 0).then(|| range(&mut rng, 1, vocab));
        let got = lab.embed(&table, h, dtype, &tokens, chunk).expect("embed");
        let want: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| table[t as usize * h..(t as usize + 1) * h].iter().copied())
            .collect();
        assert_eq!(
            got, want,
            "case {case}: {dtype:?} vocab {vocab} h {h} chunk {chunk:?}"
        );
    }
}

#[test]
fn wgpu_rms_norm_matches_reference() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(4);
    for case in 0..12 {
        let h = range(&mut rng, 1, 600);
        let rows = range(&mut rng, 1, 9);
        let x = uniform(&mut rng, rows * h, 3.0);
        let w = uniform(&mut rng, h, 1.5);
        let select: Option<Vec<u32>> = (case % 2 == 1).then(|| {
            (0..range(&mut rng, 1, rows))
                .map(|_| rng.below(rows as u64) as u32)
                .collect()
        });
        let eps = 1e-5;
        let y = lab
            .rms_norm(&x, &w, eps, select.as_deref())
            .expect("rms_norm");
        let src: Vec<usize> = match &select {
            Some(s) => s.iter().map(|&r| r as usize).collect(),
            None => (0..rows).collect(),
        };
        let mut want = Vec::new();
        for r in src {
            let row = &x[r * h..(r + 1) * h];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            want.extend(
                row.iter()
                    .zip(&w)
                    .map(|(&v, &g)| (g as f64 * v as f64 * inv) as f32),
            );
        }
        let e = nmse(&y, &want);
        assert!(e < NMSE_NORM, "case {case}: h {h} rows {rows}: nmse {e:e}");
    }
}

#[test]
fn wgpu_silu_mul_matches_reference() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(5);
    for _ in 0..6 {
        let inter = range(&mut rng, 1, 700);
        let rows = range(&mut rng, 1, 9);
        let gu = uniform(&mut rng, rows * 2 * inter, 6.0);
        let got = lab.silu_mul(&gu, inter).expect("silu_mul");
        let mut want = Vec::new();
        for r in 0..rows {
            for i in 0..inter {
                let g = gu[r * 2 * inter + i] as f64;
                let u = gu[r * 2 * inter + inter + i] as f64;
                want.push((g / (1.0 + (-g).exp()) * u) as f32);
            }
        }
        let e = nmse(&got, &want);
        assert!(e < NMSE_SILU, "inter {inter} rows {rows}: nmse {e:e}");
    }
}

#[test]
fn wgpu_argmax_follows_the_samplers_rule() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(6);
    for case in 0..8 {
        let vocab = range(&mut rng, 1, 3000);
        let rows = range(&mut rng, 1, 9);
        let mut logits = uniform(&mut rng, rows * vocab, 10.0);
        // Ties (to the lowest id), -inf rows and NaN.
        for r in 0..rows {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            match (case + r) % 4 {
                0 => {
                    let m = row.iter().copied().fold(f32::MIN, f32::max);
                    let a = rng.below(vocab as u64) as usize;
                    let b = rng.below(vocab as u64) as usize;
                    row[a] = m + 1.0;
                    row[b] = m + 1.0;
                }
                1 => row.fill(f32::NEG_INFINITY),
                2 => row[rng.below(vocab as u64) as usize] = f32::NAN,
                _ => {}
            }
        }
        let got = lab.argmax(&logits, vocab).expect("argmax");
        let want: Vec<u32> = logits
            .chunks(vocab)
            .map(|row| sample(row, &SamplingParams::greedy(), 0, &[], None).0)
            .collect();
        assert_eq!(got, want, "case {case}: vocab {vocab}");
    }
}

/// Random sequences over a shuffled pool of blocks.
fn random_seqs(
    rng: &mut Rng,
    shape: &HeadShape,
    n: usize,
    max_ctx: usize,
    max_rows: usize,
) -> (Vec<LabSeq>, usize) {
    let bs = shape.block_size;
    let mut seqs = Vec::new();
    let mut need = 0;
    for _ in 0..n {
        let rows = range(rng, 1, max_rows);
        let start = range(rng, 0, max_ctx - rows);
        let blocks = (start + rows).div_ceil(bs);
        seqs.push((start, rows, blocks));
        need += blocks;
    }
    let pool_blocks = need + range(rng, 0, 4);
    let mut ids: Vec<u32> = (0..pool_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut it = ids.into_iter();
    let seqs = seqs
        .into_iter()
        .map(|(start, rows, blocks)| LabSeq {
            start_pos: start as u32,
            rows,
            block_table: it.by_ref().take(blocks).collect(),
        })
        .collect();
    (seqs, pool_blocks)
}

fn pool_index(shape: &HeadShape, table: &[u32], pos: usize, g: usize) -> usize {
    let bs = shape.block_size;
    let block = table[pos / bs] as usize;
    ((block * shape.kv_heads + g) * bs + pos % bs) * shape.head_dim
}

fn attention_ref(
    qkv: &[f32],
    shape: &HeadShape,
    seqs: &[LabSeq],
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    attention_ref_without(qkv, shape, seqs, k, v, None)
}

/// The reference attention, leaving out of row `skip.0`'s softmax the
/// positions `skip.1` (what a merge that dropped a split would compute).
fn attention_ref_without(
    qkv: &[f32],
    shape: &HeadShape,
    seqs: &[LabSeq],
    k: &[f32],
    v: &[f32],
    skip: Option<(usize, std::ops::Range<usize>)>,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.q_heads / shape.kv_heads;
    let stride = shape.qkv_width();
    let mut out = Vec::new();
    let mut r = 0;
    for s in seqs {
        for i in 0..s.rows {
            let pos = s.start_pos as usize + i;
            let seen: Vec<usize> = (0..=pos)
                .filter(|j| !matches!(&skip, Some((row, gone)) if *row == r && gone.contains(j)))
                .collect();
            for h in 0..shape.q_heads {
                let g = h / group;
                let q = &qkv[r * stride + h * hd..r * stride + (h + 1) * hd];
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let kb = pool_index(shape, &s.block_table, j, g);
                        q.iter()
                            .zip(&k[kb..kb + hd])
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let acc: f64 = seen
                        .iter()
                        .zip(&e)
                        .map(|(&j, &ej)| {
                            ej / z * v[pool_index(shape, &s.block_table, j, g) + d] as f64
                        })
                        .sum();
                    out.push(acc as f32);
                }
            }
            r += 1;
        }
    }
    out
}

const SHAPES: &[(usize, usize, usize, usize)] = &[
    // (q_heads, kv_heads, head_dim, block_size)
    (8, 4, 8, 16),   // stories260K
    (4, 4, 16, 3),   // MHA, tiny blocks
    (6, 2, 64, 5),   // group of 3
    (4, 1, 128, 16), // MQA, widest heads
    (2, 2, 6, 1),    // head_dim not a multiple of 4, one slot per block
    (3, 1, 10, 7),   // head_dim 10 (read in pairs), group of 3
    (16, 2, 64, 16), // TinyLlama's group of 8 and head width
];

/// The [`HeadShape`] of one of [`SHAPES`]' tuples.
fn head_shape(q_heads: usize, kv_heads: usize, head_dim: usize, block_size: usize) -> HeadShape {
    HeadShape {
        q_heads,
        kv_heads,
        head_dim,
        block_size,
    }
}

/// A random attention case on `shape`: sequences of up to `max_rows` rows
/// within `max_ctx` positions, the pools, and the q|k|v rows.
struct AttnCase {
    shape: HeadShape,
    seqs: Vec<LabSeq>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
}

fn attn_case(
    rng: &mut Rng,
    shape: (usize, usize, usize, usize),
    n: usize,
    max_ctx: usize,
    max_rows: usize,
) -> AttnCase {
    let (q_heads, kv_heads, head_dim, block_size) = shape;
    let shape = head_shape(q_heads, kv_heads, head_dim, block_size);
    let (seqs, pool_blocks) = random_seqs(rng, &shape, n, max_ctx, max_rows);
    let rows: usize = seqs.iter().map(|s| s.rows).sum();
    let pool = pool_blocks * kv_heads * block_size * head_dim;
    AttnCase {
        shape,
        k: uniform(rng, pool, 1.0),
        v: uniform(rng, pool, 1.0),
        qkv: uniform(rng, rows * shape.qkv_width(), 2.0),
        seqs,
    }
}

fn check_attention(
    opts: &WgpuOptions,
    kernel_of: impl Fn(&mut Rng) -> AttnKernel,
    seed: u64,
    max_rows: usize,
) {
    let Some(mut lab) = lab_with(opts) else {
        return;
    };
    let mut rng = Rng::new(seed);
    for (case, &shape) in SHAPES.iter().enumerate() {
        let n = range(&mut rng, 1, 9);
        let max_ctx = if shape.2 >= 64 { 90 } else { 150 };
        let c = attn_case(&mut rng, shape, n, max_ctx, max_rows);
        let kernel = kernel_of(&mut rng);
        let got = lab
            .attention(&c.qkv, &c.shape, &c.seqs, &c.k, &c.v, kernel)
            .expect("attention");
        let want = attention_ref(&c.qkv, &c.shape, &c.seqs, &c.k, &c.v);
        let e = nmse(&got, &want);
        assert!(
            e < NMSE_ATTN,
            "case {case}: {:?} {kernel:?}, {n} seqs: nmse {e:e}",
            c.shape
        );
    }
}

/// Split policies from one split per row to one position per split.
fn split_policy(rng: &mut Rng) -> SplitPolicy {
    let (workgroups, min_len) = [
        (1, 32),
        (16, 32),
        (512, 32),
        (u32::MAX, 7),
        (u32::MAX, 3),
        (u32::MAX, 1),
    ][rng.below(6) as usize];
    SplitPolicy {
        workgroups,
        min_len,
        fold: rng.below(2) == 0,
    }
}

#[test]
fn wgpu_decode_attention_matches_reference() {
    // K rows loaded a vector at a time (CPU adapters' default), 16 at a
    // time (GPUs'), and 5, which divides no row here (heads of 8 to 128
    // values: 2 to 32 vectors).
    for k_chunk in [1, 16, 5] {
        let opts = WgpuOptions {
            decode_k_chunk: Some(k_chunk),
            ..WgpuOptions::default()
        };
        eprintln!("K rows in chunks of {k_chunk} vectors");
        check_attention(&opts, |rng| AttnKernel::Decode(split_policy(rng)), 7, 3);
    }
}

#[test]
fn wgpu_decode_attention_splits_long_contexts() {
    // Up to 2,100 positions, past the longest split (1,024), in as many
    // splits as each policy gives, with odd lengths; and each case's
    // tolerance shown to catch a merge that dropped one split: the
    // reference without one split of the longest row must fail it.
    let Some(mut lab) = lab() else { return };
    // Every test adapter is Vulkan, which has `@coherent` storage: without
    // it the folded cases below would quietly take the merge dispatch.
    assert!(lab.folds_splits(), "{}: no folded merge", lab.adapter());
    let mut rng = Rng::new(21);
    let shapes = [
        (32, 4, 64, 16),
        (6, 2, 64, 5),
        (2, 2, 6, 1),
        (4, 1, 128, 16),
    ];
    for (case, &shape) in shapes.iter().enumerate() {
        for _ in 0..2 {
            let n = range(&mut rng, 1, 3);
            let c = attn_case(&mut rng, shape, n, 2100, 1);
            let policy = split_policy(&mut rng);
            let want = attention_ref(&c.qkv, &c.shape, &c.seqs, &c.k, &c.v);
            let (n_splits, split_len) = lab
                .decode_splits(&c.shape, &c.seqs, policy)
                .expect("splits");
            let what = format!(
                "case {case}: {:?}, contexts {:?}, about {} workgroups, splits of at least {}: \
                 {n_splits} splits of {split_len}",
                c.shape,
                c.seqs.iter().map(|s| s.start_pos + 1).collect::<Vec<_>>(),
                policy.workgroups,
                policy.min_len,
            );
            // The splits merged by a dispatch of their own, and by the
            // workgroup that finishes last.
            for fold in [false, true] {
                let policy = SplitPolicy { fold, ..policy };
                let got = lab
                    .attention(
                        &c.qkv,
                        &c.shape,
                        &c.seqs,
                        &c.k,
                        &c.v,
                        AttnKernel::Decode(policy),
                    )
                    .expect("attention");
                let e = nmse(&got, &want);
                eprintln!("{what}, fold {fold}: nmse {e:e}");
                assert!(e < NMSE_ATTN, "{what}, fold {fold}: nmse {e:e}");
            }
            if n_splits > 1 {
                let (row, s) = c
                    .seqs
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, s)| s.start_pos)
                    .expect("a sequence");
                let ctx = s.start_pos as usize + 1;
                let len = split_len as usize;
                let drop = range(&mut rng, 0, (ctx - 1) / len) * len;
                let skip = Some((row, drop..(drop + len).min(ctx)));
                let dropped = attention_ref_without(&c.qkv, &c.shape, &c.seqs, &c.k, &c.v, skip);
                let e = nmse(&dropped, &want);
                assert!(
                    e > 1e3 * NMSE_ATTN,
                    "{what}: a dropped split gives nmse {e:e}"
                );
            }
        }
    }
}

#[test]
fn wgpu_prefill_attention_matches_reference() {
    check_attention(&WgpuOptions::default(), |_| AttnKernel::Prefill, 8, 70);
}

#[test]
fn wgpu_rope_matches_cpu_rotation() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(9);
    let scalings = [
        RopeScaling::None,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 1024.0,
        },
        RopeScaling::Linear { factor: 4.0 },
    ];
    for (case, &(q_heads, kv_heads, head_dim, block_size)) in SHAPES.iter().enumerate() {
        let shape = head_shape(q_heads, kv_heads, head_dim, block_size);
        let theta = [10000.0, 500000.0, 1e6][case % 3];
        let inv = rope::inv_freq(head_dim, theta, &scalings[case % 3]);
        let n = range(&mut rng, 1, 9);
        let (seqs, pool_blocks) = random_seqs(&mut rng, &shape, n, 5000, 9);
        let rows: usize = seqs.iter().map(|s| s.rows).sum();
        let qkv = uniform(&mut rng, rows * shape.qkv_width(), 2.0);
        let pool = vec![0.0; pool_blocks * kv_heads * block_size * head_dim];
        let got = lab
            .rope_kv(
                &qkv,
                &RopeCase {
                    shape: &shape,
                    seqs: &seqs,
                    inv_freq: &inv,
                    k_pool: &pool,
                    v_pool: &pool,
                },
            )
            .expect("rope_kv")
            .qkv;
        let mut want = qkv.clone();
        let half = head_dim / 2;
        let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
        let mut r = 0;
        for sq in &seqs {
            for i in 0..sq.rows {
                rope::angles(&inv, 1.0, sq.start_pos + i as u32, &mut c, &mut s);
                let row = &mut want[r * shape.qkv_width()..(r + 1) * shape.qkv_width()];
                for head in row[..(q_heads + kv_heads) * head_dim].chunks_exact_mut(head_dim) {
                    rope::rotate(head, &c, &s);
                }
                r += 1;
            }
        }
        let e = nmse(&got, &want);
        assert!(e < NMSE_ROPE, "case {case}: {shape:?}: nmse {e:e}");
    }
}

#[test]
fn wgpu_rope_kv_writes_the_cache_through_the_slot_mapping() {
    // The same dispatch that rotates the heads writes each row's rotated K
    // (the values it leaves in q|k|v, which the test above checks against
    // the CPU's rotation) and its V into the pools at the row's slot; every
    // other slot keeps its value.
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(10);
    for &(q_heads, kv_heads, head_dim, block_size) in SHAPES {
        let shape = head_shape(q_heads, kv_heads, head_dim, block_size);
        let inv = rope::inv_freq(head_dim, 10000.0, &RopeScaling::None);
        let n = range(&mut rng, 1, 9);
        let (seqs, pool_blocks) = random_seqs(&mut rng, &shape, n, 100, 20);
        let rows: usize = seqs.iter().map(|s| s.rows).sum();
        let pool = pool_blocks * kv_heads * block_size * head_dim;
        let k0 = uniform(&mut rng, pool, 1.0);
        let v0 = uniform(&mut rng, pool, 1.0);
        let qkv = uniform(&mut rng, rows * shape.qkv_width(), 2.0);
        let out = lab
            .rope_kv(
                &qkv,
                &RopeCase {
                    shape: &shape,
                    seqs: &seqs,
                    inv_freq: &inv,
                    k_pool: &k0,
                    v_pool: &v0,
                },
            )
            .expect("rope_kv");
        let rotated = &out.qkv;
        let (mut wk, mut wv) = (k0.clone(), v0.clone());
        let kw = kv_heads * head_dim;
        let mut r = 0;
        for s in &seqs {
            for i in 0..s.rows {
                let pos = s.start_pos as usize + i;
                let base = r * shape.qkv_width() + q_heads * head_dim;
                for g in 0..kv_heads {
                    let dst = pool_index(&shape, &s.block_table, pos, g);
                    let src = base + g * head_dim;
                    wk[dst..dst + head_dim].copy_from_slice(&rotated[src..src + head_dim]);
                    wv[dst..dst + head_dim].copy_from_slice(&qkv[src + kw..src + kw + head_dim]);
                }
                r += 1;
            }
        }
        assert_eq!(out.k, wk, "{shape:?}");
        assert_eq!(out.v, wv, "{shape:?}");
        // The V heads stay as they were in q|k|v.
        for r in 0..rows {
            let vs = r * shape.qkv_width() + (q_heads + kv_heads) * head_dim;
            assert_eq!(rotated[vs..vs + kw], qkv[vs..vs + kw], "{shape:?} row {r}");
        }
    }
}

/// Rotates the query and key heads of q|k|v rows `[rows, width]` on the
/// host, each row at its sequence's position (the CPU backend's RoPE).
fn rope_ref(qkv: &mut [f32], shape: &HeadShape, seqs: &[LabSeq], inv: &[f64]) {
    let half = shape.head_dim / 2;
    let rotated = (shape.q_heads + shape.kv_heads) * shape.head_dim;
    let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
    let mut rows = qkv.chunks_exact_mut(shape.qkv_width());
    for sq in seqs {
        for i in 0..sq.rows {
            rope::angles(inv, 1.0, sq.start_pos + i as u32, &mut c, &mut s);
            let row = rows.next().expect("a row per position");
            for head in row[..rotated].chunks_exact_mut(shape.head_dim) {
                rope::rotate(head, &c, &s);
            }
        }
    }
}

#[test]
fn wgpu_fused_qkv_rope_matches_product_then_rope_kv() {
    // The q|k|v mat-vec with RoPE and the K/V write fused in leaves q|k|v
    // and both pools as the product followed by rope_kv.wgsl does, on
    // every mat-vec variant: steps of up to ~100 rows (several column
    // groups, so each group must find its rows' angles and slots), every
    // float type, k on and off the 8-wide path, with and without bias.
    let labs = mat_vec_variants();
    let mut rng = Rng::new(12);
    for (v, (split_k, mut lab)) in labs.into_iter().enumerate() {
        let dts = dtypes(&lab);
        for (case, &(q_heads, kv_heads, head_dim, block_size)) in SHAPES.iter().enumerate() {
            let shape = head_shape(q_heads, kv_heads, head_dim, block_size);
            let dtype = dts[(case + v) % dts.len()];
            let k = if case % 2 == 0 {
                8 * range(&mut rng, 1, 16)
            } else {
                range(&mut rng, 1, 90)
            };
            let inv = rope::inv_freq(head_dim, 10000.0, &RopeScaling::None);
            let n = range(&mut rng, 1, 9);
            let (seqs, pool_blocks) = random_seqs(&mut rng, &shape, n, 300, 12);
            let rows: usize = seqs.iter().map(|s| s.rows).sum();
            let width = shape.qkv_width();
            let w = round(dtype, &uniform(&mut rng, width * k, 1.0));
            let x = uniform(&mut rng, rows * k, 1.0);
            let bias = (rng.below(2) == 0).then(|| uniform(&mut rng, width, 1.0));
            let pool = pool_blocks * kv_heads * block_size * head_dim;
            let k0 = uniform(&mut rng, pool, 1.0);
            let v0 = uniform(&mut rng, pool, 1.0);
            let what = format!(
                "split_k {split_k}, {shape:?}, {dtype:?}, k {k}, {rows} rows, bias {}",
                bias.is_some()
            );
            let case = RopeCase {
                shape: &shape,
                seqs: &seqs,
                inv_freq: &inv,
                k_pool: &k0,
                v_pool: &v0,
            };
            let fused = lab
                .qkv_rope(&x, &w, k, bias.as_deref(), dtype, &case)
                .expect("qkv_rope");
            let y = lab
                .linear(
                    &x,
                    rows,
                    &w,
                    k,
                    bias.as_deref(),
                    dtype,
                    LabProduct::MatVec,
                    None,
                )
                .expect("linear");
            let apart = lab.rope_kv(&y, &case).expect("rope_kv");
            for (name, got, want) in [
                ("q|k|v", &fused.qkv, &apart.qkv),
                ("K pool", &fused.k, &apart.k),
                ("V pool", &fused.v, &apart.v),
            ] {
                let e = nmse(got, want);
                assert!(
                    e < NMSE_ROPE,
                    "{what}: {name}: nmse {e:e} against two kernels"
                );
            }
            // And against the host: the product in f64, then the CPU's RoPE.
            let mut want = linear_ref(&x, rows, &w, k, bias.as_deref());
            rope_ref(&mut want, &shape, &seqs, &inv);
            let e = nmse(&fused.qkv, &want);
            assert!(e < NMSE_LINEAR, "{what}: nmse {e:e} against the host");
            // A planted error: rows rotated one position on fail that bound.
            let shifted: Vec<LabSeq> = seqs
                .iter()
                .map(|s| LabSeq {
                    start_pos: s.start_pos + 1,
                    ..s.clone()
                })
                .collect();
            let mut off = linear_ref(&x, rows, &w, k, bias.as_deref());
            rope_ref(&mut off, &shape, &shifted, &inv);
            let e = nmse(&fused.qkv, &off);
            assert!(
                e > 1e3 * NMSE_LINEAR,
                "{what}: one position off gives nmse {e:e}"
            );
        }
    }
}

#[test]
fn wgpu_tiny_binding_limit_splits_weights() {
    // A 4 KiB binding: a 300 x 50 f32 matrix (60 KB) needs 15+ chunks.
    let opts = tokenwire_kernels::WgpuOptions {
        max_binding: Some(4096),
        ..Default::default()
    };
    let Some(mut lab) = lab_with(&opts) else {
        return;
    };
    let mut rng = Rng::new(11);
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let (n, k) = (300, 51);
        let w = round(dtype, &uniform(&mut rng, n * k, 1.0));
        for (cols, kernel) in [(3, LabProduct::MatVec), (20, LabProduct::Tiled)] {
            let x = uniform(&mut rng, cols * k, 1.0);
            let got = lab
                .linear(&x, cols, &w, k, None, dtype, kernel, None)
                .expect("linear");
            let e = nmse(&got, &linear_ref(&x, cols, &w, k, None));
            assert!(e < NMSE_LINEAR, "{dtype:?} {cols} cols: nmse {e:e}");
        }
        let got = lab
            .embed(&w, k, dtype, &[0, 299, 150, 77], None)
            .expect("embed");
        let want: Vec<f32> = [0usize, 299, 150, 77]
            .iter()
            .flat_map(|&t| w[t * k..(t + 1) * k].iter().copied())
            .collect();
        assert_eq!(got, want);
    }
}

/// The block bytes and llama.cpp's dequantized values of the fixture's
/// tensor of type `t` (written by `scripts/make-quant-fixture.py` with the
/// `gguf` package's quantizer), as a `[rows, row values]` matrix.
fn fixture_matrix(t: GgmlType) -> (WeightMatrix, Vec<f32>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/quant_blocks.gguf"
    );
    let bytes = std::fs::read(path).expect("fixture");
    let file = GgufFile::parse(&bytes).expect("fixture parses");
    let q = file.tensor(&format!("q.{t}")).expect("quantized tensor");
    let f = file.tensor(&format!("f.{t}")).expect("reference tensor");
    let cols = q.dims[0] as usize;
    let rows = q.elements() as usize / cols;
    let raw = bytes[q.offset as usize..(q.offset + q.len) as usize].to_vec();
    let vals = bytes[f.offset as usize..(f.offset + f.len) as usize]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let m = WeightMatrix::from_bytes(t, rows, cols, raw).expect("whole blocks");
    (m, vals)
}

#[test]
fn wgpu_quantized_products_match_llama_cpps_values() {
    // Blocks from llama.cpp's own quantizer, every block type, through
    // mat-vec (both variants) and the tiled matmul, against the product
    // with llama.cpp's dequantized values.
    for (split_k, mut lab) in mat_vec_variants() {
        let mut rng = Rng::new(20 + split_k as u64);
        for t in QUANT_TYPES {
            let (m, vals) = fixture_matrix(t);
            let k = m.cols();
            for (cols, kernel) in [
                (1, LabProduct::MatVec),
                (5, LabProduct::MatVec),
                (11, LabProduct::MatVec),
                (13, LabProduct::Tiled),
            ] {
                let x = uniform(&mut rng, cols * k, 1.0);
                let got = lab
                    .linear_matrix(&x, cols, &m, None, kernel, None)
                    .expect("linear");
                let e = nmse(&got, &linear_ref(&x, cols, &vals, k, None));
                assert!(
                    e < NMSE_LINEAR,
                    "{t} [{}x{k}] x {cols} cols, {kernel:?}, split_k={split_k}: nmse {e:e}",
                    m.rows()
                );
            }
            let tokens: Vec<u32> = (0..m.rows() as u32).rev().collect();
            let got = lab.embed_matrix(&m, &tokens, Some(1)).expect("embed");
            let want: Vec<f32> = tokens
                .iter()
                .flat_map(|&r| vals[r as usize * k..(r as usize + 1) * k].iter().copied())
                .collect();
            let e = nmse(&got, &want);
            assert!(e < 1e-13, "{t} embed: nmse {e:e}");
        }
    }
}

#[test]
fn wgpu_quantized_products_on_random_shapes() {
    // Random blocks (any bytes are valid blocks; scales kept finite) on
    // drawn shapes and chunkings, against the CPU engine's dequantization.
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(21);
    for case in 0..15 {
        let t = QUANT_TYPES[case % QUANT_TYPES.len()];
        let per = t.block_len();
        let k = per * range(&mut rng, 1, if per == 256 { 3 } else { 9 });
        let n = range(&mut rng, 1, 150);
        let cols = range(&mut rng, 1, 20);
        let kernel = if rng.below(3) == 0 {
            LabProduct::Tiled
        } else {
            LabProduct::MatVec
        };
        let raw = random_blocks(&mut rng, t, n * k, 1.0);
        let m = WeightMatrix::from_bytes(t, n, k, raw).expect("whole blocks");
        let mut w = Vec::new();
        m.dequantize_rows(0, n, &mut w);
        let x = uniform(&mut rng, cols * k, 1.0);
        let bias = (rng.below(2) == 0).then(|| uniform(&mut rng, n, 1.0));
        let chunk = (rng.below(2) == 0).then(|| range(&mut rng, 1, n));
        let got = lab
            .linear_matrix(&x, cols, &m, bias.as_deref(), kernel, chunk)
            .expect("linear");
        let e = nmse(&got, &linear_ref(&x, cols, &w, k, bias.as_deref()));
        assert!(
            e < NMSE_LINEAR,
            "case {case}: {t} [{n}x{k}] x {cols} cols, {kernel:?}, chunk {chunk:?}: nmse {e:e}"
        );
    }
}
