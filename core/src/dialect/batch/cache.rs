//! `batch`'s continue-generation cache: each finished batch's sequences,
//! keyed by its owner and the ordered list of its `request_id`s (the same
//! ids in another order are another key, as the source notes), least
//! recently used forgotten first past `--batch-cache-entries`.
//!
//! The owner is the principal that ran the batch ([`Owner`]): another
//! principal naming the same ids finds nothing, exactly as if they had never
//! been used (PROTOCOLS.md, Tenancy). `--batch-cache-scope host` files
//! every batch under one shared owner instead, the source's host-wide
//! cache.
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
use crate::principal::Principal;

/// Whose batches an entry belongs to: a principal, or (`None`) everyone,
/// with `--batch-cache-scope host`.
pub type Owner = Option<Principal>;

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

/// Finished batches by owner and ordered request ids.
#[derive(Debug)]
pub struct ContinueCache {
    batches: Lru<(Owner, Vec<String>), Vec<CachedSeq>>,
}

impl ContinueCache {
    /// A cache of at most `capacity` batches (0: keeps nothing).
    pub fn new(capacity: usize) -> ContinueCache {
        ContinueCache {
            batches: Lru::new(capacity),
        }
    }

    /// The batch `owner` kept under `ids`, marked as just used.
    pub fn get(&mut self, owner: &Owner, ids: &[String]) -> Option<Vec<CachedSeq>> {
        self.batches
            .get(&(owner.clone(), ids.to_vec()))
            .map(|s| s.clone())
    }

    /// Keeps `seqs` for `owner` under `ids`, forgetting the least recently
    /// used past the capacity. Returns what it displaced (the entry it
    /// replaced, and those it pushed out), whose KV blocks the caller frees.
    pub fn put(&mut self, owner: Owner, ids: Vec<String>, seqs: Vec<CachedSeq>) -> Vec<CachedSeq> {
        let key = (owner, ids);
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

    /// Takes out every batch `owner` kept (its principal is gone: a
    /// connection that closed can never name them again). Returns them, for
    /// the caller to free their KV blocks.
    pub fn remove_owner(&mut self, owner: &Owner) -> Vec<CachedSeq> {
        self.batches
            .drain_where(|(o, _)| o == owner)
            .into_iter()
            .flat_map(|(_, seqs)| seqs)
            .collect()
    }

    /// Batches kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.batches.len()
    }

    /// True when none is kept.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

/// How far a kept `batch` entry is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheScope {
    /// Found only by the principal that made it.
    #[default]
    Principal,
    /// Found by anyone who names its ids (the source's behaviour).
    Host,
}

impl crate::dialect::state::HostWide for ContinueCache {}

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

    const ME: Owner = None;

    #[test]
    fn order_matters_and_the_least_recently_used_goes_first() {
        let mut c = ContinueCache::new(2);
        assert!(c.put(ME, key(&["a", "b"]), seq(1)).is_empty());
        assert_eq!(
            c.get(&ME, &key(&["b", "a"])),
            None,
            "another order is another key"
        );
        c.put(ME, key(&["b", "a"]), seq(2));
        assert_eq!(c.get(&ME, &key(&["a", "b"])), Some(seq(1))); // now the most recent
        assert_eq!(c.put(ME, key(&["c"]), seq(3)), seq(2), "pushed out");
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.get(&ME, &key(&["b", "a"])),
            None,
            "least recently used went"
        );
        assert_eq!(c.get(&ME, &key(&["a", "b"])), Some(seq(1)));
        assert_eq!(c.put(ME, key(&["a", "b"]), seq(4)), seq(1), "replaced");
        assert_eq!(c.get(&ME, &key(&["a", "b"])), Some(seq(4)));
        assert_eq!(c.len(), 2);
        let mut off = ContinueCache::new(0);
        assert_eq!(off.put(ME, key(&["a"]), seq(1)), seq(1), "kept nowhere");
        assert!(off.is_empty());
    }

    #[test]
    fn another_principal_naming_the_same_ids_finds_nothing() {
        use crate::api::ConnId;
        let alice: Owner = Some(Principal::Conn(ConnId(1)));
        let mallory: Owner = Some(Principal::Conn(ConnId(2)));
        let mut c = ContinueCache::new(4);
        c.put(alice.clone(), key(&["1"]), seq(1));
        assert_eq!(c.get(&mallory, &key(&["1"])), None);
        assert_eq!(c.get(&ME, &key(&["1"])), None, "nor the shared scope");
        assert!(
            c.put(mallory.clone(), key(&["1"]), seq(9)).is_empty(),
            "nor is alice's entry replaced"
        );
        assert_eq!(c.get(&alice, &key(&["1"])), Some(seq(1)));
        assert_eq!(c.remove_owner(&alice), seq(1));
        assert_eq!(c.get(&alice, &key(&["1"])), None);
        assert_eq!(c.get(&mallory, &key(&["1"])), Some(seq(9)));
    }
}
