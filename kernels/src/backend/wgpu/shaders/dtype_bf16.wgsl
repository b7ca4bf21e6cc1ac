// Weight prelude: the tensor is stored as bf16, two values packed per u32
// (element 2j in the low half, 2j + 1 in the high half, as in the file). A
// bf16 value is the top half of an f32, so widening is a shift. Read as
// vec4<u32> (8 values, one 16-byte load for `w_load8`; every weight buffer
// is a whole number of 16-byte words).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;

fn w_at(i: u32) -> f32 {
    let word = w[i >> 3u][(i >> 1u) & 3u];
    let bits = select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u);
    return bitcast<f32>(bits);
}

fn bf16x2(word: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(word << 16u, word & 0xffff0000u));
}

fn w_load8(i: u32) -> W8 {
    let q = w[i >> 3u];
    return W8(
        vec4<f32>(bf16x2(q.x), bf16x2(q.y)),
        vec4<f32>(bf16x2(q.z), bf16x2(q.w)),
    );
}
