// Combines the context splits of attn_decode.wgsl: with split s holding
// (acc_s, m_s, l_s), out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
// M = max_s m_s. An empty split has m_s = -1e30 and l_s = 0, so it weighs 0.
//
// One workgroup per (decode row, query head). The invocations first find M
// and each split's weight e^(m_s - M) together (a stride of the splits
// each, then every invocation folds the partials of the first
// min(splits, 64) invocations, the only ones that saw a split), so a
// split's weight is computed once, not once per element of the head; then
// each invocation takes elements of the head and sums them over the
// splits, UNROLL splits' values loaded before any is used (so a merge of
// many splits waits about splits / UNROLL memory round trips, not one per
// split; the sum still runs in split order).

struct Params {
    n_items: u32,  // decode rows
    dec_off: u32,  // word offset of the decode rows in `plan`
    q_heads: u32,  // query heads
    n_splits: u32, // splits (at most MAX_SPLITS)
    ml_off: u32,   // offset of the (max, sum) pairs in `part`
    hd: u32,       // head_dim
    _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> att: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 64u;
const UNROLL: u32 = 4u;

var<workgroup> weight: array<f32, MAX_SPLITS>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = wid.x + wid.y * nwg.x;
    // Uniform per workgroup, so the barriers below stay in uniform control.
    if (w >= p.n_items * p.q_heads) {
        return;
    }
    let item = w / p.q_heads;
    let qh = w % p.q_heads;
    let r = plan[p.dec_off + item];
    let base = (item * p.q_heads + qh) * p.n_splits;
    let ns = min(p.n_splits, MAX_SPLITS);
    var m = -1.0e30;
    for (var s = lid; s < ns; s += WG) {
        m = max(m, part[p.ml_off + (base + s) * 2u]);
    }
    red[lid] = m;
    workgroupBarrier();
    // Invocations past the splits hold the identities (-1e30, then 0): at
    // batch 1 and a few hundred positions there are a handful of splits,
    // not 64 partials to fold.
    let folds = min(ns, WG);
    for (var i = 0u; i < folds; i++) {
        m = max(m, red[i]);
    }
    workgroupBarrier(); // everyone has read `red` before it is rewritten
    var l = 0.0;
    for (var s = lid; s < ns; s += WG) {
        let e = exp(part[p.ml_off + (base + s) * 2u] - m);
        weight[s] = e;
        l += part[p.ml_off + (base + s) * 2u + 1u] * e;
    }
    red[lid] = l;
    workgroupBarrier();
    l = 0.0;
    for (var i = 0u; i < folds; i++) {
        l += red[i];
    }
    for (var d = lid; d < p.hd; d += WG) {
        var a = 0.0;
        var s = 0u;
        for (; s + UNROLL <= ns; s += UNROLL) {
            var v: array<f32, UNROLL>;
            for (var u = 0u; u < UNROLL; u++) {
                v[u] = part[(base + s + u) * p.hd + d];
            }
            for (var u = 0u; u < UNROLL; u++) {
                a += v[u] * weight[s + u];
            }
        }
        for (; s < ns; s++) {
            a += part[(base + s) * p.hd + d] * weight[s];
        }
        att[r * p.q_heads * p.hd + qh * p.hd + d] = a / l;
    }
}
