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
// each invocation reads 8 consecutive weights per step with `w_load8` (one
// 16-byte load of packed f16/bf16, two of f32, or one block's bytes and its
// scale) and each column's 8 x values as two vec4 loads; other k take one
// value at a time. The host prepends `const UNROLL: u32`: the 8-wide steps
// whose weight loads an invocation issues together (at batch 1 a GPU is
// bound by the loads in flight, and a row's few steps each wait a memory
// latency otherwise).
//
// A workgroup of 256 invocations computes 256 / tpr rows, tpr invocations
// per row striding over k (adjacent invocations read adjacent weights); the
// host picks tpr (8..64, a power of two) from k, so short rows do not leave
// most invocations idle.
//
// With `const GLU = true` (the fused SwiGLU) output row o takes weight rows o
// (gate) and o + up_row (up) of a stacked gate|up matrix and writes
// silu(gate . x) * (up . x): the same sums, in the same order, as the
// product followed by silu_mul.wgsl, with one dispatch and no gate|up
// activations written (no bias: fused only for matrices without one).
//
// With `const ROPE = true` (the q|k|v product, one chunk, no residual add)
// output unit o is a rotation pair of one head: rows a = (o / half) * 2 half
// + o % half and b = a + half (half = up_row); the unit computes both sums,
// rotates the pair by its row's position where the head is a query or key
// head (RoPE, rotate_half convention), writes both into y, and writes key
// and value pairs into the layer's paged cache (qkv_rope.wgsl, appended
// only to this variant with its bindings): what the product followed by
// rope_kv.wgsl computes, in the same f32 operations, one dispatch fewer a
// layer.
//
// Two options fuse the neighbours of a product into it:
// * `const NORM = true` (split-row variants only: it needs barriers, which
//   one invocation per row is built to avoid): x is the residual stream
//   and each column is RMS-normalised on the fly,
//   y = inv_rms(x[c]) * sum_k (W[o, k] g[k]) x[c, k], with the norm weight g
//   in the bias binding (so only for matrices without a bias), read as two
//   vec4s per 8 weights, once for every column and for gate and up. The
//   workgroup first sums each column's squares (256 / COLS invocations per
//   column, summed by subgroup shuffles where there are subgroups, a
//   barrier, one invocation per column adds the per-subgroup parts, a
//   barrier), which replaces the separate RMSNorm dispatch and its output.
// * flag ACCUMULATE: y += the product (the residual add of the output and
//   down products, into the residual stream itself).
//
// With `const SPLIT_K = false` (prepended for CPU adapters such as lavapipe,
// which run invocations as SIMD lanes and pay dearly for each workgroup
// barrier) each invocation computes whole rows instead, and the barrier
// branch is compiled out.
//
// Split rows reduce their partial sums in workgroup memory, RC columns at
// a time (`const RC: u32`, min(COLS, 8), keeps that memory at 8 KiB for
// any COLS). With `const SUBGROUPS = true` (the host prepends it,
// with `sg_xor`, and the subgroup size parameter, where the device has
// subgroup operations) a butterfly of shuffles first sums each run of
// min(tpr, subgroup size) invocations of a row: when that covers the row,
// no workgroup memory or barrier is needed at all; otherwise only one
// partial per subgroup goes through workgroup memory. Any power-of-two
// subgroup size works; without subgroups the size is 1.

struct Params {
    k: u32,        // input features
    rows: u32,     // output units in this chunk: rows (GLU: gate rows; ROPE: pairs)
    row0: u32,     // first output row of this chunk
    ncols: u32,    // columns (tokens), 1..=COLS
    ldx: u32,      // stride between columns of x
    ldy: u32,      // stride between columns of y
    has_bias: u32, // 1 = add bias[row0 + o]
    x_off: u32,    // offset of column 0 in x
    y_off: u32,    // offset of column 0 in y
    tpr: u32,      // invocations per unit: 8, 16, 32 or 64
    up_row: u32,   // GLU: offset from a gate row to its up row; ROPE: head_dim / 2
    flags: u32,    // 1 = ACCUMULATE
    eps: f32,      // NORM: the norm's epsilon
    // ROPE only (qkv_rope.wgsl):
    col0: u32,     // the pass row of column 0 (cos, sin and slots are per pass row)
    cs_off: u32,   // word offset of cos[pass rows][half] (f32 bits) in `plan`
    sn_off: u32,   // word offset of sin[pass rows][half]
    slot_off: u32, // word offset of the pass rows' KV slots
    k_head0: u32,  // first key head (= query heads); value heads follow the keys
    kv_heads: u32, // KV heads
    bs: u32,       // KV block size
}

// x as vec4s: the 8-wide path reads two per step (every x buffer is a
// whole number of 16-byte words), `x_at` one value.
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
// The bias, or the norm weight under NORM, as vec4s (its buffers are whole
// 16-byte words).
@group(0) @binding(2) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const ACCUMULATE: u32 = 1u;

