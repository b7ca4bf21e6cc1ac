//! The tensor types a GGUF file may hold (ggml's type ids), the ones this
//! engine loads, and the byte size of a row of each.

/// A tensor type this engine loads from GGUF files (named as ggml names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Blocks of 32: an f16 scale and 32 signed bytes.
    Q8_0,
    /// Blocks of 32: an f16 scale and 32 4-bit values offset by 8.
    Q4_0,
    /// Blocks of 32: f16 scale and minimum, 32 4-bit values.
    Q4_1,
    /// Blocks of 32: an f16 scale and 32 5-bit values offset by 16 (their
    /// high bits in a 32-bit word before the nibbles).
    Q5_0,
    /// Blocks of 32: f16 scale and minimum, 32 5-bit values (high bits as
    /// Q5_0's).
    Q5_1,
    /// Super-blocks of 256: 16 sub-blocks with 4-bit scales and minimums,
    /// 256 2-bit values, f16 scale and minimum factors.
    Q2_K,
    /// Super-blocks of 256: 2+1-bit values offset by 4, 16 sub-blocks with
    /// 6-bit scales offset by 32, an f16 scale.
    Q3_K,
    /// Super-blocks of 256: f16 scale and minimum, 8 sub-blocks with 6-bit
    /// scales and minimums, 256 4-bit values.
    Q4_K,
    /// Super-blocks of 256: f16 scale and minimum, 8 sub-blocks with 6-bit
    /// scales and minimums, 256 5-bit values (Q4_K's with a fifth bit).
    Q5_K,
    /// Super-blocks of 256: 4+2-bit values, 16 sub-blocks with 8-bit
    /// scales, an f16 scale.
    Q6_K,
    /// Blocks of 32: an f16 scale and 32 4-bit indices into a fixed table of
    /// 16 non-uniform values (llama.cpp's fallback for Q2_K, Q3_K and the IQ
    /// types on rows that are not whole 256-blocks).
    IQ4_NL,
    /// Super-blocks of 256: IQ4_NL's table, 8 sub-blocks of 32 with 6-bit
    /// scales offset by 32, an f16 scale.
    IQ4_XS,
}

/// ggml's names for type ids this engine does not load, so that an error
/// can say what the file has.
const OTHER_TYPES: &[(u32, &str)] = &[
    (4, "Q4_2 (removed from ggml)"),
    (5, "Q4_3 (removed from ggml)"),
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

impl GgmlType {
    /// Every type this engine loads.
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];

    /// The type with ggml id `id`, or a message naming what it is and why it
    /// cannot be loaded.
    pub fn from_id(id: u32) -> Result<GgmlType, String> {
        if let Some(t) = GgmlType::ALL.into_iter().find(|t| t.id() == id) {
            return Ok(t);
        }
        let supported: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        let what = match OTHER_TYPES.iter().find(|(i, _)| *i == id) {
            Some((_, name)) => format!("type {name} (ggml type {id})"),
            None => format!("unknown ggml type {id}"),
        };
        Err(format!(
            "{what}, which this engine does not load (it loads {})",
            supported.join(", ")
        ))
    }

    /// ggml's id for the type.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
        }
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
        }
    }

    /// Values per block (1 for plain floats).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL => 32,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q2_K => 16 + 64 + 2 + 2,
            GgmlType::Q3_K => 32 + 64 + 12 + 2,
            GgmlType::Q4_K => 2 + 2 + 12 + 128,
            GgmlType::Q5_K => 2 + 2 + 12 + 32 + 128,
            GgmlType::Q6_K => 128 + 64 + 16 + 2,
            GgmlType::IQ4_NL => 2 + 16,
            GgmlType::IQ4_XS => 2 + 2 + 4 + 128,
        }
    }

    /// Bytes of a row of `len` values; `None` when `len` is not a whole
    /// number of blocks (or overflows).
    pub fn row_bytes(self, len: u64) -> Option<u64> {
        let block = self.block_len() as u64;
        len.is_multiple_of(block)
            .then(|| (len / block).checked_mul(self.block_bytes() as u64))?
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_are_ggmls() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
        }
        // Sizes as ggml's block structs give them.
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(GgmlType::Q4_0.row_bytes(32), Some(18));
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q5_0.row_bytes(896), Some(28 * 22));
        assert_eq!(GgmlType::Q5_1.row_bytes(64), Some(48));
        assert_eq!(GgmlType::Q4_K.row_bytes(256), Some(144));
        assert_eq!(GgmlType::Q6_K.row_bytes(512), Some(420));
        assert_eq!(GgmlType::BF16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::Q4_K.row_bytes(576), None, "not whole blocks");
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None, "overflow");
        assert_eq!(GgmlType::Q5_K.row_bytes(512), Some(352));
        assert_eq!(GgmlType::Q3_K.row_bytes(512), Some(220));
        assert_eq!(GgmlType::IQ4_NL.row_bytes(576), Some(18 * 18));
        assert_eq!(GgmlType::IQ4_XS.row_bytes(512), Some(272));
        assert_eq!(GgmlType::Q2_K.row_bytes(512), Some(168));
        let e = GgmlType::from_id(16).expect_err("IQ2_XXS");
        assert!(e.contains("IQ2_XXS") && e.contains("Q2_K"), "{e}");
        assert!(GgmlType::from_id(9999).expect_err("?").contains("9999"));
    }
}
