//! ggml's block layouts, byte for byte as GGUF files store them, and their
//! scalar dequantization: the definition every kernel is tested against.
//!
//! | type | values | bytes | layout |
//! |---|---:|---:|---|
//! | Q8_0 | 32 | 34 | f16 `d`, 32 × i8 `q`; `x = d q` |
//! | Q4_0 | 32 | 18 | f16 `d`, 16 bytes; value `j` is the low nibble of byte `j`, value `j + 16` its high nibble; `x = d (q - 8)` |
//! | Q4_1 | 32 | 20 | f16 `d`, f16 `m`, nibbles as Q4_0; `x = d q + m` |
//! | Q5_0 | 32 | 22 | f16 `d`, u32 `qh` (bit `j`: value `j`'s fifth bit), nibbles as Q4_0; `x = d (q - 16)` |
//! | Q5_1 | 32 | 24 | f16 `d`, f16 `m`, `qh` and nibbles as Q5_0; `x = d q + m` |
//! | Q2_K | 256 | 84 | 16 bytes of scales (low nibble) and mins (high nibble), 64 bytes of 2-bit values laid out as Q3_K's pairs, f16 `d`, f16 `dmin`; `x = d sc q - dmin m` per 16 |
//! | Q3_K | 256 | 110 | 32 bytes `hmask`, 64 bytes of 2-bit pairs, 12 bytes of sixteen 6-bit scales, f16 `d`; value `128 h + 32 j + k` (`k < 32`) is bits `2 j` of byte `32 h + k` of the pairs with bit `4 h + j` of `hmask[k]` as its third; `x = d (sc - 32) (q - 4)` per 16 |
//! | Q4_K | 256 | 144 | f16 `d`, f16 `dmin`, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles; `x = d sc q - dmin mn` per 32 |
//! | Q5_K | 256 | 176 | Q4_K's `d`, `dmin` and 12 scale bytes, 32 bytes `qh`, 128 bytes of nibbles; value `64 g + l` (`l < 32`) has bit `2 g` of `qh[l]` as its fifth bit, value `64 g + 32 + l` bit `2 g + 1` |
//! | IQ4_NL | 32 | 18 | f16 `d`, nibbles as Q4_0; `x = d T[q]`, `T` the 16 values of [`IQ4NL_VALUES`] |
//! | IQ4_XS | 256 | 136 | f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of nibbles, 16 per sub-block of 32 as Q4_0's; sub-block `j`'s scale is nibble `j % 2` of `scales_l[j / 2]` with bits `2 j` of `scales_h` on top; `x = d (sc - 32) T[q]` |
//! | Q6_K | 256 | 210 | 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d`; `x = d sc (q - 32)` per 16 |

use tokenwire_gguf::GgmlType;

/// Bytes of a Q8_0 block.
pub const Q8_0_BYTES: usize = 34;
/// Bytes of a Q4_0 block.
pub const Q4_0_BYTES: usize = 18;
/// Bytes of a Q4_1 block.
pub const Q4_1_BYTES: usize = 20;
/// Bytes of a Q5_0 block.
pub const Q5_0_BYTES: usize = 22;
/// Bytes of a Q5_1 block.
pub const Q5_1_BYTES: usize = 24;
/// Bytes of a Q2_K super-block.
pub const Q2_K_BYTES: usize = 84;
/// Where a Q2_K super-block's 2-bit values and its `d` (then `dmin`)
/// start; its scale bytes are first.
pub const Q2_K_QS: usize = 16;
/// See [`Q2_K_QS`].
pub const Q2_K_D: usize = 80;
/// Bytes of a Q3_K super-block.
pub const Q3_K_BYTES: usize = 110;
/// Where a Q3_K super-block's 2-bit pairs, scales and `d` start.
pub const Q3_K_QS: usize = 32;
/// See [`Q3_K_QS`].
pub const Q3_K_SCALES: usize = 96;
/// See [`Q3_K_QS`].
pub const Q3_K_D: usize = 108;
/// Bytes of a Q4_K super-block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes of a Q5_K super-block.
pub const Q5_K_BYTES: usize = 176;
/// Bytes of a Q6_K super-block.
pub const Q6_K_BYTES: usize = 210;
/// Bytes of an IQ4_NL block.
pub const IQ4_NL_BYTES: usize = 18;
/// Bytes of an IQ4_XS super-block.
pub const IQ4_XS_BYTES: usize = 136;
/// Where an IQ4_XS super-block's nibbles start (after `d`, `scales_h` and
/// `scales_l`).
pub const IQ4_XS_QS: usize = 8;
/// The 16 values IQ4_NL's and IQ4_XS's nibbles index: llama.cpp's table,
/// denser near zero where trained weights are.
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// Values per Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL block.
pub const QK: usize = 32;
/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// The little-endian f16 at `b[at..at + 2]`, widened.
#[inline]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The little-endian bf16 at `b[at..at + 2]`, widened.
#[inline]
pub fn bf16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
}

