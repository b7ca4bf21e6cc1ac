//! Every kernel's parameter block, spelled once: one `#[repr(C)]` struct
//! per WGSL `Params` (field for field, in its order, under its names; a
//! test holds each to its shader), the planners that fill the kernels
//! without a module of their own (embedding, RMSNorm, SiLU, sampling), and
//! the arena a submission's blocks go into. The backend and the kernel lab
//! both plan through these, so a kernel's words cannot drift between them.

use std::collections::HashMap;

use super::context::grid;
use super::tensors::Chunk;

/// Words of one parameter block: every kernel declares its `Params` as a
/// multiple of 4 words up to this many (the unused ones `_pN`; 16 but for
/// mat-vec, whose RoPE variant takes 20), so one bind group layout, bound
/// at this size, serves them all.
pub(crate) const PARAM_WORDS: usize = 20;
/// Bytes of one parameter block.
pub(crate) const PARAM_BYTES: u64 = 4 * PARAM_WORDS as u64;

/// One parameter block, unused words zero.
pub(crate) type Block = [u32; PARAM_WORDS];

/// One dispatch as a planner gives it: its parameter block and its grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) params: Block,
    pub(crate) groups: [u32; 2],
}

/// A `Params` field's word: u32 as it is, f32 as its bits.
trait Word: Copy {
    fn word(self) -> u32;
}

impl Word for u32 {
    fn word(self) -> u32 {
        self
    }
}

impl Word for f32 {
    fn word(self) -> u32 {
        self.to_bits()
    }
}

