// Weight prelude: Q3_K, super-blocks of 256 values as 28 words (the file's
// 110 bytes and 2 bytes of padding): 32 bytes hmask (third bits), 64 bytes
// qs (2-bit pairs), 12 bytes of sixteen 6-bit scales, f16 d at byte 108.
// Value t = 128 h + 32 j + k (k < 32) is bits 2j of qs[32 h + k] with bit
// 4 h + j of hmask[k] as its third; its sub-block t / 16 keeps its scale's
// low 4 bits in a nibble of byte (t / 16) % 8 (the high nibble from
// sub-block 8) and its top 2 in bits 2 ((t / 16) / 4) of byte 8 + (t / 16) % 4.
// Value = (d * (scale - 32)) * (q - 4).

const BLOCK_WORDS: u32 = 28u;

// Where value i lives: the words holding its qs and hmask bytes (and the
// next 3 of each), the shifts of its pair and third bit, and its
// sub-block's scale d * (sc - 32).
struct Q3kAt {
    qs: u32,
    hm: u32,
    pair_shift: u32,
    third_shift: u32,
    scale: f32,
}

fn q3k_at(i: u32) -> Q3kAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let h = t >> 7u;
    let j = (t >> 5u) & 3u;
    let k = t & 31u;
    let g = t >> 4u;
    let scales = 4u * base + 96u;
    let low = (w_byte(scales + (g & 7u)) >> (4u * (g >> 3u))) & 15u;
    let high = (w_byte(scales + 8u + (g & 3u)) >> (2u * (g >> 2u))) & 3u;
    let d = unpack2x16float(w[base + 27u]).x;
    return Q3kAt(
        base + 8u + 8u * h + (k >> 2u),
        base + (k >> 2u),
        2u * j,
        4u * h + j,
        d * f32(i32(low | (high << 4u)) - 32),
    );
}

// The four values of the bytes of `qs` and `hm` (pairs at `pair_shift`,
// third bits at `third_shift`), less their offset of 4.
fn q3k_quads(qs: u32, hm: u32, a: Q3kAt) -> vec4<f32> {
    let pair = (vec4<u32>(qs, qs >> 8u, qs >> 16u, qs >> 24u) >> vec4<u32>(a.pair_shift)) & vec4<u32>(3u);
    let third = (vec4<u32>(hm, hm >> 8u, hm >> 16u, hm >> 24u) >> vec4<u32>(a.third_shift)) & vec4<u32>(1u);
    return vec4<f32>(pair | (third << vec4<u32>(2u))) - 4.0;
}

fn w_at(i: u32) -> f32 {
    let a = q3k_at(i);
    let shift = 8u * (i & 3u);
    let pair = (w[a.qs] >> (shift + a.pair_shift)) & 3u;
    let third = (w[a.hm] >> (shift + a.third_shift)) & 1u;
    return a.scale * (f32(pair | (third << 2u)) - 4.0);
}

fn w_load8(i: u32) -> W8 {
    let a = q3k_at(i);
    return W8(
        a.scale * q3k_quads(w[a.qs], w[a.hm], a),
        a.scale * q3k_quads(w[a.qs + 1u], w[a.hm + 1u], a),
    );
}