/// Scale and minimum of sub-block `j` (0..8) of a Q4_K super-block, from its
/// 12 packed bytes: sub-blocks 0-3 keep theirs in the low 6 bits of bytes
/// `j` and `j + 4`; 4-7 split theirs between a nibble of bytes 8-11 and the
/// top 2 bits of bytes `j - 4` and `j`.
#[inline]
pub fn q4k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The sixteen signed scales of a Q3_K super-block (its 6-bit scales less
/// 32), in sub-block order, from its 12 scale bytes: sub-block `j` keeps
/// its low four bits in byte `j % 8` (the low nibble for `j < 8`, the high
/// one after) and its top two in bits `2 (j / 4)` of byte `8 + j % 4`.
#[inline]
pub fn q3k_scales(scales: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            scales[j] & 0x0F
        } else {
            scales[j - 8] >> 4
        };
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = ((low | (high << 4)) as i8) - 32;
    }
    out
}

/// Value `p` (0..256) of a Q3_K super-block `b`, unsigned (0..8: the
/// stored value plus its offset of 4).
#[inline]
pub fn q3k_value(b: &[u8], p: usize) -> u8 {
    let (h, j, k) = (p / 128, (p % 128) / 32, p % 32);
    let pair = (b[Q3_K_QS + 32 * h + k] >> (2 * j)) & 3;
    let third = (b[k] >> (4 * h + j)) & 1;
    pair | (third << 2)
}

/// The eight signed scales of an IQ4_XS super-block `b` (its 6-bit
/// scales less 32), in sub-block order: sub-block `j` keeps its low four
/// bits in nibble `j % 2` of byte `4 + j / 2` and its top two in bits `2 j`
/// of the little-endian u16 at byte 2.
#[inline]
pub fn iq4xs_scales(b: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let mut out = [0i8; 8];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
        let top = ((high >> (2 * j)) & 3) as u8;
        *o = ((low | (top << 4)) as i8) - 32;
    }
    out
}

/// The 32 table values of one IQ4_NL block's (or IQ4_XS sub-block's) 16
/// bytes of nibbles, in value order (low nibbles first, as Q4_0).
#[inline]
pub fn iq4_values(qs: &[u8]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for (j, &b) in qs[..16].iter().enumerate() {
        v[j] = IQ4NL_VALUES[(b & 0x0F) as usize];
        v[j + 16] = IQ4NL_VALUES[(b >> 4) as usize];
    }
    v
}

/// Value `p` (0..256) of a Q2_K super-block `b`, 0..4: bits `2 j` of
/// byte `32 h + k` of its values, for `p = 128 h + 32 j + k` (`k < 32`),
/// the layout of Q3_K's pairs.
#[inline]
pub fn q2k_value(b: &[u8], p: usize) -> u8 {
    let (h, j, k) = (p / 128, (p % 128) / 32, p % 32);
    (b[Q2_K_QS + 32 * h + k] >> (2 * j)) & 3
}

