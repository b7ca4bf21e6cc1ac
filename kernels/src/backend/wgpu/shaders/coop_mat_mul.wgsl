// Matrix multiply on cooperative matrices (the GPU's matrix units), for
// prefill and wide decode batches: Y[m, row0 + n] = X[m, :] . W[n, :] (+ b)
// for m < M tokens and n < rows of this weight chunk, with the parameters of
// mat_mul.wgsl. W is row-major [rows, k]; the weight prelude (dtype_*.wgsl)
// supplies `w_at` and `w_load8`.
//
// coop.rs prepends: S (fragment side, 8 or 16), SG (the subgroup size), GN
// x GM (the grid of subgroups over the tile, rows by tokens), FN x FM (the
// fragments each subgroup multiplies), WG (GN GM subgroups), TN = GN FN S
// and TM = GM FM S (weight rows and tokens per workgroup), BK (k values
// per slab), LOADS_W and LOADS_X (8-value loads of the weight and the x
// tile per invocation and slab), and
// the fragment types FragA / FragB (f16) and FragC (f32); and it writes
// out the per-fragment code where main's three markers stand (the
// accumulators c_i_j; one k step: FN A and FM B fragments loaded, FN FM
// multiply-adds; every accumulator written out), since WGSL has no arrays
// of cooperative matrices.
//
// Per slab of BK k values, every invocation loads LOADS_W runs of 8 weights
// and LOADS_X of 8 x values (issued before the previous slab's multiply, so their
// latency hides behind it), rounds them to f16 and stores them into
// workgroup memory: weights as [row][k] (fragment A, row-major), x as
// [token][k] (fragment B, column-major), both with stride LDS = BK + 8:
// the 16 bytes of padding put the fragment rows that a load reads
// together in different memory banks, and keep every row 16-byte aligned
// (as cooperative loads require). The subgroups form a GN x GM grid over
// the tile; each multiplies FN x FM fragments of side S, accumulating in
// f32, every A fragment it loads feeding FM multiply-adds and every B
// fragment FN. At the end each subgroup stores
// its fragments one at a time into its own S x S corner of workgroup
// memory, and its invocations add the bias and the residual and write the
// rows of y (consecutive invocations, consecutive rows).
//
// Split k (p.splits > 1, for products of too few tiles to keep the GPU
// busy): split z of workgroup_id.y's splits multiplies k values
// z * k_len .. (z + 1) * k_len only and stores its plain partial sums into
// `part` ([split][token][row], a split's rows and tokens padded to whole
// tiles: p.part_n x p.part_m), each fragment stored straight from the
// matrix unit. Then either split_sum.wgsl adds the splits,
// the bias and the residual into y in a second dispatch, or (p.fold = 1)
// the split whose workgroup finishes last does it, in the same fixed order
// either way (the same result every run, whichever finishes last): each
// split's workgroup releases its partials (storageBarrier, a device-scope
// barrier in naga's SPIR-V), counts itself in its tile's counter, and the
// one that brings it to p.splits acquires every split's partials (`part`
// is @coherent, without which the host does not fold), sums them into y
// and sets the counter back to zero for the next dispatch. No workgroup
// waits for another.
//
// Fragments are per subgroup: subgroup j is taken to be the invocations
// j * SG .. (j + 1) * SG - 1, as Vulkan drivers lay out one-dimensional
// workgroups (the split-row mat-vec assumes the same), and coop.rs uses
// this kernel only where the subgroup size is fixed.

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
    splits: u32,   // k splits: 1, or partial products into `part`
    k_len: u32,    // k values per split (a multiple of BK)
    m_groups: u32, // token tiles (workgroup_id.y = split * m_groups + tile)
    fold: u32,     // 1 = the split that finishes last sums the splits
    part_n: u32,   // rows of a split's partials (padded to whole tiles)
    part_m: u32,   // tokens of a split's partials (padded to whole tiles)
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// The host replaces PART_DECORATION with `@coherent` where the device has
// coherent storage buffers, which the folded sum needs (see below).
@group(0) @binding(4) PART_DECORATION var<storage, read_write> part: array<f32>;
// The folded sum's counters, one per output tile: zero between dispatches.
@group(0) @binding(5) var<storage, read_write> counts: array<atomic<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

// Runs of 8 k values per tile row.
const RUNS: u32 = BK / 8u;
// Stride between the tiles' rows, in f16 values.
const LDS: u32 = BK + 8u;

var<workgroup> ws: array<f16, TN * LDS>;
var<workgroup> xs: array<f16, TM * LDS>;
// One S x S result fragment per subgroup, column-major (token-major).
var<workgroup> cs: array<f32, GN * GM * S * S>;
// 1 in the workgroup that counted its tile's last split.
var<workgroup> last_split: u32;

// load_w and load_x: tile_loads.wgsl; store_y: y_store.wgsl; both
// appended to this file.

