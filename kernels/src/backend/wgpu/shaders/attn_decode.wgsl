// Paged attention for decode rows (and short chunks), split along the
// context (flash-decoding): one workgroup per (row, KV head, group of HG
// query heads of that KV head, context split). The host picks the number of
// splits from the work in the pass, so that one sequence's context spreads
// over many workgroups; with n_splits > 1 each workgroup writes its partial
// (unnormalised accumulator, max, sum) and attn_merge.wgsl combines them by
// the log-sum-exp rule. Each K and V row of the paged cache is read once for
// the HG query heads that share it (grouped-query attention).
//
// A split's positions are visited in tiles of TILE with an online softmax:
// 1. scores: one position per invocation, all HG heads, the K row read in
//    VT vectors (the query heads' rows wait in workgroup memory);
// 2. the tile's max and sum per head in parallel: R invocations per head
//    each fold a stride of the tile, then every invocation folds those R
//    partials itself (broadcast reads), so each holds the running max and
//    sum of every head privately and no invocation waits on a serial loop;
// 3. P V: invocations in NSLOT slots of LPS lanes; a slot's lanes read one
//    V row as consecutive vectors (CPL each) and each slot takes every
//    NSLOT-th position of the tile, holding HG accumulators per vector;
//    the rows' places in the cache come from step 1 through workgroup
//    memory, and UNROLL rows are loaded before any is used.
// The slots' accumulators are added (in slot order) once, at the end.
// Scores are double-buffered across tiles, so a tile needs three barriers.
//
// With `fold` set, the splits are merged here instead of by attn_merge.wgsl:
// each split's workgroup writes its partial, then counts itself in
// `counts` (one counter per row, KV head and head group); the workgroup
// that counts last merges every split of its HG heads and sets the counter
// back to 0 for the next dispatch. The partial writes are released, and
// the last workgroup's reads acquired, by storageBarrier (device-scope
// acquire-release in SPIR-V) around the device-scope atomic, and the host
// compiles `part` as @coherent where it folds (PART_DECORATION below), so
// no core's cache can serve the merging workgroup a line another split
// wrote since. No invocation waits on another workgroup, so nothing
// depends on workgroups running together. That saves a dispatch per layer.
//
// Specialised by the host, which prepends:
//   HEAD_DIM  head width
//   TILE      positions per tile
//   HG        query heads per workgroup (divides the group size)
//   VW, VT    vector width (4 where it divides HEAD_DIM, else 2) and type
//   NC        HEAD_DIM / VW, vectors per row
//   LPS       lanes per P V slot (min(NC, WG))
//   CPL       vectors per lane (ceil(NC / LPS))
//   NSLOT     P V slots (min(WG / LPS, 4))
//   R         invocations per head in the tile reductions (HG * R <= WG)
//   KCH       vectors of a K row loaded together before their dot products
//   OPI       output vectors per invocation in the folded merge
// No subgroup operations: any subgroup size works.

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
    fold: u32,      // 1: the last split's workgroup merges (see above)
    _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
// The cache as VT vectors: a K or V row is NC vector loads.
@group(0) @binding(2) var<storage, read> kc: array<VT>;
@group(0) @binding(3) var<storage, read> vc: array<VT>;
@group(0) @binding(4) var<storage, read_write> att: array<f32>;
// The host replaces PART_DECORATION with `@coherent` where the device has
// it, and with nothing where it does not (and then never folds).
@group(0) @binding(5) PART_DECORATION var<storage, read_write> part: array<f32>;
// Splits finished per (row, KV head, head group), for `fold`; 0 between
// dispatches.
@group(0) @binding(6) var<storage, read_write> counts: array<atomic<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 64u;
// V rows of the P V loop, and splits' partials in the folded merge, loaded
// this many at a time before any is used.
const UNROLL: u32 = 4u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<VT, HG * NC>;
// Scores, then their exponentials, and each position's cache row (the
// same for K and V); two tiles' worth (double-buffered).
var<workgroup> sc: array<f32, 2u * HG * TILE>;
var<workgroup> rows: array<u32, 2u * TILE>;
var<workgroup> red_max: array<f32, HG * R>;
var<workgroup> red_sum: array<f32, HG * R>;
// The accumulators of slots 1.. for slot 0 to add.
var<workgroup> slots: array<VT, OBUF_LEN>;
// Whether this workgroup counted last (`fold`).
var<workgroup> last_split: u32;

