// Weight prelude: the tensor is stored as f16, two values packed per u32
// (element 2j in the low half, 2j + 1 in the high half, as in the file),
// widened to f32 here. Needs no device feature. Read as vec4<u32> (8 values,
// one 16-byte load for `w_load8`; every weight buffer is a whole number of
// 16-byte words).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;

fn w_at(i: u32) -> f32 {
    return unpack2x16float(w[i >> 3u][(i >> 1u) & 3u])[i & 1u];
}

fn w_load8(i: u32) -> W8 {
    let q = w[i >> 3u];
    return W8(
        vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)),
        vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)),
    );
}
