//! Attention's kernels as the host plans them, for the backend and the
//! kernel lab alike: the shape constants they are compiled with, the
//! planners of their parameter blocks ([`super::params`]), and how decode
//! attention splits a pass's contexts over workgroups (flash-decoding).

use super::context::grid;
use super::params::{Call, DecodeParams, MergeParams, PrefillParams, RopeKvParams};
use super::pipelines::RopeFuse;
use super::plan::Pass;

/// Invocations per prefill attention workgroup: one per (query row, query
/// head) of a tile, and the rest (where the heads do not divide it) idle
/// but for the loads.
const PREFILL_WG: u32 = 64;
/// Values of the prefill kernel's K and V tiles together (f32): 16 KiB.
const PREFILL_KV_VALUES: u32 = 2048;
/// Positions per tile of the decode attention kernel (its `TILE`).
const DECODE_TILE: u32 = 64;
/// Invocations per decode attention workgroup (its `WG`).
const DECODE_WG: u32 = 64;
/// Most P V slots of the decode kernel: each adds a round of slot
/// accumulators to workgroup memory at the end.
const MAX_SLOTS: u32 = 4;
/// Most context splits per decode row; attn_merge.wgsl keeps one weight
/// per split in workgroup memory.
pub(crate) const MAX_SPLITS: u32 = 256;
/// Most vectors of a K row the decode kernel loads before their dot
/// products (its `KCH`): a head_dim of 64 in one go, wider heads in
/// chunks, so the loads stay in registers.
const K_CHUNK: u32 = 16;

/// The K row vectors the decode kernel loads together ([`K_CHUNK`] at
/// most): `chosen`, else [`K_CHUNK`] on GPUs, where many loads in flight
/// should shorten a workgroup's chain of memory round trips (not yet
/// measured on one), and 1 on CPU adapters, where lavapipe measured the
/// row loaded a vector at a time faster (attn_decode 13.3-13.6 ms a step
/// against 14.5-14.7 with 16: 2 layers, 128 cached tokens, 64 workgroups;
/// BENCHMARKS.md).
pub(crate) fn decode_k_chunk(cpu_adapter: bool, chosen: Option<u32>) -> u32 {
    chosen
        .unwrap_or(if cpu_adapter { 1 } else { K_CHUNK })
        .clamp(1, K_CHUNK)
}
/// Most positions one decode workgroup visits (when the binding allows
/// that many splits): 16 tiles, far below llvmpipe's cap on the loop
/// iterations of an invocation, and a bound on any one workgroup's time.
const MAX_SPLIT_LEN: u32 = 1024;

/// Shape constants the attention kernels are specialised for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AttnShape {
    /// Head width (even).
    pub(crate) head_dim: u32,
    /// Query heads per KV head.
    pub(crate) group: u32,
}

impl AttnShape {
    /// Query heads per decode workgroup: the largest divisor of the group
    /// with at most 8 heads and 1024 query values (workgroup memory stays
    /// under 16 KiB). The K and V rows are read once per such set of heads.
    pub(crate) fn heads_per_wg(&self) -> u32 {
        (1..=self.group.min(8))
            .rev()
            .find(|&h| self.group.is_multiple_of(h) && h * self.head_dim <= 1024)
            .unwrap_or(1)
    }

    /// Query heads per prefill workgroup: the largest divisor of the group
    /// with at most 8 heads (they share the workgroup's K and V tiles).
    pub(crate) fn prefill_heads(&self) -> u32 {
        (1..=self.group.min(8))
            .rev()
            .find(|&h| self.group.is_multiple_of(h))
            .unwrap_or(1)
    }

    /// Rows per prefill query tile: one invocation per (row, head) of
    /// [`AttnShape::prefill_heads`], [`PREFILL_WG`] at most.
    pub(crate) fn prefill_rows(&self) -> u32 {
        (PREFILL_WG / self.prefill_heads()).max(1)
    }

    /// Key positions per prefill K/V tile: both tiles in 16 KiB of
    /// workgroup memory (WebGPU's minimum), at most 64.
    pub(crate) fn prefill_keys(&self) -> u32 {
        (PREFILL_KV_VALUES / self.head_dim.max(1)).clamp(1, 64)
    }

