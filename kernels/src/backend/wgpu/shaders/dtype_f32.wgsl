// Weight prelude: the tensor is stored as f32.
// Every kernel that reads weights declares them at @group(0) @binding(1)
// through one of these preludes (dtype_*.wgsl, followed by weights.wgsl)
// and reads element `i` with `w_at(i)`, or the eight elements from `i` (a
// multiple of 8) with `w_load8(i)`. Float weights are declared as vectors,
// so `w_load8` is one or two wide loads; every weight buffer is a whole
// number of 16-byte words.

@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

fn w_at(i: u32) -> f32 {
    return w[i >> 2u][i & 3u];
}

fn w_load8(i: u32) -> W8 {
    return W8(w[i >> 2u], w[(i >> 2u) + 1u]);
}
