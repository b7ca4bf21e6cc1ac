//! Products on the GPU's matrix units (Vulkan's cooperative matrices, wgpu's
//! `EXPERIMENTAL_COOPERATIVE_MATRIX`): which of the adapter's configurations
//! `shaders/coop_mat_mul.wgsl` can use, the constants it is compiled with and
//! its grid.
//!
//! The kernel multiplies f16 tiles into f32 accumulators: the weights (f32,
//! f16, bf16 or GGUF blocks, unpacked by the same weight preludes as every
//! other product) and x are rounded to f16 as they are stored into
//! workgroup memory. WGSL has square fragments only (`coop_mat8x8`,
//! `coop_mat16x16`), so a configuration is usable when the adapter offers
//! f16 x f16 -> f32 at M = N = K = 8 or 16 with subgroup scope.

use ::wgpu::{CooperativeMatrixProperties, CooperativeScalarType};

/// k values per slab, largest first: each slab of the weight and x tiles is
/// loaded into workgroup memory once (between two barriers), then multiplied
/// in steps of one fragment side. 64 halves the barriers and doubles the
/// loads in flight of 32, which matters where a product has few workgroups
/// (a decode batch through a 2,048-row matrix: 32 of them at 64 rows each),
/// for 22 KiB of workgroup memory at side 16, past WebGPU's 16 KiB
/// minimum: 32 where the adapter allows no more.
const K_SLABS: [u32; 2] = [64, 32];
/// Fewest k slabs per split of a split-k product: shorter splits cost more
/// in partials and their sum than their parallelism gains.
const MIN_SPLIT_SLABS: u32 = 4;
/// Invocations a workgroup may have on every adapter (WebGPU's minimum).
const MAX_INVOCATIONS: u32 = 256;

/// How a workgroup's subgroups cover its output tile (weight rows by
/// tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CoopTile {
    /// Four subgroups in a 2 x 2 grid, each multiplying 2 x 2 fragments:
    /// a tile of 4 fragment sides (64 at side 16), every fragment loaded
    /// from workgroup memory feeding two multiply-adds.
    #[default]
    Square4,
    /// Eight subgroups in a 4 (rows) x 2 (tokens) grid, each multiplying
    /// 2 x 4 fragments: a tile of 8 fragment sides (128 at side 16), half
    /// the loads and the workgroup-memory stores of `Square4` per
    /// multiply-add, for twice the invocations and the tile memory.
    Wide8,
    /// Four subgroups in a 4 (rows) x 1 (tokens) grid, each multiplying
    /// 2 x 2 fragments: 8 fragment sides of weight rows by 2 of tokens
    /// (128 x 32 at side 16), for decode batches that fill 2 sides of
    /// tokens at most. On such a batch a square tile spends half its
    /// multiply-adds (or more) and its x tile on tokens past the batch;
    /// this one spends none there, for the same loads from workgroup
    /// memory per multiply-add as `Square4`.
    Tall4,
}

impl CoopTile {
    /// (GN, GM, FN, FM): the subgroup grid (rows x tokens) and each
    /// subgroup's fragments.
    fn grid(self) -> (u32, u32, u32, u32) {
        match self {
            CoopTile::Square4 => (2, 2, 2, 2),
            CoopTile::Wide8 => (4, 2, 2, 4),
            CoopTile::Tall4 => (4, 1, 2, 2),
        }
    }

    fn subgroups(self) -> u32 {
        let (gn, gm, _, _) = self.grid();
        gn * gm
    }

    /// Fragment sides per tile: (weight rows GN FN, tokens GM FM).
    fn sides(self) -> (u32, u32) {
        let (gn, gm, f_n, f_m) = self.grid();
        (gn * f_n, gm * f_m)
    }
}

/// A cooperative-matrix configuration the product kernel runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopConfig {
    /// Fragment side (M = N = K): 8 or 16.
    pub side: u32,
    /// The adapter's subgroup size (one fixed size: fragments belong to a
    /// subgroup, and the kernel's workgroup is a whole number of them).
    pub subgroup: u32,
    /// k values per slab (64 or 32).
    pub k_slab: u32,
    /// How the subgroups cover the tile.
    pub tile: CoopTile,
    /// Split k over workgroups (partial sums, then their sum by the last
    /// split or by split_sum.wgsl: [`CoopConfig::fold`]) when a product has
    /// fewer tiles than this, to have about this many
    /// workgroups; 0: never ([`super::WgpuOptions::coop_split_workgroups`]).
    pub split_to: u32,
    /// Most bytes of partial sums one split product may write (the
    /// device's largest binding).
    pub split_max_bytes: u64,
    /// A split product's splits are summed by the workgroup of whichever
    /// split finishes last, in the product's own dispatch, rather than by
    /// split_sum.wgsl's second dispatch
    /// ([`super::WgpuOptions::coop_fold_splits`], where the device has
    /// `@coherent` storage buffers).
    pub fold: bool,
}

