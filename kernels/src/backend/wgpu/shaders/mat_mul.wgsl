// Tiled matrix multiply for prefill: Y[m, row0 + n] = X[m, :] . W[n, :] (+ b)
// for m < M tokens and n < rows of this weight chunk. W is row-major [rows, k]
// as in Hugging Face files; the weight prelude (dtype_*.wgsl) supplies `w`
// and `w_at`.
//
// Each workgroup computes a 64 x 64 output tile; each of its 256 invocations
// a 4 x 4 block (rows ty + 16 i, columns tx + 16 j), over k in steps of 16
// staged through workgroup memory (padded rows against bank conflicts).

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
    _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;
const BKP: u32 = 17u; // padded row length in workgroup memory

var<workgroup> xs: array<f32, 1088>; // BM * BKP
var<workgroup> ws: array<f32, 1088>; // BN * BKP

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<f32, 16>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var i = 0u; i < 4u; i++) {
            let e = lid + i * 256u;
            let rr = e / BK;
            let kk = e % BK;
            let gk = k0 + kk;
            var xv = 0.0;
            let gm = m0 + rr;
            if (gm < p.m && gk < p.k) {
                xv = x[p.x_off + gm * p.ldx + gk];
            }
            xs[rr * BKP + kk] = xv;
            var wv = 0.0;
            let gn = n0 + rr;
            if (gn < p.rows && gk < p.k) {
                wv = w_at(gn * p.k + gk);
            }
            ws[rr * BKP + kk] = wv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = xs[(ty + 16u * i) * BKP + kk];
                b[i] = ws[(tx + 16u * i) * BKP + kk];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] += a[i] * b[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let gm = m0 + ty + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let gn = n0 + tx + 16u * j;
            if (gm < p.m && gn < p.rows) {
                var v = acc[i * 4u + j];
                if (p.has_bias != 0u) {
                    v += bias[p.row0 + gn];
                }
                y[p.y_off + gm * p.ldy + p.row0 + gn] = v;
            }
        }
    }
}
