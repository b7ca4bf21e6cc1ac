// Causal paged attention for prefill chunks, tiled (FlashAttention style):
// one workgroup per (tile of up to BR consecutive rows of one sequence, query
// head). The tile's queries stay in workgroup memory while key tiles of BR
// positions are loaded from the paged cache, scored, masked causally
// (position j is visible to the row at position pos iff j <= pos), folded in
// with an online softmax, and followed by the value tile.
//
// Specialised by the host, which prepends:
//   HEAD_DIM  head width
//   BR        rows per query tile = positions per key tile
//   Q_LEN     BR * HEAD_DIM
//   S_LEN     BR * BR
//   OPT       ceil(Q_LEN / WG), accumulator elements per invocation
// No subgroup operations.

struct Params {
    tile_off: u32, // word offset of the tiles' (first row, row count) pairs in `plan`
    pos_off: u32,  // word offset of the rows' positions
    rt_off: u32,   // word offset of the rows' block-table offsets
    kv_heads: u32, // KV heads
    group: u32,    // query heads per KV head
    stride: u32,   // width of a q|k|v row
    q_heads: u32,  // query heads
    bs: u32,       // block size
    scale: f32,    // 1 / sqrt(head_dim)
    n_tiles: u32,  // tiles
    _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> att: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 64u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<f32, Q_LEN>;
var<workgroup> kv: array<f32, Q_LEN>;
var<workgroup> sc: array<f32, S_LEN>;
var<workgroup> run_max: array<f32, BR>;
var<workgroup> run_sum: array<f32, BR>;
var<workgroup> rescale: array<f32, BR>;

fn cache_index(rt: u32, j: u32, g: u32) -> u32 {
    let block = plan[rt + j / p.bs];
    return ((block * p.kv_heads + g) * p.bs + j % p.bs) * HEAD_DIM;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    if (wid.x >= p.n_tiles) {
        return;
    }
    let first = plan[p.tile_off + 2u * wid.x];
    let cnt = plan[p.tile_off + 2u * wid.x + 1u];
    let h = wid.y;
    let g = h / p.group;
    let pos0 = plan[p.pos_off + first];
    let rt = plan[p.rt_off + first];
    let last = pos0 + cnt - 1u;

    for (var e = lid; e < Q_LEN; e += WG) {
        let rr = e / HEAD_DIM;
        let d = e % HEAD_DIM;
        var q = 0.0;
        if (rr < cnt) {
            q = qkv[(first + rr) * p.stride + h * HEAD_DIM + d] * p.scale;
        }
        qs[e] = q;
    }
    if (lid < BR) {
        run_max[lid] = NEG;
        run_sum[lid] = 0.0;
    }
    var acc: array<f32, OPT>;
    workgroupBarrier();

    for (var k0 = 0u; k0 <= last; k0 += BR) {
        // Key tile.
        for (var e = lid; e < Q_LEN; e += WG) {
            let jj = e / HEAD_DIM;
            let d = e % HEAD_DIM;
            let j = k0 + jj;
            var v = 0.0;
            if (j <= last) {
                v = kc[cache_index(rt, j, g) + d];
            }
            kv[e] = v;
        }
        workgroupBarrier();
        // Scores with the causal mask.
        for (var e = lid; e < S_LEN; e += WG) {
            let rr = e / BR;
            let jj = e % BR;
            var s = NEG;
            if (rr < cnt && k0 + jj <= pos0 + rr) {
                s = 0.0;
                for (var d = 0u; d < HEAD_DIM; d++) {
                    s += qs[rr * HEAD_DIM + d] * kv[jj * HEAD_DIM + d];
                }
            }
            sc[e] = s;
        }
        workgroupBarrier();
        // Value tile (the keys are no longer needed) and the softmax update.
        for (var e = lid; e < Q_LEN; e += WG) {
            let jj = e / HEAD_DIM;
            let d = e % HEAD_DIM;
            let j = k0 + jj;
            var v = 0.0;
            if (j <= last) {
                v = vc[cache_index(rt, j, g) + d];
            }
            kv[e] = v;
        }
        if (lid < BR) {
            let rr = lid;
            var m = run_max[rr];
            for (var jj = 0u; jj < BR; jj++) {
                m = max(m, sc[rr * BR + jj]);
            }
            let a = exp(run_max[rr] - m);
            var l = run_sum[rr] * a;
            for (var jj = 0u; jj < BR; jj++) {
                let s = sc[rr * BR + jj];
                var e = 0.0;
                if (s > 0.5 * NEG) {
                    e = exp(s - m);
                }
                sc[rr * BR + jj] = e;
                l += e;
            }
            run_max[rr] = m;
            run_sum[rr] = l;
            rescale[rr] = a;
        }
        workgroupBarrier();
        for (var o = 0u; o < OPT; o++) {
            let e = lid + o * WG;
            if (e < Q_LEN) {
                let rr = e / HEAD_DIM;
                let d = e % HEAD_DIM;
                var a = acc[o] * rescale[rr];
                for (var jj = 0u; jj < BR; jj++) {
                    a += sc[rr * BR + jj] * kv[jj * HEAD_DIM + d];
                }
                acc[o] = a;
            }
        }
        workgroupBarrier();
    }

    for (var o = 0u; o < OPT; o++) {
        let e = lid + o * WG;
        let rr = e / HEAD_DIM;
        let d = e % HEAD_DIM;
        if (e < Q_LEN && rr < cnt) {
            att[(first + rr) * p.q_heads * HEAD_DIM + h * HEAD_DIM + d] = acc[o] / run_sum[rr];
        }
    }
}
