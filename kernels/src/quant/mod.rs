//! Quantized weights on the CPU: ggml's block formats read as they are in
//! the file, and the dot products of a weight row with one token's
//! activations the way the fastest CPU engines compute them.
//!
//! * [`blocks`]: the byte layout of each format and its scalar dequantization,
//!   the reference every other path is tested against.
//! * [`acts`]: activations quantized to 8 bits per block of 32 ([`Q8Block`],
//!   for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL weights, also regrouped eight blocks at a time as
//!   [`Q8Group`]s for the x86 kernels) or 256 ([`Q8KBlock`], for
//!   Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS, also stored in the order the x86 K-quant kernels read,
//!   [`acts::q4k_lane_source`]), so the inner loop multiplies small integers.
//! * [`reference`](mod@reference): scalar dot products, for every format, on those blocks.
//! * [`lanes`]: the row layout the x86 kernels read, each whole eight
//!   blocks interleaved a block per lane ([`RowLayout::Lanes8`]); the CPU
//!   backend keeps its copy of the weights in it.
//! * `x86` (x86_64 only): the same dot products in AVX2, AVX-VNNI and
//!   AVX-512 VNNI, whichever the CPU has; `arm` (aarch64 only): Q8_0/Q4_0/Q4_1 in NEON
//!   (Q5_0, Q5_1, IQ4_NL and the 256-block formats take the scalar reference there).
//!   These are the only `unsafe` of the CPU engine's arithmetic.
//! * [`Kernels`]: the set chosen once at run time for the CPU the process
//!   runs on, falling back to the scalar reference.

pub mod acts;
#[cfg(target_arch = "aarch64")]
mod arm;
pub mod attn;
pub mod blocks;
pub mod exp;
pub mod lanes;
pub mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

pub use lanes::RowLayout;

pub use acts::{
    group_q8, quantize_q8, quantize_q8_into, quantize_q8k, quantize_q8k_into, Q8Block, Q8Group,
    Q8KBlock, Q8Row,
};

use tokenwire_gguf::GgmlType;

/// Dot product of a weight row (raw block bytes) with 32-blocks of activations.
pub type DotQ8 = fn(&[u8], &Q8Row<'_>) -> f32;
/// Dot products of four weight rows with four tokens' 32-blocks
/// (`[row][token]`), each the same bits as the one-row, one-token kernel.
pub type DotQ8Tile = fn(&[&[u8]; 4], &[Q8Row<'_>; 4]) -> [[f32; 4]; 4];
/// Dot product of a weight row with 256-blocks of activations.
pub type DotQ8K = fn(&[u8], &[Q8KBlock]) -> f32;
/// Four K-quant weight rows against four tokens' 256-blocks: `out[r][t]`,
/// the same bits as [`DotQ8K`] on row `r` and token `t`.
pub type DotQ8KTile = fn(&[&[u8]; 4], &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4];
/// Dot product of a 2-byte-float weight row with f32 activations.
pub type DotHalf = fn(&[u8], &[f32]) -> f32;

/// Dot products of four 2-byte-float weight rows with four tokens' f32
/// activations (`[row][token]`).
pub type DotHalfTile = fn(&[&[u8]; 4], &[&[f32]; 4]) -> [[f32; 4]; 4];

/// An instruction set the kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, no intrinsics.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX2 with AVX-VNNI's VEX-encoded 256-bit integer dot product
    /// (Intel Alder Lake and later, AMD Zen 5) and AVX2's 16 registers.
    AvxVnni,
    /// x86_64 AVX2 with AVX-512 VNNI's 256-bit integer dot product (and
    /// AVX-512F's 512-bit registers).
    Avx512Vnni,
    /// aarch64 NEON (every aarch64 CPU).
    Neon,
}

impl Isa {
    /// The best instruction set this CPU has.
    pub fn detect() -> Isa {
        Isa::available().into_iter().last().unwrap_or(Isa::Scalar)
    }

    /// Every instruction set this CPU can run, scalar first.
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut out = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                out.push(Isa::Avx2);
            }
            if x86::has_avx_vnni() {
                out.push(Isa::AvxVnni);
            }
            if x86::has_avx512_vnni() {
                out.push(Isa::Avx512Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        out.push(Isa::Neon);
        out
    }

    /// A short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Neon => "neon",
        }
    }
}

