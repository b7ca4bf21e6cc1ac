// Rotary position embedding, Hugging Face `rotate_half` convention: in every
// head, element i pairs with i + head_dim / 2. Rotates the query heads and
// the key heads of each row of the fused q|k|v buffer in place. The cos/sin of
// each row's position come from the host (computed in f64 from the same
// inverse frequencies as the CPU backend, Llama 3 scaling included), so long
// positions lose no precision to an f32 angle.
//
// One invocation per (row, head, pair).

struct Params {
    n_rows: u32, // rows in this pass
    heads: u32,  // query heads + KV heads (the rotated heads, contiguous)
    half: u32,   // head_dim / 2
    stride: u32, // width of a q|k|v row
    cs_off: u32, // word offset of cos[n_rows][half] (f32 bits) in `plan`
    sn_off: u32, // word offset of sin[n_rows][half]
    _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let id = (wid.x + wid.y * nwg.x) * 256u + lid;
    let per_row = p.heads * p.half;
    if (id >= p.n_rows * per_row) {
        return;
    }
    let r = id / per_row;
    let rem = id % per_row;
    let head = rem / p.half;
    let i = rem % p.half;
    let c = bitcast<f32>(plan[p.cs_off + r * p.half + i]);
    let s = bitcast<f32>(plan[p.sn_off + r * p.half + i]);
    let base = r * p.stride + head * 2u * p.half;
    let u = qkv[base + i];
    let v = qkv[base + i + p.half];
    qkv[base + i] = u * c - v * s;
    qkv[base + i + p.half] = v * c + u * s;
}
