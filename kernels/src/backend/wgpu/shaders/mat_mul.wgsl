// Tiled matrix multiply for prefill: Y[m, row0 + n] = X[m, :] . W[n, :] (+ b)
// for m < M tokens and n < rows of this weight chunk. W is row-major [rows, k]
// as in Hugging Face files; the weight prelude (dtype_*.wgsl) supplies `w`,
// `w_at` and `w_load8`.
//
// Each workgroup computes a 64 x 64 output tile, over k in slabs of 32. Each
// of its 256 invocations:
// * loads 8 consecutive weights of one tile row with `w_load8` (when k is a
//   multiple of 8, as in every real model: two to four words of packed
//   floats, or one block's bytes and scale, instead of 8 separate values)
//   and 8 consecutive x values of one token, and stores them transposed, so
//   that both tiles are [k][64] in workgroup memory;
// * multiplies a 4 x 4 block of the tile (tokens 4 ty .. 4 ty + 3, rows
//   4 tx .. 4 tx + 3) as two vec4 reads and 16 multiply-adds per k.
// The next slab's global loads are issued into registers before the current
// slab is multiplied (register double buffering), so their latency hides
// behind the arithmetic with one tile of workgroup memory (16 KiB).

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
    _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const TILE: u32 = 64u;
const BK: u32 = 32u;
const Q: u32 = 16u; // vec4s per tile row (TILE / 4)

// [k][token] and [k][weight row], four tokens or rows per vec4.
var<workgroup> xs: array<vec4<f32>, 512>; // BK * Q
var<workgroup> ws: array<vec4<f32>, 512>;

// Weights k0 .. k0 + 8 of tile row n (zero past the chunk's rows or k).
fn load_w(n: u32, k0: u32) -> W8 {
    if (n >= p.rows || k0 >= p.k) {
        return W8(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    let base = n * p.k + k0;
    if (p.k % 8u == 0u) {
        return w_load8(base);
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (k0 + j < p.k) {
            v[j] = w_at(base + j);
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// x values k0 .. k0 + 8 of token m (zero past the tokens or k).
fn load_x(m: u32, k0: u32) -> W8 {
    var v: array<f32, 8>;
    if (m < p.m) {
        let base = p.x_off + m * p.ldx + k0;
        for (var j = 0u; j < 8u; j++) {
            if (k0 + j < p.k) {
                v[j] = x[base + j];
            }
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n0 = wid.x * TILE;
    let m0 = wid.y * TILE;
    // Loading: tile row (or token) lid / 4, k offset 8 (lid % 4) in the slab.
    let lr = lid / 4u;
    let lk = 8u * (lid % 4u);
    // Multiplying: tokens 4 ty .., rows 4 tx ...
    let tx = lid % Q;
    let ty = lid / Q;
    var acc: array<vec4<f32>, 4>;
    var wv = load_w(n0 + lr, lk);
    var xv = load_x(m0 + lr, lk);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        let slot = lr / 4u;
        let lane = lr % 4u;
        for (var j = 0u; j < 4u; j++) {
            ws[(lk + j) * Q + slot][lane] = wv.lo[j];
            ws[(lk + 4u + j) * Q + slot][lane] = wv.hi[j];
            xs[(lk + j) * Q + slot][lane] = xv.lo[j];
            xs[(lk + 4u + j) * Q + slot][lane] = xv.hi[j];
        }
        workgroupBarrier();
        let next = k0 + BK;
        if (next < p.k) {
            wv = load_w(n0 + lr, next + lk);
            xv = load_x(m0 + lr, next + lk);
        }
        for (var kk = 0u; kk < BK; kk++) {
            let a = xs[kk * Q + ty];
            let b = ws[kk * Q + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let gm = m0 + 4u * ty + i;
        for (var j = 0u; j < 4u; j++) {
            let gn = n0 + 4u * tx + j;
            if (gm < p.m && gn < p.rows) {
                var v = acc[i][j];
                if (p.has_bias != 0u) {
                    v += bias[p.row0 + gn];
                }
                let at = p.y_off + gm * p.ldy + p.row0 + gn;
                if (p.accumulate != 0u) {
                    v += y[at];
                }
                y[at] = v;
            }
        }
    }
}
