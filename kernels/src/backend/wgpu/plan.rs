//! Host-side planning of one step: the batch's token rows, flattened in
//! batch order, cut into passes that fit the activation buffers, and the
//! `plan` words every kernel reads (token ids, positions, KV slots, block
//! tables, RoPE cos/sin, the attention work lists, the rows that need logits).

use crate::backend::SeqBatch;
use crate::rope;

/// Bounds on one pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanLimits {
    /// Token rows per pass.
    pub(crate) max_rows: usize,
    /// Rows needing logits per pass.
    pub(crate) max_logit_rows: usize,
    /// A sequence's run of rows in a pass at least this long goes to the
    /// tiled prefill attention; shorter runs to the decode kernel, row by row.
    pub(crate) prefill_min: usize,
    /// Rows per prefill tile.
    pub(crate) prefill_rows: usize,
    /// KV block size.
    pub(crate) block_size: usize,
}

/// One pass: a contiguous range of the step's rows. Offsets are word
/// offsets into [`HostPlan::words`]; rows are pass-local.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    pub(crate) rows: u32,
    pub(crate) tok_off: u32,
    pub(crate) pos_off: u32,
    pub(crate) slot_off: u32,
    /// Per row: word offset of its sequence's block table.
    pub(crate) rt_off: u32,
    pub(crate) cos_off: u32,
    pub(crate) sin_off: u32,
    /// Rows for the decode attention kernel.
    pub(crate) dec_off: u32,
    pub(crate) n_dec: u32,
    /// Longest context among the decode rows.
    pub(crate) max_dec_ctx: u32,
    /// (first row, row count) pairs for the prefill attention kernel.
    pub(crate) tile_off: u32,
    pub(crate) n_tiles: u32,
    /// Rows that need logits.
    pub(crate) sel_off: u32,
    pub(crate) n_sel: u32,
    /// Index of this pass's first logits row among the step's.
    pub(crate) out_base: u32,
}

/// The whole step.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostPlan {
    pub(crate) words: Vec<u32>,
    pub(crate) passes: Vec<Pass>,
    /// Per logits row (sequence with `want_logits`, batch order): whether
    /// the whole row must come back (else only what the device sampled).
    pub(crate) full: Vec<bool>,
}

fn off(words: &[u32]) -> u32 {
    words.len() as u32
}

