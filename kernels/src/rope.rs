//! Rotary position embedding frequencies, including Llama 3's long-context
//! rescaling, computed as Hugging Face `transformers` does (or, from a GGUF
//! file, as llama.cpp does: each frequency divided by its stored factor).

use std::sync::Arc;

/// How the rotary frequencies are rescaled (`rope_scaling` in `config.json`,
/// `rope_freqs.weight` in a GGUF file).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's scheme (`rope_type: "llama3"`): low frequencies divided by
    /// `factor`, high ones kept, the band between interpolated smoothly.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
    /// Each rotary pair's frequency divided by its own factor: llama.cpp's
    /// `rope_freqs.weight`, which its converter computes from Llama 3.1's
    /// `rope_scaling` (the factors are `1 / ((1 - smooth) / factor + smooth)`,
    /// so dividing by them is [`RopeScaling::Llama3`] up to f32 rounding).
    PerPair {
        /// One divisor per rotary pair (`head_dim / 2` of them, positive and
        /// finite: checked where they are read).
        divisors: Arc<[f64]>,
    },
    /// Phi-3's LongRoPE (`rope_type: "longrope"`, formerly `"su"`): each
    /// rotary pair's frequency divided by its own factor, from the short
    /// list when the served context is within the pre-trained one and the
    /// long list beyond it, and every rotation scaled by `mscale` (both
    /// queries and keys, so the scores by its square).
    LongRope {
        /// Divisors for contexts up to `original_context` (`head_dim / 2`).
        short: Arc<[f64]>,
        /// Divisors for longer contexts (`head_dim / 2`).
        long: Arc<[f64]>,
        /// The context the model was pre-trained with.
        original_context: usize,
        /// Which list is in use: set by the context served
        /// ([`RopeScaling::for_context`]).
        use_long: bool,
        /// What the cosines and sines are multiplied by (HF's
        /// `attention_factor`).
        mscale: f64,
    },
}

impl RopeScaling {
    /// What every rotation's cosine and sine are multiplied by (1 but for
    /// [`RopeScaling::LongRope`]).
    pub fn mscale(&self) -> f64 {
        match *self {
            RopeScaling::LongRope { mscale, .. } => mscale,
            _ => 1.0,
        }
    }

    /// The scaling for a served context of `context` tokens: LongRoPE takes
    /// its long factors only past the pre-trained context, as llama.cpp
    /// chooses them (by the context, once for every position), and as
    /// Hugging Face computes every sequence that stays within it.
    pub fn for_context(&self, context: usize) -> RopeScaling {
        match self {
            RopeScaling::LongRope {
                short,
                long,
                original_context,
                mscale,
                ..
            } => RopeScaling::LongRope {
                short: short.clone(),
                long: long.clone(),
                original_context: *original_context,
                use_long: context > *original_context,
                mscale: *mscale,
            },
            other => other.clone(),
        }
    }

    /// The per-pair divisors it holds, if any (for checks of their count).
    pub fn divisors(&self) -> Vec<&[f64]> {
        match self {
            RopeScaling::PerPair { divisors } => vec![divisors],
            RopeScaling::LongRope { short, long, .. } => vec![short, long],
            _ => Vec::new(),
        }
    }
}

/// Phi-3's default attention factor (Hugging Face's
/// `_compute_longrope_parameters`, llama.cpp's converter): 1 unless the
/// context is stretched (`factor` above 1), then
/// `sqrt(1 + ln(factor) / ln(original_context))`.
pub fn longrope_mscale(factor: f64, original_context: usize) -> f64 {
    if factor <= 1.0 || original_context < 2 {
        1.0
    } else {
        (1.0 + factor.ln() / (original_context as f64).ln()).sqrt()
    }
}

/// The `head_dim / 2` inverse frequencies of rotary pair `i` (HF's `inv_freq`),
/// after scaling. Kept in f64 so the angles stay exact at long positions.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f64> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let base = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            scale_one(base, i, scaling)
        })
        .collect()
}

/// Pair `i`'s frequency through `_compute_llama3_parameters`, linear
/// scaling or its own divisor.
fn scale_one(freq: f64, i: usize, scaling: &RopeScaling) -> f64 {
    match *scaling {
        RopeScaling::None => freq,
        // A missing divisor leaves its pair as it is; the loaders refuse a
        // table of the wrong length before it gets here.
        RopeScaling::PerPair { ref divisors } => freq / divisors.get(i).copied().unwrap_or(1.0),
        RopeScaling::LongRope {
            ref short,
            ref long,
            use_long,
            ..
        } => {
            let divisors = if use_long { long } else { short };
            freq / divisors.get(i).copied().unwrap_or(1.0)
        }
        RopeScaling::Linear { factor } => freq / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_ctx,
        } => {
            let low_freq_wavelen = old_ctx / low_freq_factor;
            let high_freq_wavelen = old_ctx / high_freq_factor;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                freq
            } else if wavelen > low_freq_wavelen {
                freq / factor
            } else {
                let smooth =
                    (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * freq / factor + smooth * freq
            }
        }
    }
}