// The row of the cache, in vectors, holding position j of KV head g of the
// sequence whose block table starts at word rt of `plan`.
fn cache_row(rt: u32, j: u32, g: u32) -> u32 {
    let block = plan[rt + j / p.bs];
    return ((block * p.kv_heads + g) * p.bs + j % p.bs) * NC;
}

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
    // Uniform per workgroup, so the barriers below stay in uniform control.
    if (item >= p.n_items) {
        return;
    }
    let r = plan[p.dec_off + item];
    let ctx = plan[p.pos_off + r] + 1u;
    let rt = plan[p.rt_off + r];
    let j0 = min(ctx, split * p.split_len);
    let j1 = min(ctx, j0 + p.split_len);
    let h0 = g * p.group + hgp * HG;

    for (var e = lid; e < HG * NC; e += WG) {
        let h = e / NC;
        let at = r * p.stride + (h0 + h) * HEAD_DIM + (e % NC) * VW;
        var q: VT;
        for (var i = 0u; i < VW; i++) {
            q[i] = qkv[at + i] * p.scale;
        }
        qs[e] = q;
    }
    // Every invocation's private copy of each head's running max and sum.
    var run_max: array<f32, HG>;
    var run_sum: array<f32, HG>;
    for (var h = 0u; h < HG; h++) {
        run_max[h] = NEG;
    }
    let slot = lid / LPS;
    let lane = lid % LPS;
    var acc: array<VT, HG * CPL>;
    workgroupBarrier();

    var buf = 0u;
    for (var t0 = j0; t0 < j1; t0 += TILE) {
        let n = min(TILE, j1 - t0);
        let rb = buf * TILE;
        let sb = rb * HG;
        buf ^= 1u;
        if (lid < n) {
            let kb = cache_row(rt, t0 + lid, g);
            rows[rb + lid] = kb;
            var s: array<f32, HG>;
            // KCH vectors of the row loaded before any is used, so that
            // many loads are in flight rather than one dot product's.
            for (var c0 = 0u; c0 < NC; c0 += KCH) {
                var k: array<VT, KCH>;
                for (var i = 0u; i < KCH; i++) {
                    if (c0 + i < NC) {
                        k[i] = kc[kb + c0 + i];
                    }
                }
                for (var i = 0u; i < KCH; i++) {
                    if (c0 + i < NC) {
                        for (var h = 0u; h < HG; h++) {
                            s[h] += dot(qs[h * NC + c0 + i], k[i]);
                        }
                    }
                }
            }
            for (var h = 0u; h < HG; h++) {
                sc[sb + h * TILE + lid] = s[h];
            }
        }
        workgroupBarrier();
        // The tile's max per head: R invocations per head, then everyone.
        let rh = lid / R;
        let rr = lid % R;
        if (lid < HG * R) {
            var m = NEG;
            for (var jj = rr; jj < n; jj += R) {
                m = max(m, sc[sb + rh * TILE + jj]);
            }
            red_max[lid] = m;
        }
        workgroupBarrier();
        var new_max: array<f32, HG>;
        for (var h = 0u; h < HG; h++) {
            var m = run_max[h];
            for (var i = 0u; i < R; i++) {
                m = max(m, red_max[h * R + i]);
            }
            new_max[h] = m;
        }
        // Exponentials in place, and their sums per head the same way.
        if (lid < HG * R) {
            var l = 0.0;
            for (var jj = rr; jj < n; jj += R) {
                let e = exp(sc[sb + rh * TILE + jj] - new_max[rh]);
                sc[sb + rh * TILE + jj] = e;
                l += e;
            }
            red_sum[lid] = l;
        }
        workgroupBarrier();
        for (var h = 0u; h < HG; h++) {
            let a = exp(run_max[h] - new_max[h]);
            var l = run_sum[h] * a;
            for (var i = 0u; i < R; i++) {
                l += red_sum[h * R + i];
            }
            run_sum[h] = l;
            run_max[h] = new_max[h];
            for (var ci = 0u; ci < CPL; ci++) {
                acc[h * CPL + ci] *= a;
            }
        }
        if (slot < NSLOT) {
            // UNROLL positions at a time, their V loads issued together
            // before any is used, so a lane has that many in flight.
            for (var j = slot; j < n; j += UNROLL * NSLOT) {
                var v: array<VT, UNROLL * CPL>;
                for (var u = 0u; u < UNROLL; u++) {
                    let jj = j + u * NSLOT;
                    if (jj < n) {
                        for (var ci = 0u; ci < CPL; ci++) {
                            let c = lane + ci * LPS;
                            if (c < NC) {
                                v[u * CPL + ci] = vc[rows[rb + jj] + c];
                            }
                        }
                    }
                }
                for (var u = 0u; u < UNROLL; u++) {
                    let jj = j + u * NSLOT;
                    if (jj < n) {
                        for (var ci = 0u; ci < CPL; ci++) {
                            for (var h = 0u; h < HG; h++) {
                                acc[h * CPL + ci] += sc[sb + h * TILE + jj] * v[u * CPL + ci];
                            }
                        }
                    }
                }
            }
        }
        // No barrier here: the next tile writes the other score buffer, and
        // its first barrier comes before anyone rewrites this one.
    }

    if (NSLOT > 1u) {
        if (slot >= 1u && slot < NSLOT) {
            for (var i = 0u; i < HG * CPL; i++) {
                slots[((slot - 1u) * HG * CPL + i) * LPS + lane] = acc[i];
            }
        }
        workgroupBarrier();
        if (slot == 0u) {
            for (var s = 1u; s < NSLOT; s++) {
                for (var i = 0u; i < HG * CPL; i++) {
                    acc[i] += slots[((s - 1u) * HG * CPL + i) * LPS + lane];
                }
            }
        }
    }
    if (slot == 0u) {
        for (var h = 0u; h < HG; h++) {
            let qh = h0 + h;
            let pi = (item * p.q_heads + qh) * p.n_splits + split;
            for (var ci = 0u; ci < CPL; ci++) {
                let c = lane + ci * LPS;
                if (c < NC) {
                    var o = acc[h * CPL + ci];
                    var at = pi * HEAD_DIM + c * VW;
                    if (p.n_splits == 1u) {
                        o /= run_sum[h];
                        at = r * p.q_heads * HEAD_DIM + qh * HEAD_DIM + c * VW;
                    }
                    for (var i = 0u; i < VW; i++) {
                        if (p.n_splits == 1u) {
                            att[at + i] = o[i];
                        } else {
                            part[at + i] = o[i];
                        }
                    }
                }
            }
            if (p.n_splits > 1u && lane == 0u) {
                part[p.ml_off + pi * 2u] = run_max[h];
                part[p.ml_off + pi * 2u + 1u] = run_sum[h];
            }
        }
    }
    if (p.fold == 0u || p.n_splits == 1u) {
        return;
    }
    // This workgroup's partial, released before it is counted.
    storageBarrier();
    if (lid == 0u) {
        let done = atomicAdd(&counts[wid.x], 1u) + 1u;
        last_split = select(0u, 1u, done == p.n_splits);
    }
    if (workgroupUniformLoad(&last_split) == 0u) {
        return;
    }
    // Every split's partial, acquired.
    storageBarrier();
    fold_splits(item, r, h0, lid);
    if (lid == 0u) {
        atomicStore(&counts[wid.x], 0u);
    }
}