/// The cooperative-matrix configurations a device has enabled, one per
/// tile; the wide and tall tiles exist only beside the square one, and
/// each only where its workgroup memory fits (the tall one also only where
/// [`super::WgpuOptions::coop_tall`] asks for it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CoopTiles {
    /// [`CoopTile::Square4`]: every coop pass that takes no other tile.
    pub(crate) square: Option<CoopConfig>,
    /// [`CoopTile::Wide8`], for big passes.
    pub(crate) wide: Option<CoopConfig>,
    /// [`CoopTile::Tall4`], for decode batches.
    pub(crate) tall: Option<CoopConfig>,
}

impl CoopTiles {
    /// Every enabled configuration.
    pub(crate) fn all(&self) -> impl Iterator<Item = CoopConfig> {
        [self.square, self.wide, self.tall].into_iter().flatten()
    }

    /// The configuration of `tile`, where enabled.
    pub(crate) fn get(&self, tile: CoopTile) -> Option<CoopConfig> {
        self.all().find(|c| c.tile == tile)
    }

    /// Each configuration changed by `f`.
    pub(crate) fn map(self, f: impl Fn(CoopConfig) -> CoopConfig) -> CoopTiles {
        CoopTiles {
            square: self.square.map(&f),
            wide: self.wide.map(&f),
            tall: self.tall.map(&f),
        }
    }
}

impl CoopConfig {
    /// The best usable configuration among `props` (the adapter's), on an
    /// adapter whose subgroups are `sg_min..=sg_max` wide, which reads f16
    /// (`shader-f16`) and gives a workgroup `max_bytes` of memory:
    /// f16 x f16 -> f32 fragments of side 16 before 8, the largest slab
    /// that fits (only `slab`, where given); none when the subgroup size is
    /// not fixed, or when a tile's loads or results do not divide evenly
    /// among the workgroup's invocations; the subgroups cover the tile as
    /// `tile` says.
    pub(crate) fn pick(
        props: &[CooperativeMatrixProperties],
        sg_min: u32,
        sg_max: u32,
        f16: bool,
        max_bytes: u32,
        slab: Option<u32>,
        tile: CoopTile,
    ) -> Option<CoopConfig> {
        if !f16 || sg_min != sg_max || sg_min == 0 {
            return None;
        }
        let offered = |side: u32| {
            props.iter().any(|p| {
                p.m_size == side
                    && p.n_size == side
                    && p.k_size == side
                    && p.ab_type == CooperativeScalarType::F16
                    && p.cr_type == CooperativeScalarType::F32
            })
        };
        [16, 8]
            .into_iter()
            .filter(|&side| offered(side))
            .flat_map(|side| {
                K_SLABS
                    .into_iter()
                    .filter(|&k| slab.is_none_or(|s| s == k))
                    .map(move |k_slab| CoopConfig {
                        side,
                        subgroup: sg_min,
                        k_slab,
                        tile,
                        split_to: 0,
                        split_max_bytes: 0,
                        fold: false,
                    })
            })
            .find(|c| {
                c.loads_per_invocation(c.tile_rows()) > 0
                    && c.loads_per_invocation(c.tile_tokens()) > 0
                    && c.workgroup() <= MAX_INVOCATIONS
                    && (c.side * c.side).is_multiple_of(c.subgroup)
                    && c.workgroup_bytes() <= max_bytes
            })
    }

    /// Weight rows per workgroup tile.
    pub fn tile_rows(&self) -> u32 {
        self.tile.sides().0 * self.side
    }

    /// Tokens per workgroup tile.
    pub fn tile_tokens(&self) -> u32 {
        self.tile.sides().1 * self.side
    }

    /// Invocations per workgroup.
    pub(crate) fn workgroup(&self) -> u32 {
        self.tile.subgroups() * self.subgroup
    }

