//! The paged KV cache pool on the host: `num_blocks` blocks of `block_size`
//! token slots per layer, addressed through each sequence's block table.

use tokenwire_core::BlockId;

/// Shape of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Decoder layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
}

impl KvGeometry {
    /// f32 values one block holds in one layer, for K (or V).
    pub fn block_len(&self) -> usize {
        self.kv_heads * self.block_size * self.head_dim
    }

    /// Where slot `off` of `block` starts for KV head `head`, for V. Within a
    /// block V is `[kv_head][slot][head_dim]`; K is `[kv_head][head_dim][slot]`
    /// (transposed per head, for the attention kernel,
    /// [`crate::quant::attn`]), so `offset(block, head, 0)` is where either
    /// starts.
    #[inline]
    pub fn offset(&self, block: usize, head: usize, off: usize) -> usize {
        ((block * self.kv_heads + head) * self.block_size + off) * self.head_dim
    }
}

/// K and V for every layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    geo: KvGeometry,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// Allocates a zeroed pool; an error (not an abort) if it does not fit in memory.
    pub fn new(geo: KvGeometry) -> Result<KvCache, String> {
        let per_layer = geo
            .block_len()
            .checked_mul(geo.num_blocks)
            .ok_or_else(|| "KV pool size overflows".to_string())?;
        let alloc = || -> Result<Vec<f32>, String> {
            let mut v: Vec<f32> = Vec::new();
            v.try_reserve_exact(per_layer).map_err(|_| {
                format!(
                    "cannot allocate a KV pool of {} blocks ({} MiB per layer for K or V)",
                    geo.num_blocks,
                    per_layer.saturating_mul(4) >> 20
                )
            })?;
            v.resize(per_layer, 0.0);
            Ok(v)
        };
        let mut k = Vec::with_capacity(geo.layers);
        let mut v = Vec::with_capacity(geo.layers);
        for _ in 0..geo.layers {
            k.push(alloc()?);
            v.push(alloc()?);
        }
        Ok(KvCache { geo, k, v })
    }

    /// The pool's shape.
    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    /// K and V of layer `l`, read-only.
    pub fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        (&self.k[l], &self.v[l])
    }

    /// K and V of layer `l`, writable.
    pub fn layer_mut(&mut self, l: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.k[l], &mut self.v[l])
    }

    /// Copies block `src` to `dst` in every layer (copy-on-write of shared prefixes).
    /// Both must be below `num_blocks`; the engine checks that.
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        if src == dst {
            return;
        }
        let len = self.geo.block_len();
        let (s, d) = (src as usize * len, dst as usize * len);
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.copy_within(s..s + len, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_block_copies_every_layer() {
        let geo = KvGeometry {
            layers: 2,
            kv_heads: 2,
            head_dim: 4,
            block_size: 3,
            num_blocks: 5,
        };
        let mut kv = KvCache::new(geo).expect("small pool");
        let src = geo.offset(1, 1, 2);
        for l in 0..2 {
            let (k, v) = kv.layer_mut(l);
            k[src] = 1.0 + l as f32;
            v[src + 3] = 2.0;
        }
        kv.copy_block(1, 4);
        let dst = geo.offset(4, 1, 2);
        for l in 0..2 {
            let (k, v) = kv.layer(l);
            assert_eq!(k[dst], 1.0 + l as f32);
            assert_eq!(v[dst + 3], 2.0);
        }
    }
}