/// The dot-product kernels of one [`Isa`].
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// The instruction set they use.
    pub isa: Isa,
    /// Q8_0 weights.
    pub q8_0: DotQ8,
    /// Q4_0 weights.
    pub q4_0: DotQ8,
    /// Q4_1 weights.
    pub q4_1: DotQ8,
    /// Q5_0 weights.
    pub q5_0: DotQ8,
    /// Q5_1 weights.
    pub q5_1: DotQ8,
    /// How the 32-block kernels read weight rows: [`RowLayout::Lanes8`]
    /// for those with a lane per block, which also read [`Q8Row::groups`];
    /// the others read the file's layout and only the blocks.
    pub layout: RowLayout,
    /// Q8_0 weights, four rows by four tokens.
    pub q8_0_tile: DotQ8Tile,
    /// Q4_0 weights, four rows by four tokens.
    pub q4_0_tile: DotQ8Tile,
    /// Q4_1 weights, four rows by four tokens.
    pub q4_1_tile: DotQ8Tile,
    /// Q5_0 weights, four rows by four tokens.
    pub q5_0_tile: DotQ8Tile,
    /// Q5_1 weights, four rows by four tokens.
    pub q5_1_tile: DotQ8Tile,
    /// IQ4_NL weights.
    pub iq4_nl: DotQ8,
    /// IQ4_NL weights, four rows by four tokens.
    pub iq4_nl_tile: DotQ8Tile,
    /// Q2_K weights.
    pub q2_k: DotQ8K,
    /// Q2_K weights, four rows by four tokens.
    pub q2_k_tile: DotQ8KTile,
    /// Q3_K weights.
    pub q3_k: DotQ8K,
    /// Q4_K weights.
    pub q4_k: DotQ8K,
    /// Q5_K weights.
    pub q5_k: DotQ8K,
    /// Q6_K weights.
    pub q6_k: DotQ8K,
    /// Q3_K weights, four rows by four tokens.
    pub q3_k_tile: DotQ8KTile,
    /// Q4_K weights, four rows by four tokens.
    pub q4_k_tile: DotQ8KTile,
    /// Q5_K weights, four rows by four tokens.
    pub q5_k_tile: DotQ8KTile,
    /// Q6_K weights, four rows by four tokens.
    pub q6_k_tile: DotQ8KTile,
    /// IQ4_XS weights.
    pub iq4_xs: DotQ8K,
    /// IQ4_XS weights, four rows by four tokens.
    pub iq4_xs_tile: DotQ8KTile,
    /// F16 weights, f32 activations.
    pub f16: DotHalf,
    /// F16 weights, four rows by four tokens (the same bits as one at a time).
    pub f16_tile: DotHalfTile,
    /// BF16 weights, f32 activations.
    pub bf16: DotHalf,
    /// F32 weights, f32 activations.
    pub f32: fn(&[f32], &[f32]) -> f32,
    /// Attention over the CPU pool's cached K and V ([`attn`]).
    pub attend: attn::AttendFn,
    /// [`quantize_q8_into`] compiled for this instruction set (the same bits).
    pub quantize_q8: fn(&[f32], &mut [Q8Block]),
}

impl Kernels {
    /// The fastest kernels for this CPU, or those `TOKENWIRE_CPU_KERNELS`
    /// names (`scalar`, `avx2`, `avx-vnni`, `avx512-vnni`, `neon`; one this
    /// CPU lacks falls back to scalar), for comparing instruction sets on one
    /// machine.
    pub fn detect() -> Kernels {
        let chosen = std::env::var("TOKENWIRE_CPU_KERNELS")
            .ok()
            .and_then(|name| {
                [
                    Isa::Scalar,
                    Isa::Avx2,
                    Isa::AvxVnni,
                    Isa::Avx512Vnni,
                    Isa::Neon,
                ]
                .into_iter()
                .find(|i| i.name() == name)
            });
        Kernels::for_isa(chosen.unwrap_or_else(Isa::detect))
    }