    /// 8-value loads per invocation and slab of a tile of `lines` weight
    /// rows or tokens (0: they do not divide evenly among the workgroup's
    /// invocations).
    fn loads_per_invocation(&self, lines: u32) -> u32 {
        let runs = lines * self.k_slab / 8;
        if runs.is_multiple_of(self.workgroup()) {
            runs / self.workgroup()
        } else {
            0
        }
    }

    /// Workgroup memory the kernel declares, in bytes: the f16 weight and x
    /// slabs (rows padded by 8 values), one f32 fragment per subgroup for
    /// the results, and the folded split sum's flag (16 bytes with its
    /// alignment).
    pub(crate) fn workgroup_bytes(&self) -> u32 {
        2 * (self.tile_rows() + self.tile_tokens()) * (self.k_slab + 8)
            + 4 * self.tile.subgroups() * self.side * self.side
            + 16
    }

    /// coop_mat_mul.wgsl's `body` specialised for this configuration: its
    /// constants prepended and its per-fragment code written out (see its
    /// header).
    pub(crate) fn shader(&self, body: &str) -> String {
        let (_, _, f_n, f_m) = self.tile.grid();
        let frags = || (0..f_n).flat_map(move |i| (0..f_m).map(move |j| (i, j)));
        let decls: String = frags()
            .map(|(i, j)| format!("var c_{i}_{j} = FragC();\n    "))
            .collect();
        let a = (0..f_n).map(|i| {
            format!(
                "let a_{i} = coopLoadT<FragA>(&ws[(sn + {i}u * S) * LDS + kk], LDS);\n            "
            )
        });
        let b = (0..f_m).map(|j| {
            format!(
                "let b_{j} = coopLoad<FragB>(&xs[(sm + {j}u * S) * LDS + kk], LDS);\n            "
            )
        });
        let mma = frags().map(|(i, j)| {
            format!("c_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, c_{i}_{j});\n            ")
        });
        let mmas: String = a.chain(b).chain(mma).collect();
        let emits: String = frags()
            .map(|(i, j)| {
                format!(
                    "emit(c_{i}_{j}, sub, lane, n_tile + sn + {i}u * S, m_tile + sm + {j}u * S, z);\n    "
                )
            })
            .collect();
        let body = body
            .replace("FRAG_DECLS", decls.trim_end())
            .replace("FRAG_MMAS", mmas.trim_end())
            .replace("FRAG_EMITS", emits.trim_end());
        format!("{}{body}", self.consts())
    }

    /// The constants coop_mat_mul.wgsl is compiled with (see its header).
    fn consts(&self) -> String {
        let s = self.side;
        let (gn, gm, f_n, f_m) = self.tile.grid();
        format!(
            "const S: u32 = {s}u;\nconst SG: u32 = {sg}u;\nconst WG: u32 = {wg}u;\n\
             const GN: u32 = {gn}u;\nconst GM: u32 = {gm}u;\n\
             const FN: u32 = {f_n}u;\nconst FM: u32 = {f_m}u;\n\
             const TN: u32 = {tn}u;\nconst TM: u32 = {tm}u;\n\
             const BK: u32 = {bk}u;\n\
             const LOADS_W: u32 = {loads_w}u;\nconst LOADS_X: u32 = {loads_x}u;\n\
             alias FragA = coop_mat{s}x{s}<f16, A>;\n\
             alias FragB = coop_mat{s}x{s}<f16, B>;\n\
             alias FragC = coop_mat{s}x{s}<f32, C>;\n",
            sg = self.subgroup,
            wg = self.workgroup(),
            tn = self.tile_rows(),
            tm = self.tile_tokens(),
            bk = self.k_slab,
            loads_w = self.loads_per_invocation(self.tile_rows()),
            loads_x = self.loads_per_invocation(self.tile_tokens()),
        )
    }

    /// Workgroups for `rows` weight rows by `tokens` tokens (`[rows,
    /// tokens]`).
    pub(crate) fn groups(&self, rows: u32, tokens: u32) -> [u32; 2] {
        [
            rows.div_ceil(self.tile_rows()).max(1),
            tokens.div_ceil(self.tile_tokens()).max(1),
        ]
    }

