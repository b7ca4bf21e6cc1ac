// Writes each row's K and V into the paged KV cache of one layer through the
// step's slot mapping: slot = block * block_size + offset, and within a block
// the layout is [kv_head][slot][head_dim] (the CPU backend's layout).
//
// One invocation per (row, KV head, element).

struct Params {
    n_rows: u32,   // rows in this pass
    kv_heads: u32, // KV heads
    hd: u32,       // head_dim
    bs: u32,       // block size
    stride: u32,   // width of a q|k|v row
    slot_off: u32, // word offset of the rows' slots in `plan`
    k_off: u32,    // offset of K in a q|k|v row (query heads * head_dim)
    _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let id = (wid.x + wid.y * nwg.x) * 256u + lid;
    let width = p.kv_heads * p.hd;
    if (id >= p.n_rows * width) {
        return;
    }
    let r = id / width;
    let e = id % width;
    let g = e / p.hd;
    let d = e % p.hd;
    let slot = plan[p.slot_off + r];
    let block = slot / p.bs;
    let off = slot % p.bs;
    let dst = ((block * p.kv_heads + g) * p.bs + off) * p.hd + d;
    let src = r * p.stride + p.k_off + e;
    kc[dst] = qkv[src];
    vc[dst] = qkv[src + width];
}
