// Weight prelude: Q4_K, super-blocks of 256 values as 36 words (the file's
// 144 bytes): f16 d and dmin, 12 bytes of 6-bit sub-block scales and
// minimums (8 sub-blocks of 32), then 128 bytes of nibbles. Group g (0..4)
// of 64 values uses bytes 32g..32g+32: low nibbles for its first 32 values
// (sub-block 2g), high nibbles for the next 32 (sub-block 2g + 1). Value
// = (d * scale) * q - dmin * min.

const BLOCK_WORDS: u32 = 36u;

// Where value i lives: the word holding its byte (and the next 3), the
// nibble's shift, and its sub-block's scale (d * sc) and offset (dmin * m).
struct Q4kAt {
    word: u32,
    shift: u32,
    scale: f32,
    minv: f32,
}

fn q4k_at(i: u32) -> Q4kAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let g = t >> 6u;
    let h = (t >> 5u) & 1u;
    let dd = unpack2x16float(w[base]);
    let sm = q4k_scale_min(base, 2u * g + h);
    return Q4kAt(base + 4u + 8u * g + ((t & 31u) >> 2u), 4u * h, dd.x * sm.x, dd.y * sm.y);
}

fn w_at(i: u32) -> f32 {
    let a = q4k_at(i);
    let q = (w[a.word] >> (8u * (i & 3u) + a.shift)) & 15u;
    return a.scale * f32(q) - a.minv;
}

fn w_load8(i: u32) -> W8 {
    let a = q4k_at(i);
    return W8(
        a.scale * nib4(w[a.word], a.shift) - a.minv,
        a.scale * nib4(w[a.word + 1u], a.shift) - a.minv,
    );
}
