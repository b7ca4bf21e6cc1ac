// Weight prelude: IQ4_NL, blocks of 32 values as 5 words laid out as
// Q4_0's: the f16 scale d (low half of word 0; the file's 2 bytes padded
// to 4), then 16 bytes whose low nibbles index values 0..16 and high
// nibbles values 16..32. Value j is d * table[q[j]].

const BLOCK_WORDS: u32 = 5u;

fn w_at(i: u32) -> f32 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let d = unpack2x16float(w[base]).x;
    let q = (w_byte(4u * base + 4u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
    return d * iq4_value(q);
}

fn w_load8(i: u32) -> W8 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let o = base + 1u + ((j & 15u) >> 2u);
    let shift = (j >> 4u) * 4u;
    let d = unpack2x16float(w[base]).x;
    return W8(d * iq4_values4(w[o], shift), d * iq4_values4(w[o + 1u], shift));
}
