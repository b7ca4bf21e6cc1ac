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

/// k values per slab: each slab of the weight and x tiles is loaded into
/// workgroup memory once, then multiplied in steps of one fragment side.
const K_SLAB: u32 = 32;
/// Subgroups per workgroup, as a 2 x 2 grid over the output tile; each
/// computes 2 x 2 fragments. So a workgroup's tile is 4 fragment sides of
/// weight rows by 4 of tokens, and every fragment loaded from workgroup
/// memory feeds two multiply-adds.
const SUBGROUPS: u32 = 4;

/// A cooperative-matrix configuration the product kernel runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopConfig {
    /// Fragment side (M = N = K): 8 or 16.
    pub side: u32,
    /// The adapter's subgroup size (one fixed size: fragments belong to a
    /// subgroup, and the kernel's workgroup is a whole number of them).
    pub subgroup: u32,
}

impl CoopConfig {
    /// The best usable configuration among `props` (the adapter's), on an
    /// adapter whose subgroups are `sg_min..=sg_max` wide and which reads f16
    /// (`shader-f16`): f16 x f16 -> f32 fragments of side 16 before 8; none
    /// when the subgroup size is not fixed, or when a tile's loads or
    /// results do not divide evenly among the workgroup's invocations.
    pub(crate) fn pick(
        props: &[CooperativeMatrixProperties],
        sg_min: u32,
        sg_max: u32,
        f16: bool,
    ) -> Option<CoopConfig> {
        if !f16 || sg_min != sg_max || sg_min == 0 {
            return None;
        }
        [16, 8]
            .into_iter()
            .filter(|&side| {
                props.iter().any(|p| {
                    p.m_size == side
                        && p.n_size == side
                        && p.k_size == side
                        && p.ab_type == CooperativeScalarType::F16
                        && p.cr_type == CooperativeScalarType::F32
                })
            })
            .map(|side| CoopConfig {
                side,
                subgroup: sg_min,
            })
            .find(|c| c.loads_per_invocation() > 0 && (c.side * c.side).is_multiple_of(c.subgroup))
    }

    /// Weight rows (and tokens) per workgroup tile.
    pub(crate) fn tile_rows(&self) -> u32 {
        4 * self.side
    }

    /// Invocations per workgroup.
    pub(crate) fn workgroup(&self) -> u32 {
        SUBGROUPS * self.subgroup
    }

    /// 8-value loads of each tile per invocation and slab (0: the
    /// workgroup has more invocations than a slab has 8-value runs).
    fn loads_per_invocation(&self) -> u32 {
        let runs = self.tile_rows() * K_SLAB / 8;
        if runs.is_multiple_of(self.workgroup()) {
            runs / self.workgroup()
        } else {
            0
        }
    }

    /// Workgroup memory the kernel declares, in bytes: the f16 weight and x
    /// slabs (rows padded by 8 values), and one f32 fragment per subgroup
    /// for the results.
    pub(crate) fn workgroup_bytes(&self) -> u32 {
        2 * 2 * self.tile_rows() * (K_SLAB + 8) + 4 * SUBGROUPS * self.side * self.side
    }

    /// The constants coop_mat_mul.wgsl is compiled with (see its header).
    pub(crate) fn consts(&self) -> String {
        let s = self.side;
        format!(
            "const S: u32 = {s}u;\nconst SG: u32 = {sg}u;\nconst WG: u32 = {wg}u;\n\
             const TILE: u32 = {tile}u;\nconst BK: u32 = {K_SLAB}u;\n\
             const LOADS: u32 = {loads}u;\n\
             alias FragA = coop_mat{s}x{s}<f16, A>;\n\
             alias FragB = coop_mat{s}x{s}<f16, B>;\n\
             alias FragC = coop_mat{s}x{s}<f32, C>;\n",
            sg = self.subgroup,
            wg = self.workgroup(),
            tile = self.tile_rows(),
            loads = self.loads_per_invocation(),
        )
    }

    /// Workgroups for `rows` weight rows by `tokens` tokens.
    pub(crate) fn groups(&self, rows: u32, tokens: u32) -> [u32; 2] {
        let t = self.tile_rows();
        [rows.div_ceil(t).max(1), tokens.div_ceil(t).max(1)]
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
    fn configurations_are_picked_by_type_side_and_subgroup() {
        use CooperativeScalarType::{F16, F32};
        // lavapipe (Mesa 26): 8x8x8, f16 -> f16 and f16 -> f32, subgroups of 8.
        let lvp = [prop(8, F16, F16), prop(8, F16, F32)];
        assert_eq!(
            CoopConfig::pick(&lvp, 8, 8, true),
            Some(CoopConfig {
                side: 8,
                subgroup: 8
            })
        );
        // Without shader-f16, or a subgroup size the driver may vary, none.
        assert_eq!(CoopConfig::pick(&lvp, 8, 8, false), None);
        assert_eq!(CoopConfig::pick(&lvp, 8, 16, true), None);
        // f16 accumulators only: none.
        assert_eq!(CoopConfig::pick(&lvp[..1], 8, 8, true), None);
        // An NVIDIA-like list: 16 preferred.
        let nv = [prop(16, F16, F16), prop(16, F16, F32), prop(8, F16, F32)];
        let c = CoopConfig::pick(&nv, 32, 32, true).expect("usable");
        assert_eq!((c.side, c.subgroup), (16, 32));
        assert_eq!(
            (c.tile_rows(), c.workgroup(), c.loads_per_invocation()),
            (64, 128, 2)
        );
        assert!(c.workgroup_bytes() <= 16384, "{}", c.workgroup_bytes());
        // Subgroups of 64 with 16-wide fragments: one load each.
        let c = CoopConfig::pick(&nv, 64, 64, true).expect("usable");
        assert_eq!(c.loads_per_invocation(), 1);
        // 8-wide fragments and subgroups of 64: a 32-row slab has 128 runs
        // of 8 for 256 invocations, so not usable.
        assert_eq!(CoopConfig::pick(&lvp, 64, 64, true), None);
        let c = CoopConfig::pick(&lvp, 8, 8, true).expect("usable");
        assert_eq!(c.groups(65, 1), [3, 1]);
        assert_eq!(c.groups(0, 64), [1, 2]);
    }
}
