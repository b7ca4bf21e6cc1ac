// Matrix-vector products for decode: y[c, row0 + o] = W[o, :] . x[c, :] (+ b)
// for up to COLS columns c (the tokens of a step), so every weight is read
// once for all of them. The host prepends `const COLS: u32` (a power of two
// up to 64) and picks the smallest variant that holds the step's columns:
// the accumulators then have a constant size and stay in registers (columns
// past ncols repeat the last one and are not written). W is one row chunk
// [rows, k] of a (possibly split) weight; the weight prelude (dtype_*.wgsl)
// supplies `w`, `w_at` and `w_load8`.
//
// When k is a multiple of 8 (every real model; quantized blocks always are)
// each invocation reads 8 consecutive weights per step with `w_load8`: two
// to four words of packed floats or one block's bytes and its scale, instead
// of one value per load; other k take one value at a time.
//
// A workgroup of 256 invocations computes 256 / tpr rows, tpr invocations
// per row striding over k (adjacent invocations read adjacent weights); the
// host picks tpr (8..64, a power of two) from k, so short rows do not leave
// most invocations idle.
//
// With `const SPLIT_K = false` (prepended for CPU adapters such as lavapipe,
// which run invocations as SIMD lanes and pay dearly for each workgroup
// barrier) each invocation computes whole rows instead, and the barrier
// branch is compiled out. Partial sums are reduced in workgroup memory, RC
// columns at a time (`const RC: u32`, min(COLS, 8), keeps that memory at
// 8 KiB for any COLS): no subgroup operations, so any subgroup size (or
// none) works.

struct Params {
    k: u32,        // input features
    rows: u32,     // output rows in this chunk
    row0: u32,     // first output row of this chunk
    ncols: u32,    // columns (tokens), 1..=COLS
    ldx: u32,      // stride between columns of x
    ldy: u32,      // stride between columns of y
    has_bias: u32, // 1 = add bias[row0 + o]
    x_off: u32,    // offset of column 0 in x
    y_off: u32,    // offset of column 0 in y
    tpr: u32,      // invocations per row: 8, 16, 32 or 64
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;

// The 8 weights `wv` times x[xi .. xi + 8].
fn dot8(wv: W8, xi: u32) -> f32 {
    let a = vec4<f32>(x[xi], x[xi + 1u], x[xi + 2u], x[xi + 3u]);
    let b = vec4<f32>(x[xi + 4u], x[xi + 5u], x[xi + 6u], x[xi + 7u]);
    return dot(wv.lo, a) + dot(wv.hi, b);
}

var<workgroup> red: array<f32, RED_LEN>; // WG * RC

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let wg = wid.x + wid.y * nwg.x;
    if (!SPLIT_K) {
        let row = wg * WG + lid;
        if (row >= p.rows) {
            return;
        }
        let last = p.ncols - 1u;
        var acc: array<f32, COLS>;
        let base = row * p.k;
        if (p.k % 8u == 0u) {
            for (var kk = 0u; kk < p.k; kk += 8u) {
                let wv = w_load8(base + kk);
                for (var c = 0u; c < COLS; c++) {
                    acc[c] += dot8(wv, p.x_off + min(c, last) * p.ldx + kk);
                }
            }
        } else {
            for (var kk = 0u; kk < p.k; kk++) {
                let wv = w_at(base + kk);
                for (var c = 0u; c < COLS; c++) {
                    acc[c] += wv * x[p.x_off + min(c, last) * p.ldx + kk];
                }
            }
        }
        for (var c = 0u; c < COLS; c++) {
            if (c < p.ncols) {
                var v = acc[c];
                if (p.has_bias != 0u) {
                    v += bias[p.row0 + row];
                }
                y[p.y_off + c * p.ldy + p.row0 + row] = v;
            }
        }
        return;
    }
    let tpr = p.tpr;
    let rpw = WG / tpr;
    let lr = lid / tpr;
    let t = lid % tpr;
    let row = wg * rpw + lr;
    var acc: array<f32, COLS>;
    let last = p.ncols - 1u;
    if (row < p.rows) {
        let base = row * p.k;
        if (p.k % 8u == 0u) {
            for (var kk = 8u * t; kk < p.k; kk += 8u * tpr) {
                let wv = w_load8(base + kk);
                for (var c = 0u; c < COLS; c++) {
                    acc[c] += dot8(wv, p.x_off + min(c, last) * p.ldx + kk);
                }
            }
        } else {
            for (var kk = t; kk < p.k; kk += tpr) {
                let wv = w_at(base + kk);
                for (var c = 0u; c < COLS; c++) {
                    acc[c] += wv * x[p.x_off + min(c, last) * p.ldx + kk];
                }
            }
        }
    }
    // One round per RC columns: partials to workgroup memory, one barrier,
    // then one invocation per (row, column) sums its tpr partials: far
    // cheaper than a tree on devices where a barrier is expensive (software
    // rasterisers), and a few dozen workgroup-memory reads on GPUs.
    for (var c0 = 0u; c0 < COLS; c0 += RC) {
        if (c0 > 0u) {
            workgroupBarrier(); // the previous round's sums are read
        }
        for (var c = 0u; c < RC; c++) {
            red[(lr * RC + c) * tpr + t] = acc[c0 + c];
        }
        workgroupBarrier();
        if (lid < rpw * RC) {
            let rr = lid / RC;
            let c = c0 + lid % RC;
            let out_row = wg * rpw + rr;
            if (out_row < p.rows && c < p.ncols) {
                let base = (rr * RC + lid % RC) * tpr;
                var v = 0.0;
                for (var i = 0u; i < tpr; i++) {
                    v += red[base + i];
                }
                if (p.has_bias != 0u) {
                    v += bias[p.row0 + out_row];
                }
                y[p.y_off + c * p.ldy + p.row0 + out_row] = v;
            }
        }
    }
}
