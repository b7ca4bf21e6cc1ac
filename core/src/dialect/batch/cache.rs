//! `batch`'s continue-generation cache: each finished batch's sequences,
//! keyed by the ordered list of its `request_id`s (the same ids in another
//! order are another key, as the source notes), least recently used
//! forgotten first past `--batch-cache-entries`.
//!
//! An entry holds token ids, the text so far and, while memory allows, the
//! sequence's KV blocks ([`KeptKv`], parked in the scheduler). A continued
//! batch feeds the ids back as its prompt and hands the Host the kept
//! blocks: when they are still there the prompt is not computed again; when
//! memory pressure freed them the scheduler's prefill recomputes them from
//! the ids, which changes time only, never tokens.

use crate::engine::TokenId;
use crate::gen::KeptKv;
use crate::lru::Lru;

/// One sequence of a finished batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedSeq {
    /// Prompt and generated token ids, as fed to the model.
    pub ids: Vec<TokenId>,
    /// The original prompt followed by everything generated so far.
    pub text: String,
    /// Its KV blocks, kept by the Host (they may have been freed since).
    pub kv: Option<KeptKv>,
}

/// Finished batches by their ordered request ids.
#[derive(Debug)]
pub struct ContinueCache {
    batches: Lru<Vec<String>, Vec<CachedSeq>>,
}

impl ContinueCache {
    /// A cache of at most `capacity` batches (0: keeps nothing).
    pub fn new(capacity: usize) -> ContinueCache {
        ContinueCache {
            batches: Lru::new(capacity),
        }
    }

    /// The batch kept under `key`, marked as just used.
    pub fn get(&mut self, key: &[String]) -> Option<Vec<CachedSeq>> {
        self.batches.get(&key.to_vec()).map(|s| s.clone())
    }

    /// Keeps `seqs` under `key`, forgetting the least recently used past the
    /// capacity. Returns what it displaced (the entry it replaced, and those
    /// it pushed out), whose KV blocks the caller frees.
    pub fn put(&mut self, key: Vec<String>, seqs: Vec<CachedSeq>) -> Vec<CachedSeq> {
        let mut gone: Vec<CachedSeq> = self.batches.remove(&key).unwrap_or_default();
        for (_, old) in self.batches.put(key, seqs.clone()) {
            gone.extend(old);
        }
        if self.batches.is_empty() {
            // Capacity 0: nothing is kept, not even this batch.
            gone.extend(seqs);
        }
        gone
    }

    /// Batches kept.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn seq(n: u32) -> Vec<CachedSeq> {
        vec![CachedSeq {
            ids: vec![n],
            text: n.to_string(),
            kv: None,
        }]
    }

    #[test]
    fn order_matters_and_the_least_recently_used_goes_first() {
        let mut c = ContinueCache::new(2);
        assert!(c.put(key(&["a", "b"]), seq(1)).is_empty());
        assert_eq!(
            c.get(&key(&["b", "a"])),
            None,
            "another order is another key"
        );
        c.put(key(&["b", "a"]), seq(2));
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(1))); // now the most recent
        assert_eq!(c.put(key(&["c"]), seq(3)), seq(2), "pushed out");
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&key(&["b", "a"])), None, "least recently used went");
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(1)));
        assert_eq!(c.put(key(&["a", "b"]), seq(4)), seq(1), "replaced");
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(4)));
        assert_eq!(c.len(), 2);
        let mut off = ContinueCache::new(0);
        assert_eq!(off.put(key(&["a"]), seq(1)), seq(1), "kept nowhere");
        assert!(off.is_empty());
    }
}
