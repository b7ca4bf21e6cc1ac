// Embedding gather: x[r, :] = E[token[r], :] for the rows whose token falls in
// this chunk of the table (vocabulary rows row0 .. row0 + chunk_rows). A table
// larger than one storage binding is split into row chunks, one dispatch each.
//
// One workgroup per token row. The weight prelude (dtype_*.wgsl) supplies
// `w` (binding 1) and `w_at`.

struct Params {
    h: u32,          // hidden size
    n_rows: u32,     // token rows in this pass
    tok_off: u32,    // word offset of the token ids in `plan`
    row0: u32,       // first vocabulary row held by this chunk
    chunk_rows: u32, // vocabulary rows held by this chunk
    _p5: u32, _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;

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
    let tok = plan[p.tok_off + r];
    if (tok < p.row0 || tok >= p.row0 + p.chunk_rows) {
        return;
    }
    let src = (tok - p.row0) * p.h;
    for (var i = lid; i < p.h; i += WG) {
        x[r * p.h + i] = w_at(src + i);
    }
}
