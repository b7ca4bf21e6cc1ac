// Weight prelude: IQ4_XS, super-blocks of 256 values as 34 words (the
// file's 136 bytes): f16 d and the u16 scales_h in word 0, the 4 bytes of
// scales_l in word 1, then 128 bytes of nibbles, 16 per sub-block of 32
// laid out as an IQ4_NL block's. Sub-block j's 6-bit scale has its low 4
// bits at bit 4 j of word 1 and its top 2 at bit 16 + 2 j of word 0.
// Value = (d * (scale - 32)) * table[q].

const BLOCK_WORDS: u32 = 34u;

// Where value i lives: the word holding its byte (and the next 3), the
// nibble's shift, and its sub-block's scale d * (sc - 32).
struct Iq4xsAt {
    word: u32,
    shift: u32,
    scale: f32,
}

fn iq4xs_at(i: u32) -> Iq4xsAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let j = t >> 5u;
    let k = t & 31u;
    let head = w[base];
    let low = (w[base + 1u] >> (4u * j)) & 15u;
    let high = (head >> (16u + 2u * j)) & 3u;
    let d = unpack2x16float(head).x;
    return Iq4xsAt(
        base + 2u + 4u * j + ((k & 15u) >> 2u),
        (k >> 4u) * 4u,
        d * f32(i32(low | (high << 4u)) - 32),
    );
}

fn w_at(i: u32) -> f32 {
    let a = iq4xs_at(i);
    let q = (w[a.word] >> (8u * (i & 3u) + a.shift)) & 15u;
    return a.scale * iq4_value(q);
}

fn w_load8(i: u32) -> W8 {
    let a = iq4xs_at(i);
    return W8(a.scale * iq4_values4(w[a.word], a.shift), a.scale * iq4_values4(w[a.word + 1u], a.shift));
}