/// Declares each kernel's parameter struct from one list of fields: the
/// struct, its block (the fields' words in order) and, for the tests, the
/// names and types to compare with the shaders' `Params`.
macro_rules! kernel_params {
    ($(
        $(#[$doc:meta])*
        $name:ident in [$($shader:literal),+] {
            $($field:ident: $ty:ident,)+
        }
    )+) => {
        $(
            $(#[$doc])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, PartialEq)]
            pub(crate) struct $name {
                $(pub(crate) $field: $ty,)+
            }

            const _: () = assert!(std::mem::size_of::<$name>() <= PARAM_BYTES as usize);

            impl $name {
                /// The uniform block the shader reads.
                pub(crate) fn block(&self) -> Block {
                    let words = [$(Word::word(self.$field)),+];
                    let mut block = [0; PARAM_WORDS];
                    block[..words.len()].copy_from_slice(&words);
                    block
                }

                /// The block and the grid of one dispatch.
                pub(crate) fn call(&self, groups: [u32; 2]) -> Call {
                    Call {
                        params: self.block(),
                        groups,
                    }
                }
            }
        )+

        /// Per struct: its name, the sources of the shaders that read it,
        /// and its fields (name, type).
        #[cfg(test)]
        #[allow(clippy::type_complexity)]
        const MIRRORS: &[(&str, &[&str], &[(&str, &str)])] = &[$((
            stringify!($name),
            &[$(include_str!(concat!("shaders/", $shader))),+],
            &[$((stringify!($field), stringify!($ty))),+],
        )),+];
    };
}

kernel_params! {
    /// embed.wgsl's `Params`: one chunk of the table gathered into x.
    EmbedParams in ["embed.wgsl"] {
        h: u32,
        n_rows: u32,
        tok_off: u32,
        row0: u32,
        chunk_rows: u32,
    }

    /// rms_norm.wgsl's `Params`.
    NormParams in ["rms_norm.wgsl"] {
        h: u32,
        eps: f32,
        flags: u32,
        sel_off: u32,
        n_rows: u32,
    }

    /// rope_kv.wgsl's `Params`: RoPE on a pass's query and key heads and the
    /// write of its keys and values into one layer's cache.
    RopeKvParams in ["rope_kv.wgsl"] {
        n_rows: u32,
        q_heads: u32,
        kv_heads: u32,
        half: u32,
        stride: u32,
        cs_off: u32,
        sn_off: u32,
        slot_off: u32,
        bs: u32,
        flags: u32,
        eps: f32,
    }

    /// attn_decode.wgsl's `Params`.
    DecodeParams in ["attn_decode.wgsl"] {
        n_items: u32,
        dec_off: u32,
        pos_off: u32,
        rt_off: u32,
        kv_heads: u32,
        group: u32,
        stride: u32,
        q_heads: u32,
        bs: u32,
        split_len: u32,
        n_splits: u32,
        scale: f32,
        ml_off: u32,
        hgroups: u32,
        fold: u32,
    }

    /// attn_merge.wgsl's `Params`.
    MergeParams in ["attn_merge.wgsl"] {
        n_items: u32,
        dec_off: u32,
        q_heads: u32,
        n_splits: u32,
        ml_off: u32,
        hd: u32,
    }

    /// attn_prefill.wgsl's `Params`.
    PrefillParams in ["attn_prefill.wgsl"] {
        tile_off: u32,
        pos_off: u32,
        rt_off: u32,
        kv_heads: u32,
        group: u32,
        stride: u32,
        q_heads: u32,
        bs: u32,
        scale: f32,
        n_tiles: u32,
    }

    /// mat_vec.wgsl's `Params` (its SwiGLU, fused-norm and RoPE variants
    /// too; the last seven fields only for RoPE).
    MatVecParams in ["mat_vec.wgsl"] {
        k: u32,
        rows: u32,
        row0: u32,
        ncols: u32,
        ldx: u32,
        ldy: u32,
        has_bias: u32,
        x_off: u32,
        y_off: u32,
        tpr: u32,
        up_row: u32,
        flags: u32,
        eps: f32,
        col0: u32,
        cs_off: u32,
        sn_off: u32,
        slot_off: u32,
        k_head0: u32,
        kv_heads: u32,
        bs: u32,
    }

    /// The tiled matmuls' `Params`, one layout for the f32 and the
    /// cooperative-matrix kernel so a product picks either with one plan.
    MatMulParams in ["mat_mul.wgsl", "coop_mat_mul.wgsl", "split_sum.wgsl"] {
        k: u32,
        rows: u32,
        row0: u32,
        m: u32,
        ldx: u32,
        ldy: u32,
        has_bias: u32,
        x_off: u32,
        y_off: u32,
        accumulate: u32,
        splits: u32,
        k_len: u32,
        m_groups: u32,
        fold: u32,
        part_n: u32,
        part_m: u32,
    }

    /// silu_mul.wgsl's `Params`.
    SiluParams in ["silu_mul.wgsl"] {
        n_rows: u32,
        inter: u32,
    }

    /// sample.wgsl's `Params`.
    SampleParams in ["sample.wgsl"] {
        n_rows: u32,
        vocab: u32,
        out_base: u32,
    }
}

/// mat_vec.wgsl's `flags`: add the product to y (a residual add).
pub(crate) const MAT_VEC_ACCUMULATE: u32 = 1;
/// rms_norm.wgsl's `flags`: normalise only the rows listed at `sel_off`.
const NORM_SELECT: u32 = 4;

/// Gathers the `n_rows` tokens listed at `tok_off` in `plan` from `chunk`
/// of a table of rows `h` wide (rows outside the chunk are another
/// dispatch's).
pub(crate) fn embed_call(h: u32, n_rows: u32, tok_off: u32, chunk: &Chunk) -> Call {
    EmbedParams {
        h,
        n_rows,
        tok_off,
        row0: chunk.row0,
        chunk_rows: chunk.rows,
    }
    .call(grid(n_rows))
}

/// RMSNorm of `n_rows` rows `h` wide: the first `n_rows` of x, or with
/// `select`, the rows listed at that offset in `plan` (written compactly).
pub(crate) fn norm_call(h: u32, eps: f32, select: Option<u32>, n_rows: u32) -> Call {
    NormParams {
        h,
        eps,
        flags: if select.is_some() { NORM_SELECT } else { 0 },
        sel_off: select.unwrap_or(0),
        n_rows,
    }
    .call(grid(n_rows))
}

/// silu(gate) * up over `n_rows` gate|up rows of `2 inter` values.
pub(crate) fn silu_call(n_rows: u32, inter: u32) -> Call {
    SiluParams { n_rows, inter }.call(grid((n_rows * inter).div_ceil(256)))
}

/// Samples `n_rows` logits rows `vocab` wide, the step's rows `out_base..`
/// (one workgroup per row).
pub(crate) fn sample_call(n_rows: u32, vocab: u32, out_base: u32) -> Call {
    SampleParams {
        n_rows,
        vocab,
        out_base,
    }
    .call(grid(n_rows))
}

/// The parameter blocks of one submission, deduplicated, each at a multiple
/// of the device's uniform offset alignment (used as a dynamic offset).
#[derive(Debug, Default)]
pub(crate) struct ParamArena {
    bytes: Vec<u8>,
    align: usize,
    seen: HashMap<Block, u32>,
}

impl ParamArena {
    pub(crate) fn new(align: u64) -> ParamArena {
        ParamArena {
            bytes: Vec::new(),
            align: align as usize,
            seen: HashMap::new(),
        }
    }

    /// The offset of a copy of `block`.
    pub(crate) fn push(&mut self, block: &Block) -> u32 {
        if let Some(&off) = self.seen.get(block) {
            return off;
        }
        let off = self.bytes.len();
        self.bytes.extend_from_slice(bytemuck::cast_slice(block));
        // Whole blocks at multiples of the alignment (32 on lavapipe, 256
        // on most GPUs).
        let stride = (PARAM_BYTES as usize).next_multiple_of(self.align.max(1));
        self.bytes.resize(off + stride, 0);
        self.seen.insert(*block, off as u32);
        off as u32
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of a WGSL source's `struct Params`, as (name, type).
    fn wgsl_params(src: &str) -> Vec<(String, String)> {
        let open = "struct Params {";
        let at = src.find(open).expect("struct Params") + open.len();
        let body = &src[at..];
        let body = &body[..body.find('}').expect("end of Params")];
        body.lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .flat_map(|l| l.split(','))
            .filter_map(|f| {
                let (n, t) = f.split_once(':')?;
                Some((n.trim().to_string(), t.trim().to_string()))
            })
            .collect()
    }

    #[test]
    fn every_params_struct_mirrors_its_shaders() {
        for &(name, shaders, fields) in MIRRORS {
            for src in shaders {
                let wgsl = wgsl_params(src);
                assert!(
                    wgsl.len() <= PARAM_WORDS && wgsl.len().is_multiple_of(4),
                    "{name}: {} words, not a multiple of 4 up to {PARAM_WORDS}",
                    wgsl.len()
                );
                let (used, pad) = wgsl.split_at(fields.len());
                let rust: Vec<(String, String)> = fields
                    .iter()
                    .map(|&(n, t)| (n.to_string(), t.to_string()))
                    .collect();
                assert_eq!(used, rust.as_slice(), "{name}");
                assert!(pad.iter().all(|(n, t)| n.starts_with("_p") && t == "u32"));
            }
        }
        // Every shader with a `Params` has its struct here.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/wgpu/shaders");
        for entry in std::fs::read_dir(dir).expect("shaders") {
            let path = entry.expect("entry").path();
            let src = std::fs::read_to_string(&path).expect("shader");
            if src.contains("struct Params {") {
                let listed = MIRRORS.iter().any(|m| m.1.contains(&src.as_str()));
                assert!(listed, "{}: no parameter struct", path.display());
            }
        }
    }

    #[test]
    fn blocks_hold_the_fields_in_order() {
        let b = norm_call(64, 0.5, Some(7), 3).params;
        assert_eq!(&b[..6], &[64, 0.5f32.to_bits(), NORM_SELECT, 7, 3, 0]);
        let mut arena = ParamArena::new(256);
        let a = arena.push(&b);
        assert_eq!(arena.push(&silu_call(2, 3).params), 256);
        assert_eq!(arena.push(&b), a);
        assert_eq!(arena.bytes().len(), 512);
        // An alignment smaller than a block: whole blocks, each aligned.
        let mut arena = ParamArena::new(32);
        assert_eq!(arena.push(&b), 0);
        assert_eq!(arena.push(&silu_call(2, 3).params), 96);
        assert_eq!(arena.bytes().len(), 192);
    }
}