// Stores 8 values, rounded to f16, at `at` of a tile.
fn put_w(at: u32, v: W8) {
    let lo = vec4<f16>(v.lo);
    let hi = vec4<f16>(v.hi);
    for (var j = 0u; j < 4u; j++) {
        ws[at + j] = lo[j];
        ws[at + 4u + j] = hi[j];
    }
}

fn put_x(at: u32, v: W8) {
    let lo = vec4<f16>(v.lo);
    let hi = vec4<f16>(v.hi);
    for (var j = 0u; j < 4u; j++) {
        xs[at + j] = lo[j];
        xs[at + 4u + j] = hi[j];
    }
}

// Writes fragment `c` of subgroup `sub` (weight rows n0.., tokens m0..)
// into split z's partials, whose padded planes hold every fragment whole
// (no bounds, no barrier), or else into y through the subgroup's corner of
// `cs`, within the rows and tokens.
fn emit(c: FragC, sub: u32, lane: u32, n0: u32, m0: u32, z: u32) {
    if (p.splits > 1u) {
        // (Index and stride as lets: with them written inside the call,
        // naga 30's SPIR-V writer panics, "Expression [25] is not cached".)
        let stride = p.part_n;
        let at = (z * p.part_m + m0) * stride + n0;
        coopStore(c, &part[at], stride);
        return;
    }
    let corner = sub * S * S;
    coopStore(c, &cs[corner], S);
    workgroupBarrier();
    for (var e = lane; e < S * S; e += SG) {
        let n = n0 + e % S;
        let m = m0 + e / S;
        if (n < p.rows && m < p.m) {
            store_y(m, n, cs[corner + e]);
        }
    }
    // The next fragment reuses the corner.
    workgroupBarrier();
}

// The splits' partial sums of the tile at (n_tile, m_tile), in split
// order, with the bias and the residual, into y: what split_sum.wgsl does
// for the whole product.
fn sum_splits(n_tile: u32, m_tile: u32, lid: u32) {
    for (var e = lid; e < TN * TM; e += WG) {
        let n = n_tile + e % TN;
        let m = m_tile + e / TN;
        if (n < p.rows && m < p.m) {
            var v = 0.0;
            for (var z = 0u; z < p.splits; z++) {
                v += part[(z * p.part_m + m) * p.part_n + n];
            }
            store_y(m, n, v);
        }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n_tile = wid.x * TN;
    let z = wid.y / p.m_groups;
    let m_tile = (wid.y % p.m_groups) * TM;
    let k_lo = z * p.k_len;
    let k_hi = min(p.k, k_lo + p.k_len);
    let sub = lid / SG;
    let lane = lid % SG;
    // This subgroup's FN S x FM S corner of the tile.
    let sn = (sub % GN) * FN * S;
    let sm = (sub / GN) * FM * S;
    FRAG_DECLS
    var wv: array<W8, LOADS_W>;
    var xv: array<W8, LOADS_X>;
    for (var u = 0u; u < LOADS_W; u++) {
        let i = lid + u * WG;
        wv[u] = load_w(n_tile + i / RUNS, k_lo + 8u * (i % RUNS));
    }
    for (var u = 0u; u < LOADS_X; u++) {
        let i = lid + u * WG;
        xv[u] = load_x(m_tile + i / RUNS, k_lo + 8u * (i % RUNS));
    }
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        for (var u = 0u; u < LOADS_W; u++) {
            let i = lid + u * WG;
            put_w((i / RUNS) * LDS + 8u * (i % RUNS), wv[u]);
        }
        for (var u = 0u; u < LOADS_X; u++) {
            let i = lid + u * WG;
            put_x((i / RUNS) * LDS + 8u * (i % RUNS), xv[u]);
        }
        workgroupBarrier();
        let next = k0 + BK;
        if (next < k_hi) {
            for (var u = 0u; u < LOADS_W; u++) {
                let i = lid + u * WG;
                wv[u] = load_w(n_tile + i / RUNS, next + 8u * (i % RUNS));
            }
            for (var u = 0u; u < LOADS_X; u++) {
                let i = lid + u * WG;
                xv[u] = load_x(m_tile + i / RUNS, next + 8u * (i % RUNS));
            }
        }
        for (var kk = 0u; kk < BK; kk += S) {
            FRAG_MMAS
        }
        // Every fragment is read before the next slab overwrites the tiles.
        workgroupBarrier();
    }
    FRAG_EMITS
    if (p.splits == 1u || p.fold == 0u) {
        return;
    }
    // This split's partials, released before it is counted.
    storageBarrier();
    let tile = (wid.y % p.m_groups) * groups.x + wid.x;
    if (lid == 0u) {
        let done = atomicAdd(&counts[tile], 1u) + 1u;
        last_split = select(0u, 1u, done == p.splits);
    }
    if (workgroupUniformLoad(&last_split) == 0u) {
        return;
    }
    // Every split's partials, acquired.
    storageBarrier();
    sum_splits(n_tile, m_tile, lid);
    if (lid == 0u) {
        atomicStore(&counts[tile], 0u);
    }
}