    /// The (rows, tokens) of one split's plane of partial sums for `rows`
    /// weight rows by `tokens` tokens: both padded to whole tiles, so that
    /// every fragment is stored whole, straight from the matrix unit.
    pub(crate) fn part_plane(&self, rows: u32, tokens: u32) -> [u32; 2] {
        let [n, m] = self.groups(rows, tokens);
        [n * self.tile_rows(), m * self.tile_tokens()]
    }

    /// How a product of `rows` weight rows by `tokens` tokens over `k`
    /// inputs splits k: (splits, k values per split, a whole number of
    /// slabs). One split where its tiles already reach
    /// [`CoopConfig::split_to`]; else as many as bring the workgroups to
    /// about that, each at least [`MIN_SPLIT_SLABS`] slabs long, their
    /// partial sums within [`CoopConfig::split_max_bytes`].
    pub(crate) fn k_splits(&self, rows: u32, tokens: u32, k: u32) -> (u32, u32) {
        let [n, m] = self.groups(rows, tokens);
        let tiles = n * m;
        let one = (1, k.max(1));
        if self.split_to == 0 || tiles >= self.split_to {
            return one;
        }
        let slabs = k.div_ceil(self.k_slab);
        let [pn, pm] = self.part_plane(rows, tokens);
        let plane = 4 * pn as u64 * pm as u64;
        let fit = (self.split_max_bytes / plane.max(1)).min(u32::MAX as u64) as u32;
        let want = self
            .split_to
            .div_ceil(tiles)
            .min(slabs / MIN_SPLIT_SLABS)
            .min(fit);
        if want < 2 {
            return one;
        }
        let k_len = slabs.div_ceil(want) * self.k_slab;
        (k.div_ceil(k_len), k_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prop(
        side: u32,
        ab: CooperativeScalarType,
        cr: CooperativeScalarType,
    ) -> CooperativeMatrixProperties {
        CooperativeMatrixProperties {
            m_size: side,
            n_size: side,
            k_size: side,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        }
    }

    #[test]
    fn configurations_are_picked_by_type_side_subgroup_and_memory() {
        use CooperativeScalarType::{F16, F32};
        const KIB: u32 = 1024;
        let cfg = |side, subgroup, k_slab| CoopConfig {
            side,
            subgroup,
            k_slab,
            tile: CoopTile::Square4,
            split_to: 0,
            split_max_bytes: 0,
            fold: false,
        };
        // lavapipe (Mesa 26): 8x8x8, f16 -> f16 and f16 -> f32, subgroups of 8.
        let lvp = [prop(8, F16, F16), prop(8, F16, F32)];
        assert_eq!(
            CoopConfig::pick(&lvp, 8, 8, true, 64 * KIB, None, CoopTile::Square4),
            Some(cfg(8, 8, 64))
        );
        // Without shader-f16, or a subgroup size the driver may vary, none.
        assert_eq!(
            CoopConfig::pick(&lvp, 8, 8, false, 64 * KIB, None, CoopTile::Square4),
            None
        );
        assert_eq!(
            CoopConfig::pick(&lvp, 8, 16, true, 64 * KIB, None, CoopTile::Square4),
            None
        );
        // f16 accumulators only: none.
        assert_eq!(
            CoopConfig::pick(&lvp[..1], 8, 8, true, 64 * KIB, None, CoopTile::Square4),
            None
        );
        // An NVIDIA-like list: side 16, the 64 slab where memory allows.
        let nv = [prop(16, F16, F16), prop(16, F16, F32), prop(8, F16, F32)];
        let c =
            CoopConfig::pick(&nv, 32, 32, true, 48 * KIB, None, CoopTile::Square4).expect("usable");
        assert_eq!(c, cfg(16, 32, 64));
        assert_eq!(
            (c.tile_rows(), c.workgroup(), c.loads_per_invocation(64)),
            (64, 128, 4)
        );
        assert_eq!(c.workgroup_bytes(), 22 * KIB + 16);
        // WebGPU's minimum of 16 KiB: the 32 slab (14 KiB).
        let c =
            CoopConfig::pick(&nv, 32, 32, true, 16 * KIB, None, CoopTile::Square4).expect("usable");
        assert_eq!(c, cfg(16, 32, 32));
        assert_eq!(
            (c.loads_per_invocation(64), c.workgroup_bytes()),
            (2, 14 * KIB + 16)
        );
        // A slab asked for, where it fits.
        let c = CoopConfig::pick(&nv, 32, 32, true, 48 * KIB, Some(32), CoopTile::Square4);
        assert_eq!(c, Some(cfg(16, 32, 32)));
        // Too little memory even for side 8's 32 slab (5 KiB): none.
        assert_eq!(
            CoopConfig::pick(&lvp, 8, 8, true, 4 * KIB, None, CoopTile::Square4),
            None
        );
        // Subgroups of 64 with 16-wide fragments and the 32 slab: one load each.
        let c = CoopConfig::pick(&nv, 64, 64, true, 48 * KIB, Some(32), CoopTile::Square4)
            .expect("usable");
        assert_eq!(c.loads_per_invocation(64), 1);
        // 8-wide fragments and subgroups of 64: an 8 x 8 result fragment is
        // 64 values for 64 invocations, but a 32-row slab of 32 has 128 runs
        // of 8 for 256 invocations: only the 64 slab works.
        assert_eq!(
            CoopConfig::pick(&lvp, 64, 64, true, 64 * KIB, Some(32), CoopTile::Square4),
            None
        );
        assert_eq!(
            CoopConfig::pick(&lvp, 64, 64, true, 64 * KIB, None, CoopTile::Square4),
            Some(cfg(8, 64, 64))
        );
        let c = cfg(8, 8, 32);
        assert_eq!(c.groups(65, 1), [3, 1]);
        assert_eq!(c.groups(0, 64), [1, 2]);
    }

    #[test]
    fn wide_tiles_take_eight_subgroups_over_eight_sides() {
        use CooperativeScalarType::{F16, F32};
        const KIB: u32 = 1024;
        let nv = [prop(16, F16, F32)];
        let wide = |max, slab| CoopConfig::pick(&nv, 32, 32, true, max, slab, CoopTile::Wide8);
        let c = wide(48 * KIB, None).expect("usable");
        assert_eq!(
            (
                c.tile_rows(),
                c.workgroup(),
                c.k_slab,
                c.loads_per_invocation(c.tile_tokens())
            ),
            (128, 256, 64, 4)
        );
        assert_eq!(c.workgroup_bytes(), 44 * KIB + 16);
        assert_eq!(c.groups(2048, 32), [16, 1]);
        // 32 KiB: the 32 slab (28 KiB); 16 KiB: none.
        assert_eq!(wide(32 * KIB, None).map(|c| c.k_slab), Some(32));
        assert_eq!(wide(16 * KIB, None), None);
        // Subgroups of 64 would make 512 invocations: none.
        assert_eq!(
            CoopConfig::pick(&nv, 64, 64, true, 64 * KIB, None, CoopTile::Wide8),
            None
        );
        // lavapipe's 8 x 8 fragments in subgroups of 8: 64 x 64 tiles.
        let lvp = [prop(8, F16, F32)];
        let c = CoopConfig::pick(&lvp, 8, 8, true, 64 * KIB, None, CoopTile::Wide8);
        assert_eq!(c.map(|c| (c.tile_rows(), c.workgroup())), Some((64, 64)));
    }

    #[test]
    fn tall_tiles_cover_eight_sides_of_rows_by_two_of_tokens() {
        use CooperativeScalarType::{F16, F32};
        const KIB: u32 = 1024;
        let nv = [prop(16, F16, F32)];
        let tall = |max, slab| CoopConfig::pick(&nv, 32, 32, true, max, slab, CoopTile::Tall4);
        let c = tall(48 * KIB, None).expect("usable");
        assert_eq!(
            (c.tile_rows(), c.tile_tokens(), c.workgroup(), c.k_slab),
            (128, 32, 128, 64)
        );
        // 128 rows of 8 runs over 128 invocations; 32 tokens' 256 runs.
        assert_eq!(
            (c.loads_per_invocation(128), c.loads_per_invocation(32)),
            (8, 2)
        );
        assert_eq!(c.workgroup_bytes(), 2 * 160 * 72 + 4 * 4 * 256 + 16);
        // A 32-sequence decode batch through a 2,048-row matrix: one token
        // tile, 16 of rows; 33 sequences take a second token tile.
        assert_eq!(c.groups(2048, 32), [16, 1]);
        assert_eq!(c.groups(2048, 33), [16, 2]);
        // 24 KiB: the 32 slab (16.5 KiB); 16 KiB: none.
        assert_eq!(tall(24 * KIB, None).map(|c| c.k_slab), Some(32));
        assert_eq!(tall(16 * KIB, None), None);
        // Subgroups of 64 and the 32 slab: the x tile's 128 runs are fewer
        // than the 256 invocations; the 64 slab gives each one.
        let wave64 = |slab| CoopConfig::pick(&nv, 64, 64, true, 64 * KIB, slab, CoopTile::Tall4);
        assert_eq!(wave64(Some(32)), None);
        assert_eq!(wave64(None).map(|c| c.k_slab), Some(64));
        // lavapipe's 8 x 8 fragments in subgroups of 8: 64 x 16 tiles.
        let lvp = [prop(8, F16, F32)];
        let c = CoopConfig::pick(&lvp, 8, 8, true, 64 * KIB, None, CoopTile::Tall4);
        assert_eq!(
            c.map(|c| (c.tile_rows(), c.tile_tokens(), c.workgroup())),
            Some((64, 16, 32))
        );
    }

    #[test]
    fn the_shader_gets_every_fragment_written_out() {
        let body = include_str!("shaders/coop_mat_mul.wgsl");
        for (tile, frags) in [
            (CoopTile::Square4, 4),
            (CoopTile::Wide8, 8),
            (CoopTile::Tall4, 4),
        ] {
            let c = CoopConfig {
                side: 16,
                subgroup: 32,
                k_slab: 64,
                tile,
                split_to: 0,
                split_max_bytes: 0,
                fold: false,
            };
            let src = c.shader(body);
            assert!(!src.contains("FRAG_"), "{tile:?}: a placeholder left");
            assert_eq!(src.matches("coopMultiplyAdd(").count(), frags, "{tile:?}");
            assert_eq!(src.matches("emit(c_").count(), frags, "{tile:?}");
            let (_, _, f_n, f_m) = tile.grid();
            assert_eq!(src.matches("coopLoadT<FragA>").count(), f_n as usize);
            assert_eq!(src.matches("coopLoad<FragB>").count(), f_m as usize);
        }
    }

    #[test]
    fn k_splits_fill_the_target_within_their_bounds() {
        let c = CoopConfig {
            side: 16,
            subgroup: 32,
            k_slab: 64,
            tile: CoopTile::Square4,
            split_to: 512,
            split_max_bytes: 1 << 27,
            fold: false,
        };
        // A decode batch of 32 through TinyLlama's down matrix (2,048 rows,
        // 5,632 inputs): 32 tiles, 16 splits of 6 slabs (384 values).
        assert_eq!(c.k_splits(2048, 32, 5632), (15, 384));
        // Its o matrix (2,048 inputs): 32 slabs allow 8 splits of 4.
        assert_eq!(c.k_splits(2048, 32, 2048), (8, 256));
        // Enough tiles already (gate|up, 176 x 8 for a 512-token prefill):
        // one split of all k.
        assert_eq!(c.k_splits(11264, 512, 2048), (1, 2048));
        // Too short a k to split.
        assert_eq!(c.k_splits(64, 1, 200), (1, 200));
        // Off.
        let off = CoopConfig { split_to: 0, ..c };
        assert_eq!(off.k_splits(2048, 32, 5632), (1, 5632));
        // The partials bounded by the binding: a plane is padded to whole
        // tiles (32 tokens to 64), and 3 such planes fit, not 4.
        assert_eq!(c.part_plane(2048, 32), [2048, 64]);
        assert_eq!(c.part_plane(2000, 33), [2048, 64]);
        let small = CoopConfig {
            split_max_bytes: 3 * 4 * 2048 * 64,
            fold: false,
            ..c
        };
        assert_eq!(small.k_splits(2048, 32, 5632), (3, 1920));
        let smaller = CoopConfig {
            split_max_bytes: 3 * 4 * 2048 * 64 - 1,
            ..small
        };
        assert_eq!(smaller.k_splits(2048, 32, 5632), (2, 2816));
        // Every k value in exactly one split, each a whole number of slabs.
        for k in [1, 63, 64, 65, 255, 256, 1000, 5632, 14336] {
            for rows in [1, 64, 2048] {
                let (n, len) = c.k_splits(rows, 32, k);
                assert!(n >= 1 && n * len >= k && (n - 1) * len < k, "{k} {rows}");
                assert!(n == 1 || len % c.k_slab == 0, "{k} {rows}");
                if n > 1 {
                    assert!(len / c.k_slab >= MIN_SPLIT_SLABS, "{k} {rows}");
                }
            }
        }
    }
}
