// Weight prelude: the tensor is stored as f16 and read natively, on devices
// with the `shader-f16` feature (the `enable` line has to open the module,
// so this prelude comes first).
enable f16;

@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;

fn w_at(i: u32) -> f32 {
    return f32(w[i >> 2u][i & 3u]);
}

fn w_load8(i: u32) -> W8 {
    return W8(vec4<f32>(w[i >> 2u]), vec4<f32>(w[(i >> 2u) + 1u]));
}
