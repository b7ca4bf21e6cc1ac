//! One table of deadlines for the whole Host, keyed by what they belong to.
//!
//! As quinn's `TimerTable`: setting a key replaces its deadline, `next` gives the
//! earliest, `expired` pops everything due.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use crate::time::Instant;

/// Deadlines keyed by `K`; at most one per key.
#[derive(Debug, Clone)]
pub struct TimerTable<K: Ord + Hash + Copy> {
    by_key: HashMap<K, Instant>,
    by_time: BTreeSet<(Instant, K)>,
}

impl<K: Ord + Hash + Copy> Default for TimerTable<K> {
    fn default() -> Self {
        TimerTable {
            by_key: HashMap::new(),
            by_time: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Hash + Copy> TimerTable<K> {
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
}
