// Weight prelude: Q2_K, super-blocks of 256 values as 21 words (the file's
// 84 bytes): 16 bytes of sub-block scales (low nibble) and minimums (high
// nibble), one per 16 values; 64 bytes of 2-bit values; f16 d and dmin in
// word 20. Value t = 128 h + 32 j + k (k < 32) is bits 2j of byte
// 16 + 32 h + k (Q3_K's pairs). Value = (d * sc) * q - dmin * m.

const BLOCK_WORDS: u32 = 21u;

// Where value i lives: the word holding its byte (and the next 3), the
// shift of its 2 bits, and its sub-block's scale (d * sc) and offset
// (dmin * m).
struct Q2kAt {
    word: u32,
    shift: u32,
    scale: f32,
    minv: f32,
}

fn q2k_at(i: u32) -> Q2kAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let h = t >> 7u;
    let j = (t >> 5u) & 3u;
    let k = t & 31u;
    let sc = w_byte(4u * base + (t >> 4u));
    let dd = unpack2x16float(w[base + 20u]);
    return Q2kAt(
        base + 4u + 8u * h + (k >> 2u),
        2u * j,
        dd.x * f32(sc & 15u),
        dd.y * f32(sc >> 4u),
    );
}

// The 2-bit values at `shift` of the four bytes of `word`.
fn q2k_quads(word: u32, shift: u32) -> vec4<f32> {
    let v = vec4<u32>(word, word >> 8u, word >> 16u, word >> 24u) >> vec4<u32>(shift);
    return vec4<f32>(v & vec4<u32>(3u));
}

fn w_at(i: u32) -> f32 {
    let a = q2k_at(i);
    let q = (w[a.word] >> (8u * (i & 3u) + a.shift)) & 3u;
    return a.scale * f32(q) - a.minv;
}

fn w_load8(i: u32) -> W8 {
    let a = q2k_at(i);
    return W8(
        a.scale * q2k_quads(w[a.word], a.shift) - a.minv,
        a.scale * q2k_quads(w[a.word + 1u], a.shift) - a.minv,
    );
}
