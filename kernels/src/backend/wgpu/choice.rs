//! Which kernel multiplies a pass's token rows through the weights: mat-vec
//! groups, the tiled matmul, or the tiled matmul on cooperative matrices.

use super::coop::{CoopConfig, CoopTiles};
use super::pipelines::Kernel;

/// The product kernel for each pass size, fixed when the backend opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelChoice {
    /// Passes of more token rows than this use the tiled matmul; `None`:
    /// mat-vec groups (on CPU adapters, where barriers are slow).
    pub(crate) tiled_above: Option<u32>,
    /// Passes of at least this many token rows use cooperative matrices of
    /// this configuration, before either of the others; `None`: never.
    pub(crate) coop_from: Option<(CoopConfig, u32)>,
    /// Passes of at least this many rows take this (wide-tile)
    /// configuration instead, where coop applies at all.
    pub(crate) wide_from: Option<(CoopConfig, u32)>,
    /// Passes that fit in this (tall-tile) configuration's tokens take it
    /// instead, where coop applies and the wide tile does not.
    pub(crate) tall: Option<CoopConfig>,
}

impl KernelChoice {
    /// The choice on a device with these coop configurations, coop from
    /// `coop_rows` token rows, its wide tile from `wide_rows` and its tall
    /// tile up to the tall tile's tokens, else the tiled matmul above
    /// `tiled_above`.
    pub(crate) fn new(
        coop: CoopTiles,
        coop_rows: usize,
        wide_rows: usize,
        tiled_above: Option<u32>,
    ) -> KernelChoice {
        let rows = |n: usize| n.clamp(1, u32::MAX as usize) as u32;
        KernelChoice {
            tiled_above,
            coop_from: coop.square.map(|c| (c, rows(coop_rows))),
            wide_from: coop.wide.map(|c| (c, rows(wide_rows))),
            tall: coop.tall,
        }
    }

    /// The kernel for a pass of `rows` token rows.
    pub(crate) fn for_rows(&self, rows: u32) -> Kernel {
        match (self.coop_from, self.wide_from, self.tall) {
            (Some((_, from)), Some((w, wide)), _) if rows >= from && rows >= wide => {
                Kernel::Coop(w)
            }
            (Some((_, from)), _, Some(t)) if rows >= from && rows <= t.tile_tokens() => {
                Kernel::Coop(t)
            }
            (Some((c, from)), _, _) if rows >= from => Kernel::Coop(c),
            _ if self.tiled_above.is_some_and(|n| rows > n) => Kernel::Tiled,
            _ => Kernel::MatVec,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::coop::CoopTile;
    use super::*;

    /// A configuration of fragment side `side` in subgroups of `subgroup`,
    /// with `tile`.
    fn config(side: u32, subgroup: u32, tile: CoopTile) -> CoopConfig {
        CoopConfig {
            side,
            subgroup,
            k_slab: 32,
            tile,
            split_to: 0,
            split_max_bytes: 0,
            fold: false,
        }
    }

    #[test]
    fn passes_take_coop_then_tiled_then_mat_vec() {
        let c = config(8, 8, CoopTile::Square4);
        let w = config(8, 8, CoopTile::Wide8);
        let gpu = KernelChoice {
            tiled_above: Some(64),
            coop_from: Some((c, 16)),
            wide_from: Some((w, 128)),
            tall: None,
        };
        assert_eq!(gpu.for_rows(1), Kernel::MatVec);
        assert_eq!(gpu.for_rows(15), Kernel::MatVec);
        assert_eq!(gpu.for_rows(16), Kernel::Coop(c));
        assert_eq!(gpu.for_rows(127), Kernel::Coop(c));
        assert_eq!(gpu.for_rows(128), Kernel::Coop(w));
        assert_eq!(gpu.for_rows(500), Kernel::Coop(w));
        // Without the wide tile (it did not fit): the default one.
        let square = KernelChoice {
            wide_from: None,
            ..gpu
        };
        assert_eq!(square.for_rows(500), Kernel::Coop(c));
        // The wide tile only where coop applies at all.
        let wide_early = KernelChoice {
            coop_from: Some((c, 64)),
            wide_from: Some((w, 1)),
            ..gpu
        };
        assert_eq!(wide_early.for_rows(63), Kernel::MatVec);
        assert_eq!(wide_early.for_rows(64), Kernel::Coop(w));
        let no_coop = KernelChoice {
            coop_from: None,
            ..gpu
        };
        assert_eq!(no_coop.for_rows(64), Kernel::MatVec);
        assert_eq!(no_coop.for_rows(65), Kernel::Tiled);
        assert_eq!(no_coop.for_rows(500), Kernel::Tiled);
        let cpu = KernelChoice {
            tiled_above: None,
            coop_from: None,
            wide_from: None,
            tall: None,
        };
        assert_eq!(cpu.for_rows(500), Kernel::MatVec);
        // Coop past the tiled threshold only.
        let late = KernelChoice {
            tiled_above: Some(8),
            coop_from: Some((c, 128)),
            wide_from: None,
            tall: None,
        };
        assert_eq!(late.for_rows(100), Kernel::Tiled);
        assert_eq!(late.for_rows(128), Kernel::Coop(c));
    }

    #[test]
    fn decode_batches_that_fit_the_tall_tile_take_it() {
        let c = config(16, 32, CoopTile::Square4);
        let w = config(16, 32, CoopTile::Wide8);
        let t = config(16, 32, CoopTile::Tall4);
        assert_eq!(t.tile_tokens(), 32);
        let all = CoopTiles {
            square: Some(c),
            wide: Some(w),
            tall: Some(t),
        };
        let gpu = KernelChoice::new(all, 16, 128, Some(64));
        assert_eq!(gpu.for_rows(15), Kernel::MatVec);
        assert_eq!(gpu.for_rows(16), Kernel::Coop(t));
        assert_eq!(gpu.for_rows(32), Kernel::Coop(t));
        assert_eq!(gpu.for_rows(33), Kernel::Coop(c));
        assert_eq!(gpu.for_rows(128), Kernel::Coop(w));
        // The wide tile asked for every pass wins over the tall one.
        let wide_all = KernelChoice::new(all, 1, 1, None);
        assert_eq!(wide_all.for_rows(8), Kernel::Coop(w));
        // Without coop, no tall tile either.
        let tall_only = CoopTiles {
            tall: Some(t),
            ..CoopTiles::default()
        };
        let off = KernelChoice::new(tall_only, 16, 128, Some(64));
        assert_eq!(off.for_rows(32), Kernel::MatVec);
    }
}
