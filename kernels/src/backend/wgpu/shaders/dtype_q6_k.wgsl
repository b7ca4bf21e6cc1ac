// Weight prelude: Q6_K, super-blocks of 256 values as 53 words (the file's
// 210 bytes and 2 bytes of padding): 128 bytes ql (low 4 bits), 64 bytes
// qh (high 2 bits), 16 signed sub-block scales, f16 d at byte 208. Each
// half h (128 values) uses ql[64h..], qh[32h..] and scales[8h..]; within
// it, quarter r (0..4) of 32 values at offset l takes the nibble
// (r >= 2 ? high : low) of ql[l + 32 (r & 1)], the 2 bits at 2r of qh[l],
// and scale[l / 16 + 2r]. Value = (d * scale) * (q - 32).

const BLOCK_WORDS: u32 = 53u;

// Where value i lives: the words holding its ql and qh bytes (and the
// next 3 of each), its quarter r (which nibble and which 2 bits), and its
// sub-block's scale d * sc.
struct Q6kAt {
    ql: u32,
    qh: u32,
    r: u32,
    scale: f32,
}

fn q6k_at(i: u32) -> Q6kAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let h = t >> 7u;
    let r = (t >> 5u) & 3u;
    let l = t & 31u;
    let d = unpack2x16float(w[base + 52u]).x;
    let sc = bitcast<i32>(w_byte(4u * base + 192u + 8u * h + (l >> 4u) + 2u * r) << 24u) >> 24u;
    let ql = base + 16u * h + 8u * (r & 1u) + (l >> 2u);
    return Q6kAt(ql, base + 32u + 8u * h + (l >> 2u), r, d * f32(sc));
}

// The 2 bits at `shift` of each byte of `word`, moved to bits 4..6.
fn high2x4(word: u32, shift: u32) -> vec4<u32> {
    let v = vec4<u32>(word, word >> 8u, word >> 16u, word >> 24u) >> vec4<u32>(shift);
    return (v & vec4<u32>(3u)) << vec4<u32>(4u);
}

// The four values whose low bits are the bytes of `lo` and high bits those of `hi`.
fn q6k_quads(lo: u32, hi: u32, r: u32) -> vec4<f32> {
    let v = nib4u(lo, 4u * (r >> 1u)) | high2x4(hi, 2u * r);
    return vec4<f32>(v) - 32.0;
}

fn w_at(i: u32) -> f32 {
    let a = q6k_at(i);
    let shift = 8u * (i & 3u);
    let lo = (w[a.ql] >> (shift + 4u * (a.r >> 1u))) & 15u;
    let hi = (w[a.qh] >> (shift + 2u * a.r)) & 3u;
    return a.scale * (f32(lo | (hi << 4u)) - 32.0);
}

fn w_load8(i: u32) -> W8 {
    let a = q6k_at(i);
    return W8(
        a.scale * q6k_quads(w[a.ql], w[a.qh], a.r),
        a.scale * q6k_quads(w[a.ql + 1u], w[a.qh + 1u], a.r),
    );
}
