//! A limit per key (the peer's IP address): at most `max` permits held for
//! any one key at once, each released on drop. The map holds only keys with
//! a permit out, so it is bounded by the permits, never by history.

use std::collections::HashMap;
use std::hash::Hash;
// `std`'s `Arc` for the handle, as in `limiter`: `self: &Arc<Self>` needs a
// receiver stable Rust accepts. The map, the shared state, is the facade's
// mutex, model-checked under loom.
use std::sync::Arc;

use crate::facade::{lock, Mutex};

/// At most `max` permits per key.
#[derive(Debug)]
pub struct PerKeyLimiter<K: Eq + Hash + Clone> {
    max: usize,
    held: Mutex<HashMap<K, usize>>,
}

/// One permit of a key in a [`PerKeyLimiter`]; released on drop.
#[derive(Debug)]
pub struct KeyPermit<K: Eq + Hash + Clone> {
    limiter: Arc<PerKeyLimiter<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> PerKeyLimiter<K> {
    /// A limiter admitting at most `max` permits per key.
    pub fn new(max: usize) -> Arc<PerKeyLimiter<K>> {
        Arc::new(PerKeyLimiter {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a permit for `key`, or `None` when it already holds `max`.
    pub fn try_acquire(self: &Arc<Self>, key: K) -> Option<KeyPermit<K>> {
        let mut held = lock(&self.held);
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            if *n == 0 {
                held.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(KeyPermit {
            limiter: Arc::clone(self),
            key,
        })
    }

    /// Permits held for `key` now.
    pub fn held(&self, key: &K) -> usize {
        lock(&self.held).get(key).copied().unwrap_or(0)
    }

    /// Keys with a permit out.
    pub fn keys(&self) -> usize {
        lock(&self.held).len()
    }

    /// The maximum per key.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl<K: Eq + Hash + Clone> Drop for KeyPermit<K> {
    fn drop(&mut self) {
        let mut held = lock(&self.limiter.held);
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_capped_apart_and_forgotten_when_free() {
        let l = PerKeyLimiter::new(2);
        let a1 = l.try_acquire("a");
        let a2 = l.try_acquire("a");
        assert!(a1.is_some() && a2.is_some());
        assert!(l.try_acquire("a").is_none(), "a holds its two");
        let b = l.try_acquire("b");
        assert!(b.is_some(), "b is counted apart");
        assert_eq!((l.held(&"a"), l.held(&"b")), (2, 1));
        drop(a1);
        assert!(l.try_acquire("a").is_some());
        drop((a2, b));
        assert_eq!(l.keys(), 0, "no key is kept without a permit");
        let none = PerKeyLimiter::new(0);
        assert!(none.try_acquire("x").is_none());
        assert_eq!(none.keys(), 0);
    }
}
