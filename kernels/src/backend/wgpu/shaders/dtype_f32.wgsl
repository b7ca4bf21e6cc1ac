// Weight prelude: the tensor is stored as f32.
// Every kernel that reads weights declares them at @group(0) @binding(1)
// through one of these preludes (dtype_*.wgsl, followed by weights.wgsl)
// and reads element `i` with `w_at(i)`, or the eight elements from `i` (a
// multiple of 8) with `w_load8(i)`.

@group(0) @binding(1) var<storage, read> w: array<f32>;

fn w_at(i: u32) -> f32 {
    return w[i];
}

fn w_load8(i: u32) -> W8 {
    return W8(
        vec4<f32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]),
        vec4<f32>(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]),
    );
}