fn x_at(i: u32) -> f32 {
    return x[i >> 2u][i & 3u];
}

fn bias_at(i: u32) -> f32 {
    return bias[i >> 2u][i & 3u];
}

// x[xi .. xi + 8] as two vector loads. The 8-wide path calls it with xi a
// multiple of 8: the host lays columns out k apart (ldx = k, x_off a
// multiple of ldx), and that path runs only when 8 divides k.
fn x8(xi: u32) -> W8 {
    return W8(x[xi >> 2u], x[(xi >> 2u) + 1u]);
}

fn dot8(wv: W8, xv: W8) -> f32 {
    return dot(wv.lo, xv.lo) + dot(wv.hi, xv.hi);
}

fn silu_mul(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

var<workgroup> red: array<f32, RED_LEN>; // WG * RC
var<workgroup> inv_rms: array<f32, COLS>; // NORM: per column

// NORM: 1 / rms of each column of x into `inv_rms`. Every invocation of the
// workgroup calls it (it has shuffles and barriers). Shuffles first sum each
// run of min(per, sg_size) invocations of a column, so the serial part adds
// one value per subgroup (without subgroups, one per invocation).
fn column_norms(lid: u32, sg_size: u32) {
    let per = WG / COLS;
    let c = lid / per;
    let j = lid % per;
    let xc = p.x_off + min(c, p.ncols - 1u) * p.ldx;
    var ss = 0.0;
    for (var i = j; i < p.k; i += per) {
        let v = x_at(xc + i);
        ss += v * v;
    }
    let width = min(per, sg_size);
    if (SUBGROUPS) {
        for (var m = 1u; m < width; m <<= 1u) {
            ss += sg_xor(ss, m);
        }
    }
    let parts = per / width;
    if (j % width == 0u) {
        red[c * parts + j / width] = ss;
    }
    workgroupBarrier();
    if (j == 0u) {
        var total = 0.0;
        for (var i = 0u; i < parts; i++) {
            total += red[c * parts + i];
        }
        inv_rms[c] = 1.0 / sqrt(total / f32(p.k) + p.eps);
    }
    workgroupBarrier();
}

// NORM: the norm weights g[kk .. kk + 8] (kk a multiple of 8: two aligned
// vector loads).
fn norm8(kk: u32) -> W8 {
    let q = kk >> 2u;
    return W8(bias[q], bias[q + 1u]);
}

fn scaled8(wv: W8, g: W8) -> W8 {
    return W8(wv.lo * g.lo, wv.hi * g.hi);
}

fn w_at_normed(i: u32, kk: u32) -> f32 {
    if (!NORM) {
        return w_at(i);
    }
    return w_at(i) * bias_at(kk);
}

// The finished sums of output unit `unit`, column c: `first` (the row's
// sum; under GLU the gate's, under ROPE the pair's first row's) and
// `second` (GLU: the up row's; ROPE: the pair's second row's; else unused),
// scaled by the column's norm or with the bias added (the two exclude each
// other), through SiLU under GLU or the rotation under ROPE, added to y
// under ACCUMULATE; and stored.
fn finish(first: f32, second: f32, unit: u32, c: u32) {
    var a = first;
    var b = second;
    let row = unit_row(unit);
    if (NORM) {
        a *= inv_rms[c];
        b *= inv_rms[c];
    } else if (p.has_bias != 0u) {
        a += bias_at(p.row0 + row);
        if (ROPE) {
            b += bias_at(p.row0 + row + p.up_row);
        }
    }
    if (ROPE) {
        store_pair(a, b, unit, row, c);
        return;
    }
    var v = a;
    if (GLU) {
        v = silu_mul(a, b);
    }
    let at = p.y_off + c * p.ldy + p.row0 + row;
    if ((p.flags & ACCUMULATE) != 0u) {
        v += y[at];
    }
    y[at] = v;
}

// The (first) weight row of output unit `unit`: the unit itself but under
// ROPE, where units are the rotation pairs of each head.
fn unit_row(unit: u32) -> u32 {
    if (ROPE) {
        return (unit / p.up_row) * 2u * p.up_row + unit % p.up_row;
    }
    return unit;
}

// Per column: a unit's dot product and, with PAIR (GLU or ROPE), its
// second row's.
struct Sums {
    g: array<f32, COLS>,
    u: array<f32, COLS>,
}

// Unit `row`'s sums over k in 8-wide steps first, first + stride, ... (where
// 8 divides k; else single values): the whole row for one invocation per
// row, a stride of it for each of the tpr invocations of a split row.
fn row_sums(row: u32, first: u32, stride: u32) -> Sums {
    var s: Sums;
    let last = p.ncols - 1u;
    let base = unit_row(row) * p.k;
    let ubase = (unit_row(row) + p.up_row) * p.k;
    if (p.k % 8u == 0u) {
        let step = 8u * stride;
        for (var k0 = 8u * first; k0 < p.k; k0 += UNROLL * step) {
            // UNROLL steps' weights loaded before any is used, so that many
            // loads are in flight per invocation; the sums still run in
            // step order (the same bits for any UNROLL).
            var wvs: array<W8, UNROLL>;
            var wus: array<W8, UNROLL>;
            for (var u = 0u; u < UNROLL; u++) {
                let kk = k0 + u * step;
                if (kk < p.k) {
                    wvs[u] = w_load8(base + kk);
                    if (PAIR) {
                        wus[u] = w_load8(ubase + kk);
                    }
                }
            }
            for (var u = 0u; u < UNROLL; u++) {
                let kk = k0 + u * step;
                if (kk < p.k) {
                    var wv = wvs[u];
                    var wu = wus[u];
                    if (NORM) {
                        // One load of g for the gate and up rows and every
                        // column.
                        let g = norm8(kk);
                        wv = scaled8(wv, g);
                        wu = scaled8(wu, g);
                    }
                    for (var c = 0u; c < COLS; c++) {
                        let xv = x8(p.x_off + min(c, last) * p.ldx + kk);
                        s.g[c] += dot8(wv, xv);
                        if (PAIR) {
                            s.u[c] += dot8(wu, xv);
                        }
                    }
                }
            }
        }
    } else {
        for (var kk = first; kk < p.k; kk += stride) {
            let wv = w_at_normed(base + kk, kk);
            var wu = 0.0;
            if (PAIR) {
                wu = w_at_normed(ubase + kk, kk);
            }
            for (var c = 0u; c < COLS; c++) {
                let xv = x_at(p.x_off + min(c, last) * p.ldx + kk);
                s.g[c] += wv * xv;
                if (PAIR) {
                    s.u[c] += wu * xv;
                }
            }
        }
    }
    return s;
}

// Finishes every column of `row` from its complete sums.
fn finish_row(row: u32, s: Sums) {
    for (var c = 0u; c < COLS; c++) {
        if (c < p.ncols) {
            finish(s.g[c], s.u[c], row, c);
        }
    }
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    SUBGROUP_SIZE_PARAM
) {
    let wg = wid.x + wid.y * nwg.x;
    if (NORM) {
        column_norms(lid, sg_size);
    }
    if (!SPLIT_K) {
        // No early return: what follows the branch must stay in uniform
        // control flow for the split path's barriers and shuffles.
        let row = wg * WG + lid;
        if (row < p.rows) {
            finish_row(row, row_sums(row, 0u, 1u));
        }
        return;
    }
    let tpr = p.tpr;
    let rpw = WG / tpr;
    let lr = lid / tpr;
    let t = lid % tpr;
    let row = wg * rpw + lr;
    var sums: Sums;
    if (row < p.rows) {
        sums = row_sums(row, t, tpr);
    }
    // Shuffles: each run of `width` invocations of a row sums its partials
    // (the invocations of a row are consecutive, and so are a subgroup's).
    let width = min(tpr, sg_size);
    if (SUBGROUPS) {
        for (var c = 0u; c < COLS; c++) {
            var g = sums.g[c];
            var u = sums.u[c];
            for (var m = 1u; m < width; m <<= 1u) {
                g += sg_xor(g, m);
                if (PAIR) {
                    u += sg_xor(u, m);
                }
            }
            sums.g[c] = g;
            sums.u[c] = u;
        }
        if (width == tpr) {
            // Every invocation holds its row's sums; the first finishes.
            if (t == 0u && row < p.rows) {
                finish_row(row, sums);
            }
            return;
        }
    }
    // One round per RC columns (two with PAIR: first rows, then second): the first
    // invocation of each run writes its partial to workgroup memory, one
    // barrier, then one invocation per (row, column) sums the row's parts:
    // far cheaper than a tree on devices where a barrier is expensive
    // (software rasterisers), and a few workgroup-memory reads on GPUs.
    let parts = tpr / width;
    let halves = select(1u, 2u, PAIR);
    for (var c0 = 0u; c0 < COLS; c0 += RC) {
        var first = 0.0;
        for (var h = 0u; h < halves; h++) {
            if (c0 > 0u || h > 0u) {
                workgroupBarrier(); // the previous round's sums are read
            }
            if (t % width == 0u) {
                for (var c = 0u; c < RC; c++) {
                    let v = select(sums.g[c0 + c], sums.u[c0 + c], h == 1u);
                    red[(lr * RC + c) * parts + t / width] = v;
                }
            }
            workgroupBarrier();
            if (lid < rpw * RC) {
                let rr = lid / RC;
                let c = c0 + lid % RC;
                let out_row = wg * rpw + rr;
                let base = (rr * RC + lid % RC) * parts;
                var v = 0.0;
                for (var i = 0u; i < parts; i++) {
                    v += red[base + i];
                }
                if (PAIR && h == 0u) {
                    first = v;
                } else if (out_row < p.rows && c < p.ncols) {
                    if (PAIR) {
                        finish(first, v, out_row, c);
                    } else {
                        finish(v, 0.0, out_row, c);
                    }
                }
            }
        }
    }
}