/// Plans `batch` (already validated). `on_device`, per sequence with
/// `want_logits`: its row is sampled on the device, and comes back only as
/// a token (and logprobs) unless it asks to keep the row.
pub(crate) fn build(
    batch: &[SeqBatch<'_>],
    inv_freq: &[f64],
    mscale: f64,
    lim: &PlanLimits,
    on_device: &[bool],
) -> HostPlan {
    let bs = lim.block_size;
    let mut words = Vec::new();
    let mut tables = Vec::with_capacity(batch.len());
    for b in batch {
        tables.push(off(&words));
        let end = b.start_pos as usize + b.tokens.len();
        words.extend_from_slice(&b.block_table[..end.div_ceil(bs)]);
    }
    // (sequence, position, token, needs logits)
    let mut rows: Vec<(usize, u32, u32, bool)> = Vec::new();
    let mut full = Vec::new();
    for (i, b) in batch.iter().enumerate() {
        let n = b.tokens.len();
        for (j, &t) in b.tokens.iter().enumerate() {
            rows.push((i, b.start_pos + j as u32, t, b.want_logits && j + 1 == n));
        }
        if b.want_logits {
            let device = on_device.get(full.len()).copied().unwrap_or(false);
            full.push(!device || b.keep_row);
        }
    }
    let half = inv_freq.len();
    let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
    let mut passes = Vec::new();
    let mut start = 0;
    let mut out_base = 0u32;
    while start < rows.len() {
        let mut end = start;
        let mut n_logit = 0;
        while end < rows.len() && end - start < lim.max_rows.max(1) {
            if rows[end].3 {
                if n_logit == lim.max_logit_rows.max(1) {
                    break;
                }
                n_logit += 1;
            }
            end += 1;
        }
        let pr = &rows[start..end];
        let mut p = Pass {
            rows: pr.len() as u32,
            out_base,
            ..Pass::default()
        };
        p.tok_off = off(&words);
        words.extend(pr.iter().map(|r| r.2));
        p.pos_off = off(&words);
        words.extend(pr.iter().map(|r| r.1));
        p.slot_off = off(&words);
        words.extend(pr.iter().map(|&(s, pos, _, _)| {
            let pos = pos as usize;
            batch[s].block_table[pos / bs] * bs as u32 + (pos % bs) as u32
        }));
        p.rt_off = off(&words);
        words.extend(pr.iter().map(|r| tables[r.0]));
        p.cos_off = off(&words);
        let mut sins = Vec::with_capacity(pr.len() * half);
        for r in pr {
            rope::angles(inv_freq, mscale, r.1, &mut cos, &mut sin);
            words.extend(cos.iter().map(|c| c.to_bits()));
            sins.extend(sin.iter().map(|s| s.to_bits()));
        }
        p.sin_off = off(&words);
        words.extend_from_slice(&sins);
        // Runs of one sequence inside the pass.
        let mut dec = Vec::new();
        let mut tiles = Vec::new();
        let mut a = 0;
        while a < pr.len() {
            let mut b = a + 1;
            while b < pr.len() && pr[b].0 == pr[a].0 {
                b += 1;
            }
            if b - a >= lim.prefill_min {
                let mut t = a;
                while t < b {
                    let n = (b - t).min(lim.prefill_rows.max(1));
                    tiles.extend([t as u32, n as u32]);
                    t += n;
                }
            } else {
                for (r, row) in pr.iter().enumerate().take(b).skip(a) {
                    dec.push(r as u32);
                    p.max_dec_ctx = p.max_dec_ctx.max(row.1 + 1);
                }
            }
            a = b;
        }
        p.dec_off = off(&words);
        p.n_dec = dec.len() as u32;
        words.extend_from_slice(&dec);
        p.tile_off = off(&words);
        p.n_tiles = (tiles.len() / 2) as u32;
        words.extend_from_slice(&tiles);
        p.sel_off = off(&words);
        let sel: Vec<u32> = (0..pr.len() as u32).filter(|&r| pr[r as usize].3).collect();
        p.n_sel = sel.len() as u32;
        words.extend_from_slice(&sel);
        out_base += p.n_sel;
        passes.push(p);
        start = end;
    }
    HostPlan {
        words,
        passes,
        full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(max_rows: usize, max_logit_rows: usize) -> PlanLimits {
        PlanLimits {
            max_rows,
            max_logit_rows,
            prefill_min: 4,
            prefill_rows: 3,
            block_size: 4,
        }
    }

    #[test]
    fn rows_are_cut_into_passes_and_work_lists() {
        let ta = [7u32, 2, 9];
        let greedy = tokenwire_core::SamplingParams::greedy();
        let spec = crate::backend::SampleSpec {
            params: &greedy,
            position: 8,
            history: &[],
            logprobs: None,
            allowed: None,
        };
        let tb = [5u32];
        let batch = [
            SeqBatch {
                tokens: &[10, 11, 12, 13, 14],
                start_pos: 3,
                block_table: &ta,
                want_logits: true,
                sample: Some(spec),
                keep_row: false,
                hidden: None,
            },
            SeqBatch {
                tokens: &[20],
                start_pos: 2,
                block_table: &tb,
                want_logits: true,
                sample: None,
                keep_row: false,
                hidden: None,
            },
        ];
        let inv = rope::inv_freq(4, 10000.0, &rope::RopeScaling::None);
        let plan = build(&batch, &inv, 1.0, &lim(64, 8), &[true, false]);
        assert_eq!(plan.full, vec![false, true]);
        assert_eq!(plan.passes.len(), 1);
        let p = &plan.passes[0];
        let w = &plan.words;
        let at = |o: u32, n: u32| w[o as usize..(o + n) as usize].to_vec();
        assert_eq!(at(p.tok_off, 6), vec![10, 11, 12, 13, 14, 20]);
        assert_eq!(at(p.pos_off, 6), vec![3, 4, 5, 6, 7, 2]);
        // Position 3 -> block 7 slot 3; 4 -> block 2 slot 0; ...
        assert_eq!(at(p.slot_off, 6), vec![31, 8, 9, 10, 11, 22]);
        // Seq A's run of 5 rows -> tiles of 3 and 2; seq B decodes.
        assert_eq!(at(p.tile_off, 2 * p.n_tiles), vec![0, 3, 3, 2]);
        assert_eq!(at(p.dec_off, p.n_dec), vec![5]);
        assert_eq!(p.max_dec_ctx, 3);
        assert_eq!(at(p.sel_off, p.n_sel), vec![4, 5]);
        // Block tables hold only the blocks the positions reach.
        assert_eq!(at(at(p.rt_off, 6)[0], 2), vec![7, 2]);
        assert_eq!(at(at(p.rt_off, 6)[5], 1), vec![5]);
        // cos(0 * f) = 1 for the first pair at position... row 5 is position 2.
        let c = f32::from_bits(w[(p.cos_off + 5 * 2) as usize]);
        assert!((c - (2.0f64).cos() as f32).abs() < 1e-7);

        let small = build(&batch, &inv, 1.0, &lim(4, 1), &[]);
        assert_eq!(small.full, vec![true, true]);
        let rows: Vec<u32> = small.passes.iter().map(|p| p.rows).collect();
        // 4 rows, then A's last (a logits row) with B's first would make two
        // logits rows in one pass, so B moves to a third pass.
        assert_eq!(rows, vec![4, 1, 1]);
        let bases: Vec<u32> = small.passes.iter().map(|p| p.out_base).collect();
        assert_eq!(bases, vec![0, 0, 1]);
    }
}
