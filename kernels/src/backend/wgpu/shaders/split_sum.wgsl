// The second half of a split-k product (coop_mat_mul.wgsl with p.splits >
// 1): one invocation per (token m, chunk row n) adds the splits' partial
// sums in split order, then the bias and, for a residual add, y's value,
// and writes y. The grid is context::grid's (up to 65,535 workgroups of
// 256 per row of the grid).

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
    splits: u32,   // partial products in `part`
    k_len: u32,    // k values per split
    m_groups: u32, // token tiles
    fold: u32,     // 1 = the last split sums the splits (coop_mat_mul.wgsl)
    part_n: u32,   // rows of a split's partials (padded to whole tiles)
    part_m: u32,   // tokens of a split's partials (padded to whole tiles)
}

@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    let plane = p.m * p.rows;
    if (i >= plane) {
        return;
    }
    let m = i / p.rows;
    let n = i % p.rows;
    var v = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        v += part[(z * p.part_m + m) * p.part_n + n];
    }
    store_y(m, n, v);
}
