//! `e^x` over a slice, for softmax: branch-free so that it vectorises, and
//! inlined into each instruction set's attention kernel.

/// `e^x` for every element, Cephes' single-precision polynomial (about 1 ulp).
/// Unlike libm's `expf` it is branch-free, so the loop vectorises: softmax
/// spends most of its time here otherwise.
#[inline(always)]
pub fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    for x in xs.iter_mut() {
        let v = x.clamp(-87.0, 88.0);
        let fx = v * LOG2E + 0.5;
        // floor() without SSE4.1: truncate, then step down for negatives.
        let mut n = fx as i32;
        if (n as f32) > fx {
            n -= 1;
        }
        let nf = n as f32;
        let r = v - nf * LN2_HI - nf * LN2_LO;
        let z = r * r;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
            * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let y = p * z + r + 1.0;
        let scale = f32::from_bits(((n + 127) as u32) << 23);
        // NaN in, NaN out; -inf (a masked score) gives exactly 0.
        *x = if x.is_nan() {
            f32::NAN
        } else if *x == f32::NEG_INFINITY {
            0.0
        } else {
            y * scale
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_two_ulp_of_libm() {
        let mut xs: Vec<f32> = (0..200_000).map(|i| -87.0 + i as f32 * 0.000_87).collect();
        xs.extend([0.0, -0.0, 1.0, 10.0, -1e-8]);
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        exp_in_place(&mut xs);
        for (got, want) in xs.iter().zip(&want) {
            let rel = ((got - want) / want).abs();
            assert!(rel < 2.5e-7, "exp: got {got}, want {want}");
        }
        let mut edge = [f32::NEG_INFINITY, f32::NAN, -1000.0];
        exp_in_place(&mut edge);
        assert_eq!(edge[0], 0.0);
        assert!(edge[1].is_nan());
        assert!(edge[2] >= 0.0 && edge[2] < 1e-37);
    }
}
