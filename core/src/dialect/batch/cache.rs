//! `batch`'s continue-generation cache: each finished batch's sequences,
//! keyed by the ordered list of its `request_id`s (the same ids in another
//! order are another key, as the source notes), least recently used
//! forgotten first past `--batch-cache-entries`.
//!
//! An entry holds token ids and the text so far; a continued batch feeds
//! the ids back as its prompt, so the KV cache is recomputed from them (the
//! scheduler's prefill), which changes time only, never tokens.

use crate::engine::TokenId;
use crate::lru::Lru;

/// One sequence of a finished batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedSeq {
    /// Prompt and generated token ids, as fed to the model.
    pub ids: Vec<TokenId>,
    /// The original prompt followed by everything generated so far.
    pub text: String,
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
    /// capacity.
    pub fn put(&mut self, key: Vec<String>, seqs: Vec<CachedSeq>) {
        self.batches.put(key, seqs);
    }

    /// Forgets every entry (memory pressure).
    pub fn clear(&mut self) {
        self.batches.clear();
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
        }]
    }

    #[test]
    fn order_matters_and_the_least_recently_used_goes_first() {
        let mut c = ContinueCache::new(2);
        c.put(key(&["a", "b"]), seq(1));
        assert_eq!(
            c.get(&key(&["b", "a"])),
            None,
            "another order is another key"
        );
        c.put(key(&["b", "a"]), seq(2));
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(1))); // now the most recent
        c.put(key(&["c"]), seq(3));
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&key(&["b", "a"])), None, "least recently used went");
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(1)));
        c.put(key(&["a", "b"]), seq(4));
        assert_eq!(c.get(&key(&["a", "b"])), Some(seq(4)), "replaced");
        assert_eq!(c.len(), 2);
        let mut off = ContinueCache::new(0);
        off.put(key(&["a"]), seq(1));
        assert!(off.is_empty());
    }
}