    /// The constants attn_decode.wgsl is compiled with (see its header),
    /// loading `k_chunk` vectors of a K row together.
    pub(crate) fn decode_consts(&self, k_chunk: u32) -> String {
        let hg = self.heads_per_wg();
        let hd = self.head_dim;
        let vw = if hd.is_multiple_of(4) { 4 } else { 2 };
        let nc = hd / vw;
        let lps = nc.clamp(1, DECODE_WG);
        let cpl = nc.div_ceil(lps);
        let nslot = (DECODE_WG / lps).clamp(1, MAX_SLOTS);
        // A power of two, so each head's reducers stride the tile evenly.
        let r = 1u32 << (DECODE_WG / hg).min(8).ilog2();
        let obuf = ((nslot - 1) * hg * cpl * lps).max(1);
        let kch = nc.min(k_chunk.clamp(1, K_CHUNK));
        let opi = (hg * nc).div_ceil(DECODE_WG);
        format!(
            "const HEAD_DIM: u32 = {hd}u;\nconst TILE: u32 = {DECODE_TILE}u;\n\
             const HG: u32 = {hg}u;\nconst VW: u32 = {vw}u;\n\
             alias VT = vec{vw}<f32>;\nconst NC: u32 = {nc}u;\nconst LPS: u32 = {lps}u;\n\
             const CPL: u32 = {cpl}u;\nconst NSLOT: u32 = {nslot}u;\nconst R: u32 = {r}u;\n\
             const OBUF_LEN: u32 = {obuf}u;\nconst KCH: u32 = {kch}u;\nconst OPI: u32 = {opi}u;\n"
        )
    }

    /// The constants attn_prefill.wgsl is compiled with (see its header).
    pub(crate) fn prefill_consts(&self) -> String {
        let hd = self.head_dim;
        let vw = if hd.is_multiple_of(4) { 4 } else { 2 };
        let hg = self.prefill_heads();
        let rt = self.prefill_rows();
        format!(
            "const HEAD_DIM: u32 = {hd}u;\nconst VW: u32 = {vw}u;\nalias VT = vec{vw}<f32>;\n\
             const NV: u32 = {nv}u;\nconst HG: u32 = {hg}u;\nconst RT: u32 = {rt}u;\n\
             const WG: u32 = {wg}u;\nconst KT: u32 = {kt}u;\n",
            nv = hd / vw,
            wg = PREFILL_WG,
            kt = self.prefill_keys(),
        )
    }
}

/// The constants attn_merge.wgsl is compiled with.
pub(crate) fn merge_consts() -> String {
    format!("const MAX_SPLITS: u32 = {MAX_SPLITS}u;\n")
}

/// How decode attention spreads a pass's contexts over workgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPolicy {
    /// Aim for about this many workgroups in a decode dispatch: a pass's
    /// rows times KV heads (times head groups) times context splits. A
    /// large GPU needs several hundred to have every core busy.
    pub workgroups: u32,
    /// Fewest positions per split: shorter splits cost more in partials
    /// and merging than their parallelism gains.
    pub min_len: u32,
    /// Merge a row's splits in the workgroup of whichever split finishes
    /// last (attn_decode.wgsl's `fold`: one dispatch), instead of in a
    /// second dispatch of attn_merge.wgsl; taken only where the device has
    /// `@coherent` storage buffers (every Vulkan adapter).
    pub fold: bool,
}

/// The model side of a pass's attention: what every kernel's parameters
/// take from the model and the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnModel {
    pub(crate) shape: AttnShape,
    pub(crate) q_heads: u32,
    pub(crate) kv_heads: u32,
    /// Width of a q|k|v row.
    pub(crate) stride: u32,
    /// KV block size.
    pub(crate) bs: u32,
    /// The epsilon of the per-head query and key norms (Qwen3), if the
    /// model has them.
    pub(crate) qk_norm_eps: Option<f32>,
}

impl AttnModel {
    fn scale(&self) -> f32 {
        1.0 / (self.shape.head_dim as f32).sqrt()
    }
}

/// A pass's decode attention: the decode dispatch, the merge when the
/// contexts are split and not folded, and the bytes of partials and split
/// counters that needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeCalls {
    pub(crate) decode: Call,
    pub(crate) merge: Option<Call>,
    pub(crate) part_bytes: u64,
    /// Bytes of the folded merge's counters (one u32 per decode workgroup
    /// of a split); 0 without folding.
    pub(crate) count_bytes: u64,
    /// Splits per row, and positions per split.
    pub(crate) n_splits: u32,
    pub(crate) split_len: u32,
}

/// Splits per row and positions per split for `units` workgroups per split
/// (rows x KV heads x head groups), the longest context `max_ctx`, and
/// `split_bytes` of partials per split (`max_binding` bounds them all):
/// as many as the policy's workgroup target asks, no shorter than its
/// minimum, no longer than [`MAX_SPLIT_LEN`] where the binding allows.
pub(crate) fn splits(
    units: u32,
    max_ctx: u32,
    policy: SplitPolicy,
    split_bytes: u64,
    max_binding: u64,
) -> (u32, u32) {
    let ctx = max_ctx.max(1);
    let want = policy.workgroups.div_ceil(units.max(1));
    let most = ctx.div_ceil(policy.min_len.max(1));
    let least = ctx.div_ceil(MAX_SPLIT_LEN);
    let fit = (max_binding / split_bytes.max(1)).clamp(1, MAX_SPLITS as u64) as u32;
    let n = want.min(most).max(least).clamp(1, fit);
    let len = ctx.div_ceil(n);
    (ctx.div_ceil(len), len)
}

