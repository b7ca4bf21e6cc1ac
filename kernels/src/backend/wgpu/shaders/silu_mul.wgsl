// SwiGLU activation: act[r, i] = silu(gate[r, i]) * up[r, i], where each row
// of `gu` is gate (inter values) followed by up (inter values): the fused
// gate|up projection's output.
//
// One invocation per output element.

struct Params {
    n_rows: u32, // rows
    inter: u32,  // intermediate size
    _p2: u32, _p3: u32,
    _p4: u32, _p5: u32, _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let id = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (id >= p.n_rows * p.inter) {
        return;
    }
    let r = id / p.inter;
    let i = id % p.inter;
    let g = gu[r * 2u * p.inter + i];
    let u = gu[r * 2u * p.inter + p.inter + i];
    act[id] = g / (1.0 + exp(-g)) * u;
}