    /// The kernels of `isa`; scalar ones where `isa` has none of its own,
    /// or where this CPU cannot run it.
    pub fn for_isa(isa: Isa) -> Kernels {
        let scalar = Kernels {
            isa: Isa::Scalar,
            layout: RowLayout::File,
            q8_0: |w, a| reference::dot_q8_0(w, a.blocks),
            q4_0: |w, a| reference::dot_q4_0(w, a.blocks),
            q4_1: |w, a| reference::dot_q4_1(w, a.blocks),
            q8_0_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q8_0(r, x.blocks))),
            q4_0_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q4_0(r, x.blocks))),
            q4_1_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q4_1(r, x.blocks))),
            q5_0: |w, a| reference::dot_q5_0(w, a.blocks),
            q5_1: |w, a| reference::dot_q5_1(w, a.blocks),
            q5_0_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q5_0(r, x.blocks))),
            q5_1_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q5_1(r, x.blocks))),
            iq4_nl: |w, a| reference::dot_iq4_nl(w, a.blocks),
            iq4_nl_tile: |w, a| w.map(|r| a.map(|x| reference::dot_iq4_nl(r, x.blocks))),
            q2_k: reference::dot_q2_k,
            q2_k_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q2_k(r, x))),
            q3_k: reference::dot_q3_k,
            q4_k: reference::dot_q4_k,
            q5_k: reference::dot_q5_k,
            q6_k: reference::dot_q6_k,
            q3_k_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q3_k(r, x))),
            q4_k_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q4_k(r, x))),
            q5_k_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q5_k(r, x))),
            q6_k_tile: |w, a| w.map(|r| a.map(|x| reference::dot_q6_k(r, x))),
            iq4_xs: reference::dot_iq4_xs,
            iq4_xs_tile: |w, a| w.map(|r| a.map(|x| reference::dot_iq4_xs(r, x))),
            f16: reference::dot_f16,
            f16_tile: |w, x| w.map(|r| x.map(|x| reference::dot_f16(r, x))),
            bf16: reference::dot_bf16,
            f32: reference::dot_f32,
            attend: attn::attend_baseline,
            quantize_q8: quantize_q8_into,
        };
        if !Isa::available().contains(&isa) {
            return scalar;
        }
        match isa {
            Isa::Scalar => scalar,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => x86::kernels(isa, scalar),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => arm::kernels(isa, scalar),
            _ => scalar,
        }
    }
}

impl Kernels {
    /// The row kernel and the tile for `dtype` weights against 32-blocks of
    /// activations; `None` for the formats [`act_format`] gives others.
    pub fn for_q8(&self, dtype: GgmlType) -> Option<(DotQ8, DotQ8Tile)> {
        Some(match dtype {
            GgmlType::Q8_0 => (self.q8_0, self.q8_0_tile),
            GgmlType::Q4_0 => (self.q4_0, self.q4_0_tile),
            GgmlType::Q4_1 => (self.q4_1, self.q4_1_tile),
            GgmlType::Q5_0 => (self.q5_0, self.q5_0_tile),
            GgmlType::Q5_1 => (self.q5_1, self.q5_1_tile),
            GgmlType::IQ4_NL => (self.iq4_nl, self.iq4_nl_tile),
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => return None,
        })
    }

    /// The row kernel and the tile for `dtype` weights against 256-blocks
    /// of activations; `None` for the formats [`act_format`] gives others.
    pub fn for_q8k(&self, dtype: GgmlType) -> Option<(DotQ8K, DotQ8KTile)> {
        Some(match dtype {
            GgmlType::Q2_K => (self.q2_k, self.q2_k_tile),
            GgmlType::Q3_K => (self.q3_k, self.q3_k_tile),
            GgmlType::Q4_K => (self.q4_k, self.q4_k_tile),
            GgmlType::Q5_K => (self.q5_k, self.q5_k_tile),
            GgmlType::Q6_K => (self.q6_k, self.q6_k_tile),
            GgmlType::IQ4_XS => (self.iq4_xs, self.iq4_xs_tile),
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL => return None,
        })
    }
}

/// Which activation blocks a weight type is multiplied with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// f32 as they are (float weights).
    F32,
    /// [`Q8Block`]s of 32.
    Q8,
    /// [`Q8KBlock`]s of 256.
    Q8K,
}

/// The activation format `dtype` weights take.
pub fn act_format(dtype: GgmlType) -> ActFormat {
    match dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActFormat::F32,
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::IQ4_NL => ActFormat::Q8,
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS => ActFormat::Q8K,
    }
}