/// RoPE on the rows of `p` (after the per-head norms, if the model has
/// them) and the write of their keys and values into the cache: one
/// invocation per (row, rotated head, pair), whole heads in a workgroup of
/// 256 (`head_dim` at most 512).
pub(crate) fn rope_kv_call(m: &AttnModel, p: &Pass) -> Call {
    let half = m.shape.head_dim / 2;
    let heads_per_wg = (256 / half.max(1)).max(1);
    let n = p.rows * (m.q_heads + m.kv_heads);
    RopeKvParams {
        n_rows: p.rows,
        q_heads: m.q_heads,
        kv_heads: m.kv_heads,
        half,
        stride: m.stride,
        cs_off: p.cos_off,
        sn_off: p.sin_off,
        slot_off: p.slot_off,
        bs: m.bs,
        flags: u32::from(m.qk_norm_eps.is_some()),
        eps: m.qk_norm_eps.unwrap_or(0.0),
    }
    .call(grid(n.div_ceil(heads_per_wg)))
}

/// What the q|k|v mat-vec of the rows of `p` needs to do `rope_kv_call`'s
/// work itself (mat_vec.wgsl's RoPE variant): the same angles, slots and
/// heads.
pub(crate) fn rope_fuse(m: &AttnModel, p: &Pass) -> RopeFuse {
    RopeFuse {
        half: m.shape.head_dim / 2,
        q_heads: m.q_heads,
        kv_heads: m.kv_heads,
        cs_off: p.cos_off,
        sn_off: p.sin_off,
        slot_off: p.slot_off,
        bs: m.bs,
    }
}

/// The decode attention of the decode rows of `p` (`p.n_dec` > 0) under
/// `policy`, on a device whose bindings hold `max_binding` bytes at most
/// and which has `@coherent` storage buffers or not (`coherent`): the
/// folded merge reads the partials other workgroups wrote in the same
/// dispatch, which only coherent storage promises, so without it the
/// splits are merged by their own dispatch whatever the policy says.
pub(crate) fn decode_calls(
    m: &AttnModel,
    p: &Pass,
    policy: SplitPolicy,
    max_binding: u64,
    coherent: bool,
) -> DecodeCalls {
    let hd = m.shape.head_dim;
    let hgroups = m.shape.group / m.shape.heads_per_wg();
    let units = p.n_dec * m.kv_heads * hgroups;
    let split_bytes = 4 * p.n_dec as u64 * m.q_heads as u64 * (hd as u64 + 2);
    let (n_splits, split_len) = splits(units, p.max_dec_ctx, policy, split_bytes, max_binding);
    let ml_off = p.n_dec * m.q_heads * n_splits * hd;
    let fold = policy.fold && coherent && n_splits > 1;
    let decode = DecodeParams {
        n_items: p.n_dec,
        dec_off: p.dec_off,
        pos_off: p.pos_off,
        rt_off: p.rt_off,
        kv_heads: m.kv_heads,
        group: m.shape.group,
        stride: m.stride,
        q_heads: m.q_heads,
        bs: m.bs,
        split_len,
        n_splits,
        scale: m.scale(),
        ml_off,
        hgroups,
        fold: fold as u32,
    };
    let merge = (n_splits > 1 && !fold).then(|| {
        MergeParams {
            n_items: p.n_dec,
            dec_off: p.dec_off,
            q_heads: m.q_heads,
            n_splits,
            ml_off,
            hd,
        }
        .call(grid(p.n_dec * m.q_heads))
    });
    DecodeCalls {
        decode: decode.call([units, n_splits]),
        merge,
        part_bytes: if n_splits > 1 {
            split_bytes * n_splits as u64
        } else {
            0
        },
        count_bytes: if fold { 4 * units as u64 } else { 0 },
        n_splits,
        split_len,
    }
}

