// Paged attention for decode rows (and short chunks): one workgroup per
// (row, KV head, group of HG query heads of that KV head, context split).
// Each K and V row of the paged cache is read once for the HG query heads
// that share it (grouped-query attention). Positions are visited in tiles of
// TILE with an online softmax (running max, running sum, rescaled
// accumulator). Long contexts are split along the positions: with
// n_splits > 1 each workgroup writes its partial (accumulator, max, sum) and
// attn_merge.wgsl combines them.
//
// Specialised by the host, which prepends:
//   HEAD_DIM  head width
//   HG        query heads per workgroup (divides the group size)
//   QS_LEN    HG * HEAD_DIM
//   SC_LEN    HG * TILE
//   OPT       ceil(QS_LEN / WG), accumulator elements per invocation
// Reductions are serial loops or workgroup memory: no subgroup operations.
// Each K row is loaded once (as vec4s where 4 divides HEAD_DIM) for all HG
// heads' scores.

struct Params {
    n_items: u32,   // decode rows in this pass
    dec_off: u32,   // word offset of the decode rows (pass-local row ids) in `plan`
    pos_off: u32,   // word offset of the rows' positions
    rt_off: u32,    // word offset of the rows' block-table offsets
    kv_heads: u32,  // KV heads
    group: u32,     // query heads per KV head
    stride: u32,    // width of a q|k|v row
    q_heads: u32,   // query heads
    bs: u32,        // block size
    split_len: u32, // positions per split
    n_splits: u32,  // splits along the context
    scale: f32,     // 1 / sqrt(head_dim)
    ml_off: u32,    // offset of the (max, sum) pairs in `part`
    hgroups: u32,   // group / HG
    _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
// The cache as vec4s (its buffers are whole 16-byte words): a K row is
// HEAD_DIM / 4 vector loads where 4 divides the head width.
@group(0) @binding(2) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> att: array<f32>;
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 64u;
const TILE: u32 = 64u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<f32, QS_LEN>;
var<workgroup> sc: array<f32, SC_LEN>;
var<workgroup> run_max: array<f32, HG>;
var<workgroup> run_sum: array<f32, HG>;
var<workgroup> rescale: array<f32, HG>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let per_item = p.kv_heads * p.hgroups;
    let item = wid.x / per_item;
    let g = (wid.x % per_item) / p.hgroups;
    let hgp = wid.x % p.hgroups;
    let split = wid.y;
    if (item >= p.n_items) {
        return;
    }
    let r = plan[p.dec_off + item];
    let ctx = plan[p.pos_off + r] + 1u;
    let rt = plan[p.rt_off + r];
    let j0 = min(ctx, split * p.split_len);
    let j1 = min(ctx, j0 + p.split_len);
    let h0 = g * p.group + hgp * HG;

    for (var e = lid; e < QS_LEN; e += WG) {
        let h = e / HEAD_DIM;
        let d = e % HEAD_DIM;
        qs[e] = qkv[r * p.stride + (h0 + h) * HEAD_DIM + d] * p.scale;
    }
    if (lid < HG) {
        run_max[lid] = NEG;
        run_sum[lid] = 0.0;
    }
    var acc: array<f32, OPT>;
    workgroupBarrier();

    for (var t0 = j0; t0 < j1; t0 += TILE) {
        let n = min(TILE, j1 - t0);
        // Scores: one position per invocation, HG heads each.
        if (lid < n) {
            let j = t0 + lid;
            let block = plan[rt + j / p.bs];
            let kb = ((block * p.kv_heads + g) * p.bs + j % p.bs) * HEAD_DIM;
            var s: array<f32, HG>;
            if (HEAD_DIM % 4u == 0u) {
                for (var d = 0u; d < HEAD_DIM; d += 4u) {
                    let k4 = kc[(kb + d) >> 2u];
                    for (var h = 0u; h < HG; h++) {
                        let q = h * HEAD_DIM + d;
                        s[h] += dot(vec4<f32>(qs[q], qs[q + 1u], qs[q + 2u], qs[q + 3u]), k4);
                    }
                }
            } else {
                for (var d = 0u; d < HEAD_DIM; d++) {
                    let kv = kc[(kb + d) >> 2u][(kb + d) & 3u];
                    for (var h = 0u; h < HG; h++) {
                        s[h] += qs[h * HEAD_DIM + d] * kv;
                    }
                }
            }
            for (var h = 0u; h < HG; h++) {
                sc[h * TILE + lid] = s[h];
            }
        }
        workgroupBarrier();
        // Online softmax update, one invocation per head.
        if (lid < HG) {
            let h = lid;
            var m = run_max[h];
            for (var jj = 0u; jj < n; jj++) {
                m = max(m, sc[h * TILE + jj]);
            }
            let a = exp(run_max[h] - m);
            var l = run_sum[h] * a;
            for (var jj = 0u; jj < n; jj++) {
                let e = exp(sc[h * TILE + jj] - m);
                sc[h * TILE + jj] = e;
                l += e;
            }
            run_max[h] = m;
            run_sum[h] = l;
            rescale[h] = a;
        }
        workgroupBarrier();
        // Accumulate P V: adjacent invocations read adjacent elements of V.
        for (var o = 0u; o < OPT; o++) {
            let e = lid + o * WG;
            if (e < QS_LEN) {
                let h = e / HEAD_DIM;
                let d = e % HEAD_DIM;
                var a = acc[o] * rescale[h];
                for (var jj = 0u; jj < n; jj++) {
                    let j = t0 + jj;
                    let block = plan[rt + j / p.bs];
                    let vb = ((block * p.kv_heads + g) * p.bs + j % p.bs) * HEAD_DIM;
                    a += sc[h * TILE + jj] * vc[(vb + d) >> 2u][(vb + d) & 3u];
                }
                acc[o] = a;
            }
        }
        workgroupBarrier();
    }

    for (var o = 0u; o < OPT; o++) {
        let e = lid + o * WG;
        if (e < QS_LEN) {
            let h = e / HEAD_DIM;
            let d = e % HEAD_DIM;
            let qh = h0 + h;
            if (p.n_splits == 1u) {
                att[r * p.q_heads * HEAD_DIM + qh * HEAD_DIM + d] = acc[o] / run_sum[h];
            } else {
                let pi = (item * p.q_heads + qh) * p.n_splits + split;
                part[pi * HEAD_DIM + d] = acc[o];
                if (d == 0u) {
                    part[p.ml_off + pi * 2u] = run_max[h];
                    part[p.ml_off + pi * 2u + 1u] = run_sum[h];
                }
            }
        }
    }
}
