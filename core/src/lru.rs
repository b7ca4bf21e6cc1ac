//! A bounded map that forgets the least recently used entry first: the one
//! shape behind the dialects' host-wide stores (jobs, stored responses,
//! `cai` conversations, `batch`'s continue-generation cache). Ordered maps
//! only, so every host forgets the same entries for the same inputs.

use std::collections::BTreeMap;

/// A map of at most `capacity` entries; using or replacing an entry makes it
/// the most recent, and a new one past the capacity pushes the least recent out.
#[derive(Debug, Clone)]
pub struct Lru<K, V> {
    entries: BTreeMap<K, (u64, V)>,
    by_use: BTreeMap<u64, K>,
    clock: u64,
    capacity: usize,
}

impl<K: Ord + Clone, V> Lru<K, V> {
    /// An empty map of at most `capacity` entries (0: keeps nothing).
    pub fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            entries: BTreeMap::new(),
            by_use: BTreeMap::new(),
            clock: 0,
            capacity,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Stores `value` under `key` as the most recent entry; returns the
    /// entries this pushed out (the one it replaced is not among them).
    pub fn put(&mut self, key: K, value: V) -> Vec<(K, V)> {
        let mut out = Vec::new();
        if self.capacity == 0 {
            return out;
        }
        self.remove(&key);
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, v)) = self.entries.remove(&oldest) {
                out.push((oldest, v));
            }
        }
        let t = self.tick();
        self.by_use.insert(t, key.clone());
        self.entries.insert(key, (t, value));
        out
    }

    /// The entry under `key`, made the most recent.
    pub fn get(&mut self, key: &K) -> Option<&mut V> {
        let t = self.tick();
        let (used, value) = self.entries.get_mut(key)?;
        self.by_use.remove(used);
        *used = t;
        self.by_use.insert(t, key.clone());
        Some(value)
    }

    /// The entry under `key`, its recency unchanged.
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(_, v)| v)
    }

    /// Takes the entry under `key` out.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (used, value) = self.entries.remove(key)?;
        self.by_use.remove(&used);
        Some(value)
    }

    /// The least recently used key that satisfies `pred` (a scan from the
    /// oldest use on).
    pub fn least_recent_where(&self, mut pred: impl FnMut(&K) -> bool) -> Option<K> {
        self.by_use.values().find(|k| pred(k)).cloned()
    }

    /// Takes out every entry whose key satisfies `pred` (a linear scan).
    pub fn drain_where(&mut self, mut pred: impl FnMut(&K) -> bool) -> Vec<(K, V)> {
        let keys: Vec<K> = self.entries.keys().filter(|k| pred(k)).cloned().collect();
        keys.into_iter()
            .filter_map(|k| self.remove(&k).map(|v| (k, v)))
            .collect()
    }

    /// Entries held (the tests' view: the Host needs only the bound).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_goes_first_and_peeking_does_not_use() {
        let mut l = Lru::new(2);
        assert!(l.put("a", 1).is_empty());
        l.put("b", 2);
        assert_eq!(l.get(&"a"), Some(&mut 1)); // a is now the most recent
        assert_eq!(l.peek(&"b"), Some(&2)); // b stays the least recent
        assert_eq!(l.put("c", 3), vec![("b", 2)]);
        assert_eq!(l.put("a", 4), vec![], "replacing pushes nothing out");
        assert_eq!(l.put("d", 5), vec![("c", 3)], "a was just used");
        assert_eq!(l.remove(&"a"), Some(4));
        assert_eq!(l.len(), 1);
        l.put("e", 6);
        assert_eq!(l.least_recent_where(|k| *k != "d"), Some("e"));
        assert_eq!(l.least_recent_where(|_| true), Some("d"));
        assert_eq!(l.drain_where(|k| *k == "d"), vec![("d", 5)]);
        assert_eq!(l.len(), 1);
        assert_eq!(l.put("f", 7), vec![], "room was made");
        let mut off = Lru::new(0);
        off.put("a", 1);
        assert!(off.is_empty(), "capacity 0 keeps nothing");
    }
}