// The VT of partials at `at` in `part` (an f32 array: it also holds the
// (max, sum) pairs).
fn part_vector(at: u32) -> VT {
    var v: VT;
    for (var j = 0u; j < VW; j++) {
        v[j] = part[at + j];
    }
    return v;
}

// The merge of attn_merge.wgsl for the HG heads from h0 of decode row
// `item`, by the workgroup that finished last: out = sum_s acc_s w_s / L
// with w_s = e^(m_s - M), M = max_s m_s, L = sum_s l_s w_s.
fn fold_splits(item: u32, r: u32, h0: u32, lid: u32) {
    let ns = p.n_splits;
    // M and L per head: R invocations per head fold a stride of the
    // splits each (online, one pass over the (m, l) pairs); then every
    // invocation folds the R partials of every head.
    let rh = lid / R;
    let rr = lid % R;
    if (lid < HG * R) {
        let base = (item * p.q_heads + h0 + rh) * ns;
        var m = NEG;
        var l = 0.0;
        for (var s = rr; s < ns; s += R) {
            let ms = part[p.ml_off + (base + s) * 2u];
            let ls = part[p.ml_off + (base + s) * 2u + 1u];
            let mx = max(m, ms);
            l = l * exp(m - mx) + ls * exp(ms - mx);
            m = mx;
        }
        red_max[lid] = m;
        red_sum[lid] = l;
    }
    workgroupBarrier();
    var big_m: array<f32, HG>;
    var big_l: array<f32, HG>;
    for (var h = 0u; h < HG; h++) {
        var m = NEG;
        for (var i = 0u; i < R; i++) {
            m = max(m, red_max[h * R + i]);
        }
        var l = 0.0;
        for (var i = 0u; i < R; i++) {
            l += red_sum[h * R + i] * exp(red_max[h * R + i] - m);
        }
        big_m[h] = m;
        big_l[h] = l;
    }
    // The splits' weights, 2 * TILE at a time (the score buffers' room),
    // then each invocation's output vectors summed over them, UNROLL
    // splits' partials loaded before any is used (one memory round trip
    // for them, not one per split; the sum still runs in split order).
    var o: array<VT, OPI>;
    for (var s0 = 0u; s0 < ns; s0 += 2u * TILE) {
        let chunk = min(2u * TILE, ns - s0);
        workgroupBarrier(); // the previous chunk's weights are read
        for (var e = lid; e < HG * chunk; e += WG) {
            let h = e / chunk;
            let s = s0 + e % chunk;
            let pi = (item * p.q_heads + h0 + h) * ns + s;
            sc[h * 2u * TILE + e % chunk] = exp(part[p.ml_off + pi * 2u] - big_m[h]);
        }
        workgroupBarrier();
        for (var i = 0u; i < OPI; i++) {
            let e = lid + i * WG;
            if (e < HG * NC) {
                let h = e / NC;
                let c = e % NC;
                let pi0 = (item * p.q_heads + h0 + h) * ns + s0;
                var a = o[i];
                var s = 0u;
                for (; s + UNROLL <= chunk; s += UNROLL) {
                    var v: array<VT, UNROLL>;
                    for (var u = 0u; u < UNROLL; u++) {
                        v[u] = part_vector((pi0 + s + u) * HEAD_DIM + c * VW);
                    }
                    for (var u = 0u; u < UNROLL; u++) {
                        a += v[u] * sc[h * 2u * TILE + s + u];
                    }
                }
                for (; s < chunk; s++) {
                    a += part_vector((pi0 + s) * HEAD_DIM + c * VW) * sc[h * 2u * TILE + s];
                }
                o[i] = a;
            }
        }
    }
    for (var i = 0u; i < OPI; i++) {
        let e = lid + i * WG;
        if (e < HG * NC) {
            let h = e / NC;
            let c = e % NC;
            let at = r * p.q_heads * HEAD_DIM + (h0 + h) * HEAD_DIM + c * VW;
            let v = o[i] / big_l[h];
            for (var j = 0u; j < VW; j++) {
                att[at + j] = v[j];
            }
        }
    }
}
