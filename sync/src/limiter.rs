//! Caps the number of open connections.

// The handle is always `std`'s `Arc`: `self: &Arc<Self>` needs a receiver type
// stable Rust accepts, and loom's `Arc` is not one. The counter, the only state
// the threads race on, comes from the facade and is model-checked under loom.
use std::sync::Arc;

use super::facade::{AtomicUsize, Ordering};

/// Counts open connections against a maximum. Acquire a [`ConnectionPermit`]
/// per connection; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionLimiter {
    max: usize,
    current: AtomicUsize,
}

/// One connection's slot in a [`ConnectionLimiter`]; released on drop.
#[derive(Debug)]
pub struct ConnectionPermit {
    limiter: Arc<ConnectionLimiter>,
}

impl ConnectionLimiter {
    /// A limiter admitting at most `max` connections at once.
    pub fn new(max: usize) -> Arc<ConnectionLimiter> {
        Arc::new(ConnectionLimiter {
            max,
            current: AtomicUsize::new(0),
        })
    }

    /// Takes a slot, or `None` when `max` connections are already open.
    pub fn try_acquire(self: &Arc<Self>) -> Option<ConnectionPermit> {
        let mut cur = self.current.load(Ordering::Relaxed);
        loop {
            if cur >= self.max {
                return None;
            }
            match self.current.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(ConnectionPermit {
                        limiter: Arc::clone(self),
                    })
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Slots in use now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// The maximum.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.limiter.current.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn permits_are_capped_and_released_on_drop() {
        let l = ConnectionLimiter::new(2);
        let a = l.try_acquire();
        let b = l.try_acquire();
        assert!(a.is_some() && b.is_some());
        assert!(l.try_acquire().is_none());
        assert_eq!(l.current(), 2);
        drop(a);
        assert_eq!(l.current(), 1);
        assert!(l.try_acquire().is_some());
        assert_eq!(l.current(), 1, "the temporary permit was dropped");
    }

    #[test]
    fn zero_max_admits_nobody() {
        let l = ConnectionLimiter::new(0);
        assert!(l.try_acquire().is_none());
    }
}
