//! `kv_blocks`: KV blocks in use never exceed the pool's capacity when no step
//! is outstanding (while one is, only its own sequences may hold blocks beyond
//! it), and when the Host is idle (no generation, no step) are only those
//! kept for continuations (`batch`'s cache), and blocks are kept for
//! continuations only while a payload is running or that cache (as the
//! view models it) may hold an entry: a closed connection's entries are
//! freed with it. Blocks cached for their content
//! (prefix caching) are free blocks, counted apart: they never make used
//! blocks a leak and never exceed the pool. (Used plus cached may: after the
//! pool shrinks, held blocks beyond it drain while cached ones below it stay,
//! and the allocator's own `check` sees each id held, free or cached.)

use crate::invariants::{Check, Checker, Cx, EndState};

/// See the module docs.
#[derive(Debug, Default)]
pub struct KvBlocks;

impl Checker for KvBlocks {
    fn name(&self) -> &'static str {
        "kv_blocks"
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let s = &end.stats;
        if !s.loaded {
            return Ok(());
        }
        // A payload's finished prompts keep theirs until it retires.
        let retiring = cx
            .view
            .conns
            .values()
            .any(|c| c.batch.as_ref().is_some_and(|b| !b.jobs.is_empty()));
        if s.kv_blocks_kept > 0 && !retiring && cx.view.batch_cache.holds_nothing() {
            return Err(format!(
                "{} KV blocks kept for continuations, and the batch cache holds no entry",
                s.kv_blocks_kept
            ));
        }
        match &cx.view.step {
            None => {
                if s.kv_blocks_used > s.kv_blocks_total {
                    return Err(format!(
                        "{} KV blocks used with capacity {} and no step outstanding",
                        s.kv_blocks_used, s.kv_blocks_total
                    ));
                }
                if s.kv_blocks_cached > s.kv_blocks_total {
                    return Err(format!(
                        "{} KV blocks cached in a pool of {}",
                        s.kv_blocks_cached, s.kv_blocks_total
                    ));
                }
                if s.generations == 0 && s.kv_blocks_used != s.kv_blocks_kept {
                    return Err(format!(
                        "{} KV blocks still used with no generation and no step, {} of them kept for continuations (leak)",
                        s.kv_blocks_used, s.kv_blocks_kept
                    ));
                }
            }
            Some(step) => {
                if s.kv_blocks_used > s.kv_blocks_total.max(step.blocks) {
                    return Err(format!(
                        "{} KV blocks used with capacity {}, and the outstanding step {} holds only {}",
                        s.kv_blocks_used, s.kv_blocks_total, step.id, step.blocks
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{idle_end, kit};
    use tokenwire_core::{ConnId, Input};

    #[test]
    fn leaked_and_overcommitted_blocks_are_caught() {
        let mut k = kit(Box::new(KvBlocks));
        k.input(Input::Timeout).expect("input");
        let mut leak = idle_end();
        leak.stats.kv_blocks_used = 3;
        let err = k.m.end(&leak).expect_err("leak");
        assert_eq!(err.invariant, "kv_blocks");
        k.input(Input::Timeout).expect("input");
        let mut kept = idle_end();
        kept.stats.kv_blocks_used = 3;
        kept.stats.kv_blocks_kept = 3;
        let e = k.m.end(&kept).expect_err("kept for no entry");
        assert!(e.detail.contains("holds no entry"), "{}", e.detail);
        k.m.view_mut()
            .batch_cache
            .put(Some(ConnId(1)), vec!["a".into()], Some(vec!["x".into()]));
        k.input(Input::Timeout).expect("input");
        k.m.end(&kept)
            .expect("blocks kept for continuations are no leak");
        k.input(Input::Timeout).expect("input");
        let mut cached = idle_end();
        cached.stats.kv_blocks_cached = cached.stats.kv_blocks_total;
        k.m.end(&cached).expect("cached blocks are free, no leak");
        k.input(Input::Timeout).expect("input");
        let mut beyond = idle_end();
        beyond.stats.kv_blocks_cached = beyond.stats.kv_blocks_total + 1;
        assert!(k.m.end(&beyond).is_err(), "more cached than the pool");
        k.input(Input::Timeout).expect("input");
        let mut over = idle_end();
        over.stats.generations = 2;
        over.stats.kv_blocks_used = 70;
        assert!(k.m.end(&over).is_err(), "over capacity");
    }
}
