// RMSNorm of the residual stream (the output and down products add into x
// themselves):
//   y[r] = weight * (x[s] / sqrt(mean(x[s]^2) + eps))   (Hugging Face order)
// where s = r, or s = plan[sel_off + r] with SELECT (the final norm runs only
// on the rows that need logits and writes them compactly). On passes of
// split-row mat-vec the layers' norms before bias-free products are fused
// into those products instead (mat_vec.wgsl).
//
// One workgroup per output row; the sum of squares is reduced in workgroup
// memory (no subgroup operations, so any subgroup size works).

struct Params {
    h: u32,       // hidden size
    eps: f32,     // epsilon
    flags: u32,   // 4 = SELECT
    sel_off: u32, // word offset of the selected rows in `plan`
    n_rows: u32,  // output rows
    _p5: u32, _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> nw: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const SELECT: u32 = 4u;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.n_rows) {
        return;
    }
    var s = r;
    if ((p.flags & SELECT) != 0u) {
        s = plan[p.sel_off + r];
    }
    let base = s * p.h;
    var ss = 0.0;
    for (var i = lid; i < p.h; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    // Two levels (16 x 16) instead of a tree: three barriers in all, which
    // matters where barriers are expensive (software rasterisers).
    if (lid < 16u) {
        var s16 = 0.0;
        for (var i = 0u; i < 16u; i++) {
            s16 += red[lid * 16u + i];
        }
        red[lid * 16u] = s16;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0.0;
        for (var i = 0u; i < 16u; i++) {
            total += red[i * 16u];
        }
        red[0] = total;
    }
    workgroupBarrier();
    let inv = 1.0 / sqrt(red[0] / f32(p.h) + p.eps);
    for (var i = lid; i < p.h; i += WG) {
        y[r * p.h + i] = nw[i] * (x[base + i] * inv);
    }
}