/// The 32 5-bit values of a Q5_0 or Q5_1 block, from its high-bit word
/// `qh` (little-endian, as stored) and its 16 bytes of nibbles.
#[inline]
pub fn q5_values(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0x0F) | ((((h >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// The two values of group `g` (0..4) of a Q4_K or Q5_K super-block that
/// nibble byte `q` (and, for Q5_K, high-bit byte `h`) give: value `64 g +
/// l` (the low nibble, with bit `2 g` of `h` as its fifth) and value `64 g
/// + 32 + l` (the high nibble, bit `2 g + 1`).
#[inline]
pub fn k_values(q: u8, h: Option<u8>, g: usize) -> (u8, u8) {
    let h = h.unwrap_or(0);
    (
        (q & 0x0F) | (((h >> (2 * g)) & 1) << 4),
        (q >> 4) | (((h >> (2 * g + 1)) & 1) << 4),
    )
}

/// Dequantizes one row of `dtype` (`bytes` holds whole blocks) into `out`,
/// which must hold exactly the row's values.
pub fn dequantize_row(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(bytes, 2 * i);
            }
        }
        GgmlType::BF16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = bf16_at(bytes, 2 * i);
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in bytes.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                for (yi, &q) in y.iter_mut().zip(&b[2..]) {
                    *yi = d * (q as i8) as f32;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in bytes.chunks_exact(Q4_0_BYTES).zip(out.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                for (j, &q) in b[2..].iter().enumerate() {
                    y[j] = d * ((q & 0x0F) as i32 - 8) as f32;
                    y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, y) in bytes.chunks_exact(Q4_1_BYTES).zip(out.chunks_exact_mut(QK)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (j, &q) in b[4..].iter().enumerate() {
                    y[j] = d * (q & 0x0F) as f32 + m;
                    y[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, y) in bytes.chunks_exact(Q5_0_BYTES).zip(out.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                for (yi, q) in y.iter_mut().zip(q5_values(&b[2..6], &b[6..])) {
                    *yi = d * (q as i32 - 16) as f32;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (b, y) in bytes.chunks_exact(Q5_1_BYTES).zip(out.chunks_exact_mut(QK)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (yi, q) in y.iter_mut().zip(q5_values(&b[4..8], &b[8..])) {
                    *yi = d * q as f32 + m;
                }
            }
        }
        GgmlType::IQ4_NL => {
            for (b, y) in bytes
                .chunks_exact(IQ4_NL_BYTES)
                .zip(out.chunks_exact_mut(QK))
            {
                let d = f16_at(b, 0);
                for (yi, q) in y.iter_mut().zip(iq4_values(&b[2..])) {
                    *yi = d * q as f32;
                }
            }
        }
        GgmlType::IQ4_XS => {
            for (b, y) in bytes
                .chunks_exact(IQ4_XS_BYTES)
                .zip(out.chunks_exact_mut(QK_K))
            {
                let d = f16_at(b, 0);
                let sc = iq4xs_scales(b);
                for (j, y) in y.chunks_exact_mut(QK).enumerate() {
                    let dl = d * sc[j] as f32;
                    let qs = &b[IQ4_XS_QS + 16 * j..IQ4_XS_QS + 16 * j + 16];
                    for (yi, q) in y.iter_mut().zip(iq4_values(qs)) {
                        *yi = dl * q as f32;
                    }
                }
            }
        }
        GgmlType::Q2_K => {
            for (b, y) in bytes
                .chunks_exact(Q2_K_BYTES)
                .zip(out.chunks_exact_mut(QK_K))
            {
                let (d, dmin) = (f16_at(b, Q2_K_D), f16_at(b, Q2_K_D + 2));
                for (p, yp) in y.iter_mut().enumerate() {
                    let sc = b[p / 16];
                    let (dl, ml) = (d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
                    *yp = dl * q2k_value(b, p) as f32 - ml;
                }
            }
        }
        GgmlType::Q3_K => {
            for (b, y) in bytes
                .chunks_exact(Q3_K_BYTES)
                .zip(out.chunks_exact_mut(QK_K))
            {
                let d = f16_at(b, Q3_K_D);
                let sc = q3k_scales(&b[Q3_K_SCALES..Q3_K_D]);
                for (p, yp) in y.iter_mut().enumerate() {
                    *yp = d * sc[p / 16] as f32 * (q3k_value(b, p) as i32 - 4) as f32;
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Q5_K is Q4_K with 32 bytes of fifth bits before the nibbles.
            let five = dtype == GgmlType::Q5_K;
            for (b, y) in bytes
                .chunks_exact(dtype.block_bytes())
                .zip(out.chunks_exact_mut(QK_K))
            {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let (qh, qs) = if five {
                    (Some(&b[16..48]), &b[48..])
                } else {
                    (None, &b[16..])
                };
                // Four groups of 64 values: 32 low nibbles, then 32 high ones.
                for g in 0..4 {
                    let (sc1, m1) = q4k_scale_min(scales, 2 * g);
                    let (sc2, m2) = q4k_scale_min(scales, 2 * g + 1);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                    let q = &qs[32 * g..32 * g + 32];
                    let y = &mut y[64 * g..64 * g + 64];
                    for l in 0..32 {
                        let (lo, hi) = k_values(q[l], qh.map(|h| h[l]), g);
                        y[l] = d1 * lo as f32 - m1;
                        y[32 + l] = d2 * hi as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, y) in bytes
                .chunks_exact(Q6_K_BYTES)
                .zip(out.chunks_exact_mut(QK_K))
            {
                let d = f16_at(b, 208);
                for half in 0..2 {
                    let ql = &b[64 * half..64 * half + 64];
                    let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                    let y = &mut y[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let [q1, q2, q3, q4] = q6k_quad(ql, qh, l);
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// The four signed 6-bit values a Q6_K half-block stores at `l` (0..32):
/// those of positions `l`, `l + 32`, `l + 64` and `l + 96`.
#[inline]
pub fn q6k_quad(ql: &[u8], qh: &[u8], l: usize) -> [i32; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0x0F) | ((h & 3) << 4)) as i32 - 32,
        ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i32 - 32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32,
    ]
}
