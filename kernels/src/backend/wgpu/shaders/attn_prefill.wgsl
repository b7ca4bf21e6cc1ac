// Causal paged attention for prefill chunks, FlashAttention style with one
// invocation per (query row, query head): a workgroup takes a tile of up to
// RT consecutive rows of one sequence and HG query heads that share one KV
// head, so every invocation of it reads the same key and value at the same
// time (workgroup-memory broadcasts, no bank conflicts). Key and value tiles
// of KT positions are loaded from the paged cache into workgroup memory;
// each invocation scores its row against the tile, masked causally
// (position j is visible to the row at position pos iff j <= pos), and
// folds the tile into its own running maximum, sum and output accumulator
// (online softmax in registers: no barrier beyond the two per tile that
// guard the loads).
//
// Specialised by the host, which prepends:
//   HEAD_DIM  head width
//   VW        vector width (4 where HEAD_DIM allows, else 2)
//   VT        vecVW<f32>
//   NV        HEAD_DIM / VW
//   HG        query heads per workgroup (a divisor of the group)
//   RT        rows per tile
//   WG        invocations (64: a whole number of subgroups of any size;
//             those past RT * HG have no row and only help load the tiles)
//   KT        key positions per tile
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

const NEG: f32 = -1.0e30;

var<workgroup> ks: array<VT, KT * NV>;
var<workgroup> vs: array<VT, KT * NV>;

fn cache_index(rt: u32, j: u32, g: u32) -> u32 {
    let block = plan[rt + j / p.bs];
    return ((block * p.kv_heads + g) * p.bs + j % p.bs) * HEAD_DIM;
}

// VW consecutive values of the cache or of q|k|v (rows start at multiples
// of HEAD_DIM, so only a multiple of VW is guaranteed, not vector alignment).
fn k_at(at: u32) -> VT {
    var v = VT();
    for (var i = 0u; i < VW; i++) {
        v[i] = kc[at + i];
    }
    return v;
}

fn v_at(at: u32) -> VT {
    var v = VT();
    for (var i = 0u; i < VW; i++) {
        v[i] = vc[at + i];
    }
    return v;
}

fn q_at(at: u32) -> VT {
    var v = VT();
    for (var i = 0u; i < VW; i++) {
        v[i] = qkv[at + i];
    }
    return v;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    if (wid.x >= p.n_tiles) {
        return;
    }
    let first = plan[p.tile_off + 2u * wid.x];
    let cnt = plan[p.tile_off + 2u * wid.x + 1u];
    let hgroups = p.group / HG;
    let g = wid.y / hgroups;
    let rr = lid / HG;
    let h = g * p.group + (wid.y % hgroups) * HG + lid % HG;
    let pos0 = plan[p.pos_off + first];
    let rt = plan[p.rt_off + first];
    let last = pos0 + cnt - 1u;
    let live = rr < cnt;
    // Keys this invocation's row sees: positions 0 ..= pos.
    let pos = pos0 + min(rr, cnt - 1u);

    var q: array<VT, NV>;
    var acc: array<VT, NV>;
    if (live) {
        let qb = (first + rr) * p.stride + h * HEAD_DIM;
        for (var c = 0u; c < NV; c++) {
            q[c] = q_at(qb + c * VW) * p.scale;
        }
    }
    var run_max = NEG;
    var run_sum = 0.0;

    for (var k0 = 0u; k0 <= last; k0 += KT) {
        for (var e = lid; e < KT * NV; e += WG) {
            let j = k0 + e / NV;
            var kv = VT();
            var vv = VT();
            if (j <= last) {
                let at = cache_index(rt, j, g) + (e % NV) * VW;
                kv = k_at(at);
                vv = v_at(at);
            }
            ks[e] = kv;
            vs[e] = vv;
        }
        workgroupBarrier();
        if (live && k0 <= pos) {
            // Scores of the tile's visible keys, and their maximum.
            var s: array<f32, KT>;
            var m = run_max;
            for (var jj = 0u; jj < KT; jj++) {
                var d = VT();
                for (var c = 0u; c < NV; c++) {
                    d += q[c] * ks[jj * NV + c];
                }
                var v = NEG;
                if (k0 + jj <= pos) {
                    v = dot(d, VT(1.0));
                }
                s[jj] = v;
                m = max(m, v);
            }
            let a = exp(run_max - m);
            var l = run_sum * a;
            for (var c = 0u; c < NV; c++) {
                acc[c] *= a;
            }
            for (var jj = 0u; jj < KT; jj++) {
                if (k0 + jj <= pos) {
                    let e = exp(s[jj] - m);
                    l += e;
                    for (var c = 0u; c < NV; c++) {
                        acc[c] += e * vs[jj * NV + c];
                    }
                }
            }
            run_max = m;
            run_sum = l;
        }
        // Every invocation is done with the tile before the next load.
        workgroupBarrier();
    }

    if (live) {
        let ob = (first + rr) * p.q_heads * HEAD_DIM + h * HEAD_DIM;
        let inv = 1.0 / run_sum;
        for (var c = 0u; c < NV; c++) {
            let v = acc[c] * inv;
            for (var i = 0u; i < VW; i++) {
                att[ob + c * VW + i] = v[i];
            }
        }
    }
}