/// The prefill attention of the tiles of `p`.
pub(crate) fn prefill_call(m: &AttnModel, p: &Pass) -> Call {
    PrefillParams {
        tile_off: p.tile_off,
        pos_off: p.pos_off,
        rt_off: p.rt_off,
        kv_heads: m.kv_heads,
        group: m.shape.group,
        stride: m.stride,
        q_heads: m.q_heads,
        bs: m.bs,
        scale: m.scale(),
        n_tiles: p.n_tiles,
    }
    .call([p.n_tiles, m.q_heads / m.shape.prefill_heads()])
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDE: SplitPolicy = SplitPolicy {
        workgroups: 512,
        min_len: 32,
        fold: true,
    };

    #[test]
    fn k_chunk_defaults_by_adapter_and_stays_in_range() {
        assert_eq!(decode_k_chunk(true, None), 1);
        assert_eq!(decode_k_chunk(false, None), K_CHUNK);
        assert_eq!(decode_k_chunk(false, Some(4)), 4);
        assert_eq!(decode_k_chunk(true, Some(0)), 1);
        assert_eq!(decode_k_chunk(true, Some(1000)), K_CHUNK);
    }

    #[test]
    fn splits_fill_the_target_within_their_bounds() {
        let mb = 1 << 27;
        // One row, 4 KV heads, 150 positions: as many splits as 32-position
        // minimums allow.
        assert_eq!(splits(4, 150, WIDE, 1000, mb), (5, 30));
        // 1,024 positions: 32 splits of 32 (128 workgroups).
        assert_eq!(splits(4, 1024, WIDE, 1000, mb), (32, 32));
        // 8,192: the target (512 / 4 = 128 splits of 64).
        assert_eq!(splits(4, 8192, WIDE, 1000, mb), (128, 64));
        // 64 rows x 4 heads at 8,192: the target wants 2, the length cap 8.
        assert_eq!(splits(256, 8192, WIDE, 1000, mb), (8, 1024));
        // Short contexts: one split.
        assert_eq!(splits(256, 16, WIDE, 1000, mb), (1, 16));
        assert_eq!(splits(4, 1, WIDE, 1000, mb), (1, 1));
        // The binding bounds the partials: 3 splits fit.
        assert_eq!(splits(4, 1024, WIDE, 1000, 3000), (3, 342));
        // Never more than MAX_SPLITS, and every position covered.
        for ctx in [1, 2, 31, 33, 100, 1000, 4097, 65_536, 300_000] {
            for min_len in [1, 7, 32, 5000] {
                let policy = SplitPolicy {
                    workgroups: 1 << 20,
                    min_len,
                    fold: false,
                };
                let (n, len) = splits(1, ctx, policy, 1, mb);
                assert!((1..=MAX_SPLITS).contains(&n), "{ctx} {min_len}");
                assert!(n * len >= ctx && (n - 1) * len < ctx, "{ctx} {min_len}");
            }
        }
    }

    #[test]
    fn attention_specialisation_fits_workgroup_memory() {
        for head_dim in [2, 4, 6, 8, 10, 16, 34, 64, 80, 96, 128, 130, 256, 512] {
            for group in [1, 2, 3, 4, 7, 8, 16] {
                let s = AttnShape { head_dim, group };
                let (rt, hg, kt) = (s.prefill_rows(), s.prefill_heads(), s.prefill_keys());
                assert!(rt >= 1 && group % hg == 0 && rt * hg <= PREFILL_WG);
                // K and V tiles, of at least one position.
                assert!(kt >= 1 && (2 * kt * head_dim * 4 <= 16 * 1024 || kt == 1));
                let k_chunk = [1, 5, K_CHUNK][(head_dim % 3) as usize];
                let consts = s.decode_consts(k_chunk);
                let get = |name: &str| -> u32 {
                    let at = consts.find(&format!("const {name}: u32 = ")).expect(name);
                    let rest = &consts[at + name.len() + 14..];
                    rest[..rest.find('u').expect("u")].parse().expect("number")
                };
                let (hg, vw, nc, lps, cpl, nslot, r) = (
                    get("HG"),
                    get("VW"),
                    get("NC"),
                    get("LPS"),
                    get("CPL"),
                    get("NSLOT"),
                    get("R"),
                );
                assert_eq!(group % hg, 0);
                assert!(hg * head_dim <= 1024 || hg == 1);
                assert_eq!(nc * vw, head_dim);
                assert!(lps * cpl >= nc && lps * nslot <= DECODE_WG);
                assert!(r.is_power_of_two() && hg * r <= DECODE_WG);
                // qs, two score tiles, the two reductions, the slot sums,
                // the fold's flag.
                let bytes = 4
                    * (hg * head_dim
                        + 2 * hg * DECODE_TILE
                        + 2 * hg * r
                        + get("OBUF_LEN") * vw
                        + 1);
                // The K chunk as asked, within the row; the fold's outputs
                // cover every vector of the HG heads.
                let (kch, opi) = (get("KCH"), get("OPI"));
                assert_eq!(kch, k_chunk.min(nc));
                assert!(opi * DECODE_WG >= hg * nc && (opi - 1) * DECODE_WG < hg * nc);
                assert!(bytes <= 16 * 1024, "{s:?}: {bytes} bytes");
            }
        }
    }
}