/// Fills `cos`/`sin` (each `inv_freq.len()` long) with the rotation of
/// position `pos`, each value multiplied by `mscale`
/// ([`RopeScaling::mscale`]).
#[inline]
pub fn angles(inv_freq: &[f64], mscale: f64, pos: u32, cos: &mut [f32], sin: &mut [f32]) {
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let a = pos as f64 * f;
        *c = (a.cos() * mscale) as f32;
        *s = (a.sin() * mscale) as f32;
    }
}

/// Which elements of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// Element `i` with `i + head_dim / 2` (Hugging Face's `rotate_half`).
    #[default]
    HalfSplit,
    /// Element `2 i` with `2 i + 1`: llama.cpp's converter permutes the rows
    /// of a llama model's q and k projections into this order, so a GGUF
    /// llama's heads come out interleaved (the attention scores are the same).
    Interleaved,
}

/// Rotates one head in place, pairing its elements as `layout` says.
#[inline]
pub fn rotate_as(layout: RopeLayout, head: &mut [f32], cos: &[f32], sin: &[f32]) {
    match layout {
        RopeLayout::HalfSplit => rotate(head, cos, sin),
        RopeLayout::Interleaved => {
            for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                let (u, v) = (pair[0], pair[1]);
                pair[0] = u * c - v * s;
                pair[1] = v * c + u * s;
            }
        }
    }
}

/// The row of a HF-layout (half-split) head that row `r` of an interleaved
/// one holds: llama.cpp's permutation, undone. `head_dim` must be even.
pub fn interleaved_source_row(r: usize, head_dim: usize) -> usize {
    let (head, i) = (r / head_dim, r % head_dim);
    head * head_dim + i / 2 + (i % 2) * (head_dim / 2)
}

/// Rotates one head in place, HF `rotate_half` convention: element `i` pairs
/// with `i + head_dim / 2`.
#[inline]
pub fn rotate(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    let (a, b) = head.split_at_mut(half);
    for (((x0, x1), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
        let (u, v) = (*x0, *x1);
        *x0 = u * c - v * s;
        *x1 = v * c + u * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_rotation_is_the_half_split_one_on_permuted_rows() {
        let hd = 8;
        let head: Vec<f32> = (0..hd).map(|i| i as f32 + 1.0).collect();
        let cos = [0.1, 0.5, -0.3, 0.9];
        let sin = [0.7, -0.2, 0.4, 0.05];
        let mut hf = head.clone();
        rotate_as(RopeLayout::HalfSplit, &mut hf, &cos, &sin);
        // The interleaved head holds HF element interleaved_source_row(r) at r.
        let mut il: Vec<f32> = (0..hd)
            .map(|r| head[interleaved_source_row(r, hd)])
            .collect();
        rotate_as(RopeLayout::Interleaved, &mut il, &cos, &sin);
        for r in 0..hd {
            assert_eq!(il[r], hf[interleaved_source_row(r, hd)], "row {r}");
        }
        assert_eq!(interleaved_source_row(1, 8), 4);
        assert_eq!(interleaved_source_row(8 + 3, 8), 8 + 5);
    }

    #[test]
    fn plain_frequencies_follow_theta() {
        let f = inv_freq(8, 10000.0, &RopeScaling::None);
        let want = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{f:?}");
        }
    }

    #[test]
    fn llama3_scaling_matches_hf_formula_by_hand() {
        // head_dim 8, theta 1e4 -> base frequencies 1, 0.1, 0.01, 0.001, i.e.
        // wavelengths 2pi/f = 6.28, 62.8, 628.3, 6283.2.
        // original context 1024, low 1, high 4, factor 8:
        //   low_freq_wavelen = 1024, high_freq_wavelen = 256.
        // 6.28 and 62.8 < 256: kept. 6283 > 1024: 0.001 / 8 = 0.000125.
        // 628.3 is in between: smooth = (1024 / 628.3185 - 1) / 3 = 0.2099142,
        //   (1 - smooth) * 0.01 / 8 + smooth * 0.01 = 0.0030867610.
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 1024.0,
        };
        let f = inv_freq(8, 10000.0, &scaling);
        let want = [1.0, 0.1, 0.003_086_760_967, 0.000_125];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() < 1e-11, "{f:?}");
        }
    }

    #[test]
    fn linear_scaling_divides() {
        let f = inv_freq(4, 100.0, &RopeScaling::Linear { factor: 2.0 });
        assert!((f[0] - 0.5).abs() < 1e-12 && (f[1] - 0.05).abs() < 1e-12);
    }

    #[test]
    fn rotation_at_position_zero_is_identity_and_preserves_norm() {
        let inv = inv_freq(8, 10000.0, &RopeScaling::None);
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        angles(&inv, 1.0, 0, &mut c, &mut s);
        let mut h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let orig = h;
        rotate(&mut h, &c, &s);
        assert_eq!(h, orig);
        angles(&inv, 1.0, 37, &mut c, &mut s);
        rotate(&mut h, &c, &s);
        let n0: f32 = orig.iter().map(|x| x * x).sum();
        let n1: f32 = h.iter().map(|x| x * x).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // Pair (0, 4) rotates by angle 37 * 1.0.
        let a = 37.0f64;
        let x0 = (1.0 * a.cos() - 5.0 * a.sin()) as f32;
        assert!((h[0] - x0).abs() < 1e-5);
    }
}
