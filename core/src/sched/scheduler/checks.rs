//! The scheduler's internal invariants, checked after every event by the
//! tests and the simulator: one function, kept apart from the scheduling it
//! checks so that neither hides the other.

use std::collections::{BTreeMap, BTreeSet};

use super::Scheduler;
use crate::engine::BlockId;
use crate::sched::seq::SeqState;

impl Scheduler {
    /// Checks the internal invariants and describes the first one broken: the
    /// allocator's counts, every held block held by exactly its refcount's
    /// number of sequences and no block by two, queues matching states,
    /// waiting sequences holding nothing, running ones holding blocks for
    /// their computed tokens (and not more than one token ahead of their
    /// length), the outstanding step naming live or removed-in-step
    /// sequences, and use within capacity when no step is outstanding.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.alloc.check()?;
        let bs = self.cfg.block_size;

        // Every reference a block has: the sequences holding it (forked
        // beams share full blocks) and the holds of pending copies.
        let mut holders: BTreeMap<BlockId, u32> = BTreeMap::new();
        let pending_holds = self.outstanding.iter().flat_map(|o| o.holds.iter());
        for &b in self.copy_holds.iter().chain(pending_holds) {
            *holders.entry(b).or_default() += 1;
        }
        for (&id, s) in &self.seqs {
            let mut own = BTreeSet::new();
            for &b in &s.blocks {
                if !own.insert(b) {
                    return Err(format!("{id:?} holds block {b} twice"));
                }
                *holders.entry(b).or_default() += 1;
            }
            let covered = s.blocks.len() as u64 * u64::from(bs);
            match s.state {
                SeqState::Waiting => {
                    if !s.blocks.is_empty() || s.num_computed != 0 {
                        return Err(format!(
                            "waiting {id:?} holds {} blocks, {} computed",
                            s.blocks.len(),
                            s.num_computed
                        ));
                    }
                }
                SeqState::Running | SeqState::Removed => {
                    if covered < u64::from(s.num_computed) {
                        return Err(format!(
                            "{id:?}: {} blocks do not cover {} computed tokens",
                            s.blocks.len(),
                            s.num_computed
                        ));
                    }
                    if covered + 1 < u64::from(s.len()) {
                        return Err(format!(
                            "{id:?}: {} blocks for {} tokens",
                            s.blocks.len(),
                            s.len()
                        ));
                    }
                    // A drafted sequence in the outstanding step holds
                    // blocks for its draft's positions too.
                    let mut drafted = self.outstanding.iter().flat_map(|o| &o.entries);
                    let draft = drafted
                        .find(|p| p.seq == id)
                        .map_or(0, |p| p.draft.len() as u32);
                    if s.blocks.len() as u32 > self.blocks_for(s.len() + 1 + draft) {
                        return Err(format!(
                            "{id:?}: {} blocks, more than {} tokens need",
                            s.blocks.len(),
                            s.len() + 1 + draft
                        ));
                    }
                    if s.state == SeqState::Running && s.remaining() == 0 {
                        return Err(format!("running {id:?} has nothing left to feed"));
                    }
                }
            }
            if s.parked && (s.runnable || s.state == SeqState::Waiting) {
                return Err(format!("parked {id:?} is runnable or waiting"));
            }
            if s.num_computed > s.len() {
                return Err(format!(
                    "{id:?}: {} computed of {}",
                    s.num_computed,
                    s.len()
                ));
            }
            if s.state == SeqState::Removed && !self.in_outstanding(id) {
                return Err(format!(
                    "removed {id:?} lingers outside the outstanding step"
                ));
            }
        }
        for (&b, &n) in &holders {
            if self.alloc.refcount(b) != n {
                return Err(format!(
                    "block {b} has {n} holders but refcount {}",
                    self.alloc.refcount(b)
                ));
            }
        }
        if holders.len() as u32 != self.alloc.used() {
            return Err(format!(
                "sequences hold {} blocks, allocator counts {}",
                holders.len(),
                self.alloc.used()
            ));
        }

        let mut seen = BTreeSet::new();
        for (list, want, ids) in [
            (
                "waiting",
                SeqState::Waiting,
                self.waiting.iter().collect::<Vec<_>>(),
            ),
            ("running", SeqState::Running, self.running.iter().collect()),
        ] {
            for &id in ids {
                if !seen.insert(id) {
                    return Err(format!("{id:?} listed twice ({list})"));
                }
                match self.seqs.get(&id) {
                    Some(s) if s.state == want => {}
                    _ => return Err(format!("{id:?} in {list} queue with another state")),
                }
            }
        }
        let listed = self
            .seqs
            .values()
            .filter(|s| s.state != SeqState::Removed)
            .count();
        if listed != seen.len() {
            return Err(format!(
                "{listed} live sequences but {} queued or running",
                seen.len()
            ));
        }

        if let Some(out) = &self.outstanding {
            let mut in_step = BTreeSet::new();
            for p in &out.entries {
                if !in_step.insert(p.seq) {
                    return Err(format!("{:?} twice in step {}", p.seq, out.step_id));
                }
                let Some(s) = self.seqs.get(&p.seq) else {
                    return Err(format!("step {} names unknown {:?}", out.step_id, p.seq));
                };
                if s.state == SeqState::Waiting {
                    return Err(format!("{:?} in the outstanding step is waiting", p.seq));
                }
                if p.fed == 0 || s.num_computed + p.fed > s.len() {
                    return Err(format!(
                        "{:?} fed {} from {} of {}",
                        p.seq,
                        p.fed,
                        s.num_computed,
                        s.len()
                    ));
                }
            }
        } else if self.alloc.used() > self.alloc.capacity() {
            return Err(format!(
                "{} blocks used with capacity {} and no step outstanding",
                self.alloc.used(),
                self.alloc.capacity()
            ));
        }
        // One hold per copy not yet done, on that copy's source.
        let mut srcs: Vec<BlockId> = self.pending_copies.iter().map(|c| c.0).collect();
        let mut holds = self.copy_holds.clone();
        if let Some(out) = &self.outstanding {
            srcs.extend(out.copies.iter().map(|c| c.0));
            holds.extend(out.holds.iter().copied());
        }
        srcs.sort_unstable();
        holds.sort_unstable();
        if srcs != holds {
            return Err(format!("copy sources {srcs:?} but holds on {holds:?}"));
        }
        if self.seq_cap == 0 || self.seq_cap > self.cfg.max_running_seqs {
            return Err(format!("seq cap {} out of range", self.seq_cap));
        }
        Ok(())
    }
}
