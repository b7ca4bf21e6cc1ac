//! One table of deadlines for the whole Host, keyed by what they belong to.
//!
//! As quinn's `TimerTable`: setting a key replaces its deadline, `next` gives the
//! earliest, `expired` pops everything due. Keys are ordered, so everything
//! one owner has set can be cancelled as one key range.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeBounds;

use crate::time::Instant;

/// Deadlines keyed by `K`; at most one per key.
#[derive(Debug, Clone)]
pub struct TimerTable<K: Ord + Copy> {
    by_key: BTreeMap<K, Instant>,
    by_time: BTreeSet<(Instant, K)>,
}

impl<K: Ord + Copy> Default for TimerTable<K> {
    fn default() -> Self {
        TimerTable {
            by_key: BTreeMap::new(),
            by_time: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Copy> TimerTable<K> {
    /// Sets (or moves) `key`'s deadline to `at`.
    pub fn set(&mut self, key: K, at: Instant) {
        if let Some(old) = self.by_key.insert(key, at) {
            self.by_time.remove(&(old, key));
        }
        self.by_time.insert((at, key));
    }

    /// Removes `key`'s deadline, if any.
    pub fn cancel(&mut self, key: K) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_time.remove(&(old, key));
        }
    }

    /// Removes every deadline whose key is in `range`.
    pub fn cancel_range(&mut self, range: impl RangeBounds<K>) {
        let keys: Vec<(K, Instant)> = self.by_key.range(range).map(|(k, t)| (*k, *t)).collect();
        for (key, at) in keys {
            self.by_key.remove(&key);
            self.by_time.remove(&(at, key));
        }
    }

    /// `key`'s deadline, if set.
    pub fn get(&self, key: K) -> Option<Instant> {
        self.by_key.get(&key).copied()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// Removes and returns the earliest key whose deadline is at or before `now`.
    pub fn pop_expired(&mut self, now: Instant) -> Option<K> {
        let &(at, key) = self.by_time.first()?;
        if at > now {
            return None;
        }
        self.by_time.remove(&(at, key));
        self.by_key.remove(&key);
        Some(key)
    }

    /// True when no deadline is set.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_reset_moves_deadline() {
        let mut t = TimerTable::default();
        t.set(1u32, Instant::from_millis(30));
        t.set(2u32, Instant::from_millis(10));
        t.set(1u32, Instant::from_millis(5));
        assert_eq!(t.next(), Some(Instant::from_millis(5)));
        assert_eq!(t.pop_expired(Instant::from_millis(4)), None);
        assert_eq!(t.pop_expired(Instant::from_millis(20)), Some(1));
        assert_eq!(t.pop_expired(Instant::from_millis(20)), Some(2));
        assert!(t.is_empty());
        t.set(3, Instant::from_millis(1));
        t.cancel(3);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn a_range_cancels_exactly_its_keys() {
        let mut t = TimerTable::default();
        for k in 0..10u32 {
            t.set(k, Instant::from_millis(u64::from(100 - k)));
        }
        t.cancel_range(3..=6);
        let mut left = Vec::new();
        while let Some(k) = t.pop_expired(Instant::from_millis(1000)) {
            left.push(k);
        }
        assert_eq!(left, vec![9, 8, 7, 2, 1, 0]);
    }
}
