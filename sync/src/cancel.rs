//! A one-way flag that tasks can check or wait on: server shutdown, a
//! connection's teardown.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::facade::{lock, Arc, AtomicBool, Mutex, Ordering};

/// A cloneable flag that goes from "running" to "cancelled" once and never back.
/// Any number of tasks may wait for it with [`CancelFlag::cancelled`].
#[derive(Debug, Clone, Default)]
pub struct CancelFlag {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    waiters: Mutex<Waiters>,
}

#[derive(Debug, Default)]
struct Waiters {
    next_key: u64,
    list: Vec<(u64, Waker)>,
}

impl CancelFlag {
    /// A flag not yet cancelled.
    pub fn new() -> CancelFlag {
        CancelFlag::default()
    }

    /// Cancels the flag and wakes every waiter. Idempotent.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let wakers = std::mem::take(&mut lock(&self.inner.waiters).list);
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// True once [`CancelFlag::cancel`] was called on this flag or a clone.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is cancelled (at once if it already is).
    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            flag: self,
            key: None,
        }
    }
}

/// Future returned by [`CancelFlag::cancelled`]; deregisters itself on drop.
#[derive(Debug)]
pub struct Cancelled<'a> {
    flag: &'a CancelFlag,
    key: Option<u64>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.flag.is_cancelled() {
            return Poll::Ready(());
        }
        let mut waiters = lock(&self.flag.inner.waiters);
        // Re-check under the lock: `cancel` sets the flag before taking the lock.
        if self.flag.is_cancelled() {
            return Poll::Ready(());
        }
        match self.key {
            Some(key) => {
                if let Some((_, w)) = waiters.list.iter_mut().find(|(k, _)| *k == key) {
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
                } else {
                    waiters.list.push((key, cx.waker().clone()));
                }
            }
            None => {
                let key = waiters.next_key;
                waiters.next_key += 1;
                waiters.list.push((key, cx.waker().clone()));
                drop(waiters);
                self.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            lock(&self.flag.inner.waiters)
                .list
                .retain(|(k, _)| *k != key);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct CountWaker(AtomicUsize);
    impl Wake for CountWaker {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn waiters_are_woken_and_deregistered() {
        let flag = CancelFlag::new();
        let count = std::sync::Arc::new(CountWaker(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);

        let mut dropped = Box::pin(flag.cancelled());
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
        drop(dropped);
        assert!(lock(&flag.inner.waiters).list.is_empty());

        let clone = flag.clone();
        let mut a = Box::pin(flag.cancelled());
        let mut b = Box::pin(clone.cancelled());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert_eq!(lock(&flag.inner.waiters).list.len(), 2);
        flag.cancel();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(a.as_mut().poll(&mut cx).is_ready());
        assert!(b.as_mut().poll(&mut cx).is_ready());
        assert!(flag.is_cancelled());
        assert!(Box::pin(flag.cancelled()).as_mut().poll(&mut cx).is_ready());
    }
}
