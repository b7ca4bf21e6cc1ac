// Combines the context splits of attn_decode.wgsl: with split s holding
// (acc_s, m_s, l_s), out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
// M = max_s m_s. An empty split has m_s = -1e30 and l_s = 0, so it weighs 0.
//
// One workgroup per (decode row, query head); invocations over head_dim.

struct Params {
    n_items: u32,  // decode rows
    dec_off: u32,  // word offset of the decode rows in `plan`
    q_heads: u32,  // query heads
    n_splits: u32, // splits
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

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = wid.x + wid.y * nwg.x;
    if (w >= p.n_items * p.q_heads) {
        return;
    }
    let item = w / p.q_heads;
    let qh = w % p.q_heads;
    let r = plan[p.dec_off + item];
    let base = (item * p.q_heads + qh) * p.n_splits;
    var m = -1.0e30;
    for (var s = 0u; s < p.n_splits; s++) {
        m = max(m, part[p.ml_off + (base + s) * 2u]);
    }
    var l = 0.0;
    for (var s = 0u; s < p.n_splits; s++) {
        l += part[p.ml_off + (base + s) * 2u + 1u] * exp(part[p.ml_off + (base + s) * 2u] - m);
    }
    for (var d = lid; d < p.hd; d += 64u) {
        var a = 0.0;
        for (var s = 0u; s < p.n_splits; s++) {
            a += part[(base + s) * p.hd + d] * exp(part[p.ml_off + (base + s) * 2u] - m);
        }
        att[r * p.q_heads * p.hd + qh * p.hd + d] = a / l;
    }
}
