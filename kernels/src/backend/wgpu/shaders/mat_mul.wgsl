// Tiled matrix multiply for prefill: Y[m, row0 + n] = X[m, :] . W[n, :] (+ b)
// for m < M tokens and n < rows of this weight chunk. W is row-major [rows, k]
// as in Hugging Face files; the weight prelude (dtype_*.wgsl) supplies `w`,
// `w_at` and `w_load8`.
//
// Each workgroup computes a 64 x 64 output tile, over k in slabs of 16,
// double-buffered in workgroup memory: while the invocations multiply one
// slab they store the next into the other buffer, so one barrier per slab
// suffices and the next slab's global loads (issued before the multiply)
// hide behind it. Per slab:
// * invocations 0..128 each load 8 consecutive weights of one tile row with
//   `w_load8` (when k is a multiple of 8, as in every real model: one
//   16-byte load of packed f16/bf16, two of f32, or one block's bytes and
//   scale, instead of 8 separate values) and invocations 128..256 8 consecutive x values of
//   one token; both tiles are stored transposed, [k][64];
// * every invocation multiplies a 4 x 4 block of the tile (tokens
//   4 ty .. 4 ty + 3, rows 4 tx .. 4 tx + 3): two vec4 reads and 16
//   multiply-adds per k.
// Two buffers of both tiles take 16 KiB, the smallest limit WebGPU allows.

struct Params {
    k: u32,        // input features
    rows: u32,     // output rows (N) in this chunk
    row0: u32,     // first output row of this chunk
    m: u32,        // tokens (M)
    ldx: u32,      // stride between rows of X
    ldy: u32,      // stride between rows of Y
    has_bias: u32, // 1 = add bias[row0 + n]
    x_off: u32,    // offset of X in x
    y_off: u32,    // offset of Y in y
    accumulate: u32, // 1 = add the product to y (a residual add)
    splits: u32,   // coop_mat_mul.wgsl's k splits (1 here)
    k_len: u32,    // k values per split
    m_groups: u32, // token tiles
    fold: u32,     // 1 = the last split sums the splits (coop_mat_mul.wgsl)
    part_n: u32,   // rows of a split's partials (padded to whole tiles)
    part_m: u32,   // tokens of a split's partials (padded to whole tiles)
}

// x as vec4s (every x buffer is a whole number of 16-byte words); rows of X
// are k apart, so with 8 dividing k each 8-wide read is two aligned loads.
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const TILE: u32 = 64u;
const BK: u32 = 16u;
const Q: u32 = 16u; // vec4s per tile row (TILE / 4)
const SLAB: u32 = 256u; // vec4s per buffer of one tile (BK * Q)

// Two buffers of [k][token] and [k][weight row], four tokens or rows per
// vec4.
var<workgroup> xs: array<vec4<f32>, 512>; // 2 * SLAB
var<workgroup> ws: array<vec4<f32>, 512>;

// load_w and load_x: tile_loads.wgsl; store_y: y_store.wgsl; both
// appended to this file.

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n0 = wid.x * TILE;
    let m0 = wid.y * TILE;
    // Loading: weights (lid < 128) or x (the rest), tile row or token
    // `lr`, k offset `lk` in the slab.
    let loads_w = lid < 128u;
    let lr = (lid % 128u) / 2u;
    let lk = 8u * (lid % 2u);
    let slot = lr / 4u;
    let lane = lr % 4u;
    // Multiplying: tokens 4 ty .., rows 4 tx ...
    let tx = lid % Q;
    let ty = lid / Q;
    var acc: array<vec4<f32>, 4>;
    var v: W8;
    if (loads_w) {
        v = load_w(n0 + lr, lk);
    } else {
        v = load_x(m0 + lr, lk);
    }
    var cur = 0u;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // Store the slab just loaded into buffer `cur` (no one reads it:
        // the last barrier ended every read of the slab two back).
        let b = cur * SLAB;
        for (var j = 0u; j < 4u; j++) {
            if (loads_w) {
                ws[b + (lk + j) * Q + slot][lane] = v.lo[j];
                ws[b + (lk + 4u + j) * Q + slot][lane] = v.hi[j];
            } else {
                xs[b + (lk + j) * Q + slot][lane] = v.lo[j];
                xs[b + (lk + 4u + j) * Q + slot][lane] = v.hi[j];
            }
        }
        workgroupBarrier();
        let next = k0 + BK;
        if (next < p.k) {
            if (loads_w) {
                v = load_w(n0 + lr, next + lk);
            } else {
                v = load_x(m0 + lr, next + lk);
            }
        }
        for (var kk = 0u; kk < BK; kk++) {
            let a = xs[b + kk * Q + ty];
            let w4 = ws[b + kk * Q + tx];
            acc[0] += a.x * w4;
            acc[1] += a.y * w4;
            acc[2] += a.z * w4;
            acc[3] += a.w * w4;
        }
        cur = 1u - cur;
    }
    for (var i = 0u; i < 4u; i++) {
        let gm = m0 + 4u * ty + i;
        for (var j = 0u; j < 4u; j++) {
            let gn = n0 + 4u * tx + j;
            if (gm < p.m && gn < p.rows) {
                store_y(gm, gn, acc[i][j]);
            }
        }
    }
}
