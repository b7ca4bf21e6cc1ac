// Weight prelude: the tensor is stored as f16, two values packed per u32
// (element 2j in the low half, 2j + 1 in the high half, as in the file),
// widened to f32 here. Needs no device feature.

@group(0) @binding(1) var<storage, read> w: array<u32>;

fn w_at(i: u32) -> f32 {
    return unpack2x16float(w[i >> 1u])[i & 1u];
}

fn w_load8(i: u32) -> W8 {
    let o = i >> 1u;
    return W8(
        vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u])),
        vec4<f32>(unpack2x16float(w[o + 2u]), unpack2x16float(w[o + 3u])),
    );
}
