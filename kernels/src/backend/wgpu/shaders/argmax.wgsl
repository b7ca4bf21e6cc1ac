// Greedy decoding on the device: ids[out_base + r] = argmax of logits row r,
// ties to the lowest id and NaN counted as -inf (the shared sampler's rule),
// so a greedy step reads back one u32 per sequence instead of a vocabulary row.
//
// One workgroup per row; (value, id) pairs are reduced in workgroup memory.

struct Params {
    n_rows: u32,   // rows
    vocab: u32,    // row length
    out_base: u32, // first id slot to write
    _p3: u32,
    _p4: u32, _p5: u32, _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

// Whether candidate (vb, ib) beats (va, ia).
fn beats(vb: f32, ib: u32, va: f32, ia: u32) -> bool {
    if (ib == NONE) {
        return false;
    }
    if (ia == NONE) {
        return true;
    }
    return vb > va || (vb == va && ib < ia);
}

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
    var bv = 0.0;
    var bi = NONE;
    for (var i = lid; i < p.vocab; i += WG) {
        var v = logits[r * p.vocab + i];
        if (v != v) {
            v = bitcast<f32>(0xff800000u); // -inf
        }
        // Ids grow along this loop, so a tie keeps the earlier one.
        if (bi == NONE || v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    // Two levels (16 x 16): few barriers, cheap where they are expensive.
    if (lid < 16u) {
        var v = best_v[lid * 16u];
        var i = best_i[lid * 16u];
        for (var j = 1u; j < 16u; j++) {
            let vb = best_v[lid * 16u + j];
            let ib = best_i[lid * 16u + j];
            if (beats(vb, ib, v, i)) {
                v = vb;
                i = ib;
            }
        }
        best_v[lid * 16u] = v;
        best_i[lid * 16u] = i;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var v = best_v[0];
        var i = best_i[0];
        for (var j = 1u; j < 16u; j++) {
            let vb = best_v[j * 16u];
            let ib = best_i[j * 16u];
            if (beats(vb, ib, v, i)) {
                v = vb;
                i = ib;
            }
        }
        ids[p.out_base + r] = i;
    }
}
