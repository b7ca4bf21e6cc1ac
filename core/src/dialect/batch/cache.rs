//! `batch`'s continue-generation cache: each finished batch's sequences,
//! keyed by the ordered list of its `request_id`s (the same ids in another
//! order are another key, as the source notes), least recently used
//! forgotten first past `--batch-cache-entries`.
//!
//! An entry holds token ids and the text so far; a continued batch feeds
//! the ids back as its prompt, so the KV cache is recomputed from them (the
//! scheduler's prefill), which changes time only, never tokens.

use std::collections::BTreeMap;

use crate::engine::TokenId;

/// One sequence of a finished batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedSeq {
    /// Prompt and generated token ids, as fed to the model.
    pub ids: Vec<TokenId>,
    /// The original prompt followed by everything generated so far.
    pub text: String,
}

#[derive(Debug)]
struct Entry {
    seqs: Vec<CachedSeq>,
    used: u64,
}

/// Finished batches by their ordered request ids.
#[derive(Debug)]
pub struct ContinueCache {
    map: BTreeMap<Vec<String>, Entry>,
    by_use: BTreeMap<u64, Vec<String>>,
    clock: u64,
    capacity: usize,
}

impl ContinueCache {
    /// A cache of at most `capacity` batches (0: keeps nothing).
    pub fn new(capacity: usize) -> ContinueCache {
        ContinueCache {
            map: BTreeMap::new(),
            by_use: BTreeMap::new(),
            clock: 0,
            capacity,
        }
    }

    /// The batch kept under `key`, marked as just used.
    pub fn get(&mut self, key: &[String]) -> Option<Vec<CachedSeq>> {
        self.clock += 1;
        let clock = self.clock;
        let e = self.map.get_mut(key)?;
        self.by_use.remove(&e.used);
        e.used = clock;
        self.by_use.insert(clock, key.to_vec());
        Some(e.seqs.clone())
    }

    /// Keeps `seqs` under `key`, forgetting the least recently used past the
    /// capacity.
    pub fn put(&mut self, key: Vec<String>, seqs: Vec<CachedSeq>) {
        if self.capacity == 0 {
            return;
        }
        if let Some(old) = self.map.remove(&key) {
            self.by_use.remove(&old.used);
        }
        while self.map.len() >= self.capacity {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            self.map.remove(&oldest);
        }
        self.clock += 1;
        self.by_use.insert(self.clock, key.clone());
        self.map.insert(
            key,
            Entry {
                seqs,
                used: self.clock,
            },
        );
    }

    /// Forgets every entry (memory pressure).
    pub fn clear(&mut self) {
        self.map.clear();
        self.by_use.clear();
    }

    /// Batches kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
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
