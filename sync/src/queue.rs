//! A connection's bounded outbound queue, with the full/drained signals that
//! pause and resume its generations.
//!
//! One producer (the driver task) pushes; one consumer (the connection's writer,
//! or an HTTP response body) pops. The queue is *full* at `capacity` frames. Pushing
//! past that still succeeds up to a hard limit of `2 * capacity`, because the Host
//! may already have produced a whole step's frames before it learns that the
//! queue is full; beyond the hard limit a push is refused ([`PushResult::Overflow`])
//! and the caller closes the connection. After having been full, the consumer is
//! told once ([`Popped::drained`]) when the length falls to `capacity / 2`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::facade::{lock, Mutex};

/// What a [`OutboundQueue::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushResult {
    /// Queued.
    Ok,
    /// Queued, and the queue just became full: tell the Host `QueueFull`.
    BecameFull,
    /// Not queued: the hard limit (twice the capacity) was reached. Close the
    /// connection (1008).
    Overflow,
    /// Not queued: the queue was closed (the connection is ending).
    Closed,
}

/// One frame taken from the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Popped<T> {
    /// The frame.
    pub item: T,
    /// True exactly once after each full period, when this pop brought the
    /// length down to `capacity / 2`: tell the Host `QueueDrained`.
    pub drained: bool,
}

/// What [`OutboundQueue::try_pop`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pop<T> {
    /// A frame.
    Item(Popped<T>),
    /// Nothing now; more may come.
    Empty,
    /// Nothing, and nothing will come: the queue is closed and empty.
    Closed,
}

/// A bounded single-producer single-consumer queue of outbound frames. See the
/// module documentation for its limits and signals.
#[derive(Debug)]
pub struct OutboundQueue<T> {
    capacity: usize,
    state: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    /// Reached `capacity` and not yet drained to `capacity / 2`.
    full: bool,
    /// No more pushes; the consumer gets what is left, then the end.
    closed: bool,
    /// The consumer's waker (there is one consumer).
    waker: Option<Waker>,
}

impl<T> OutboundQueue<T> {
    /// A queue that is full at `capacity` frames (at least 1) and refuses
    /// frames beyond `2 * capacity`.
    pub fn new(capacity: usize) -> OutboundQueue<T> {
        OutboundQueue {
            capacity: capacity.max(1),
            state: Mutex::new(State {
                items: VecDeque::new(),
                full: false,
                closed: false,
                waker: None,
            }),
        }
    }

    /// The capacity at which the queue counts as full.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The hard limit on queued frames (`2 * capacity`).
    pub fn hard_limit(&self) -> usize {
        self.capacity.saturating_mul(2)
    }

    /// Frames queued now.
    pub fn len(&self) -> usize {
        lock(&self.state).items.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True from the push that reached `capacity` until the pop that drained it
    /// to `capacity / 2`.
    pub fn is_full(&self) -> bool {
        lock(&self.state).full
    }

    /// True once the queue was closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// Queues `item` (see [`PushResult`]).
    pub fn push(&self, item: T) -> PushResult {
        let mut st = lock(&self.state);
        if st.closed {
            return PushResult::Closed;
        }
        if st.items.len() >= self.hard_limit() {
            return PushResult::Overflow;
        }
        st.items.push_back(item);
        let result = if !st.full && st.items.len() >= self.capacity {
            st.full = true;
            PushResult::BecameFull
        } else {
            PushResult::Ok
        };
        wake(st);
        result
    }

    /// Queues `item` as the last frame, ignoring the limits, and closes the queue.
    /// Returns false (and drops `item`) if the queue was already closed.
    pub fn push_final(&self, item: T) -> bool {
        let mut st = lock(&self.state);
        if st.closed {
            return false;
        }
        st.items.push_back(item);
        st.closed = true;
        wake(st);
        true
    }

    /// Discards every queued frame, queues `last` (if any) as the only frame and
    /// closes the queue; used when the consumer is too slow to be waited for.
    /// Returns false (and changes nothing) if the queue was already closed.
    pub fn close_now(&self, last: Option<T>) -> bool {
        let mut st = lock(&self.state);
        if st.closed {
            return false;
        }
        st.items.clear();
        st.items.extend(last);
        st.full = false;
        st.closed = true;
        wake(st);
        true
    }

    /// Closes the queue: no more pushes; the consumer gets what is queued, then
    /// the end.
    pub fn close(&self) {
        let mut st = lock(&self.state);
        if !st.closed {
            st.closed = true;
            wake(st);
        }
    }

    /// Takes the next frame without waiting.
    pub fn try_pop(&self) -> Pop<T> {
        let mut st = lock(&self.state);
        match st.items.pop_front() {
            Some(item) => {
                let drained = st.full && st.items.len() <= self.capacity / 2;
                if drained {
                    st.full = false;
                }
                Pop::Item(Popped { item, drained })
            }
            None if st.closed => Pop::Closed,
            None => Pop::Empty,
        }
    }

    /// Polls for the next frame: `Ready(Some)` with a frame, `Ready(None)` when the
    /// queue is closed and empty, `Pending` (waker registered) otherwise.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<Popped<T>>> {
        match self.try_pop() {
            Pop::Item(p) => Poll::Ready(Some(p)),
            Pop::Closed => Poll::Ready(None),
            Pop::Empty => {
                let mut st = lock(&self.state);
                // Re-check under the lock so a push between the two locks is not missed.
                if !st.items.is_empty() || st.closed {
                    drop(st);
                    cx.waker().wake_by_ref();
                } else {
                    register(&mut st.waker, cx.waker());
                }
                Poll::Pending
            }
        }
    }

    /// Waits for the next frame; `None` when the queue is closed and empty.
    pub fn pop(&self) -> PopFuture<'_, T> {
        PopFuture { queue: self }
    }

    /// Polls for closure: `Ready` once the queue is closed (frames may remain).
    pub fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = lock(&self.state);
        if st.closed {
            Poll::Ready(())
        } else {
            register(&mut st.waker, cx.waker());
            Poll::Pending
        }
    }

    /// Resolves once the queue is closed (frames may remain).
    pub fn closed(&self) -> ClosedFuture<'_, T> {
        ClosedFuture { queue: self }
    }
}

fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

/// Wakes the consumer after the lock is released.
fn wake<T>(mut st: super::facade::MutexGuard<'_, State<T>>) {
    let waker = st.waker.take();
    drop(st);
    if let Some(w) = waker {
        w.wake();
    }
}

/// Future of [`OutboundQueue::pop`].
#[derive(Debug)]
pub struct PopFuture<'a, T> {
    queue: &'a OutboundQueue<T>,
}

impl<T> Future for PopFuture<'_, T> {
    type Output = Option<Popped<T>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.queue.poll_pop(cx)
    }
}

/// Future of [`OutboundQueue::closed`].
#[derive(Debug)]
pub struct ClosedFuture<'a, T> {
    queue: &'a OutboundQueue<T>,
}

impl<T> Future for ClosedFuture<'_, T> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.queue.poll_closed(cx)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    fn item(p: Pop<u32>) -> Popped<u32> {
        match p {
            Pop::Item(p) => p,
            other => panic!("expected an item, got {other:?}"),
        }
    }

    #[test]
    fn becomes_full_once_at_capacity_and_overflows_past_twice() {
        let q = OutboundQueue::new(4);
        assert_eq!(q.push(1), PushResult::Ok);
        assert_eq!(q.push(2), PushResult::Ok);
        assert_eq!(q.push(3), PushResult::Ok);
        assert!(!q.is_full());
        assert_eq!(q.push(4), PushResult::BecameFull);
        assert!(q.is_full());
        for i in 5..=8 {
            assert_eq!(
                q.push(i),
                PushResult::Ok,
                "past capacity up to the hard limit"
            );
        }
        assert_eq!(q.len(), 8);
        assert_eq!(q.push(9), PushResult::Overflow);
        assert_eq!(q.len(), 8, "an overflowing frame is not queued");
    }

    #[test]
    fn drained_once_at_half_capacity_after_full() {
        let q = OutboundQueue::new(4);
        for i in 0..6 {
            q.push(i);
        }
        // 6 -> 5 -> 4 -> 3: not yet; 3 -> 2 == capacity / 2: drained.
        for expect in 0..3 {
            let p = item(q.try_pop());
            assert_eq!((p.item, p.drained), (expect, false));
        }
        let p = item(q.try_pop());
        assert_eq!((p.item, p.drained), (3, true));
        assert!(!q.is_full());
        let p = item(q.try_pop());
        assert!(!p.drained, "drained is reported once");
        // Full again, drained again.
        for i in 10..14 {
            q.push(i);
        }
        assert!(q.is_full());
        let mut drains = 0;
        while let Pop::Item(p) = q.try_pop() {
            drains += usize::from(p.drained);
        }
        assert_eq!(drains, 1);
        assert_eq!(q.try_pop(), Pop::Empty);
    }

    #[test]
    fn never_full_means_never_drained() {
        let q = OutboundQueue::new(4);
        q.push(1);
        q.push(2);
        q.push(3);
        while let Pop::Item(p) = q.try_pop() {
            assert!(!p.drained);
        }
    }

    #[test]
    fn capacity_one() {
        let q = OutboundQueue::new(1);
        assert_eq!(q.push(1), PushResult::BecameFull);
        assert_eq!(q.push(2), PushResult::Ok);
        assert_eq!(q.push(3), PushResult::Overflow);
        assert!(!item(q.try_pop()).drained);
        assert!(item(q.try_pop()).drained, "drained when empty (1 / 2 == 0)");
    }

    #[test]
    fn close_final_and_close_now() {
        let q = OutboundQueue::new(2);
        q.push(1);
        assert!(q.push_final(99));
        assert_eq!(q.push(2), PushResult::Closed);
        assert!(!q.push_final(100));
        assert_eq!(item(q.try_pop()).item, 1);
        assert_eq!(item(q.try_pop()).item, 99);
        assert_eq!(q.try_pop(), Pop::Closed);

        let q = OutboundQueue::new(2);
        for i in 0..4 {
            q.push(i);
        }
        assert!(q.close_now(Some(7)));
        assert_eq!(item(q.try_pop()).item, 7);
        assert_eq!(q.try_pop(), Pop::Closed);

        let q: OutboundQueue<u32> = OutboundQueue::new(2);
        q.push(5);
        q.close();
        assert!(q.is_closed());
        assert_eq!(item(q.try_pop()).item, 5);
        assert_eq!(q.try_pop(), Pop::Closed);
    }

    struct CountWaker(AtomicUsize);
    impl Wake for CountWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn pending_pop_is_woken_by_push_and_close() {
        let q = OutboundQueue::new(2);
        let count = Arc::new(CountWaker(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(q.poll_pop(&mut cx).is_pending());
        q.push(1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            q.poll_pop(&mut cx),
            Poll::Ready(Some(Popped { item: 1, .. }))
        ));
        assert!(q.poll_pop(&mut cx).is_pending());
        assert!(q.poll_closed(&mut cx).is_pending());
        q.close();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(q.poll_closed(&mut cx).is_ready());
        assert!(matches!(q.poll_pop(&mut cx), Poll::Ready(None)));
    }

    /// Wakes a parked thread.
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Runs `fut` to completion on this thread, parking between polls (a
    /// lost wakeup would hang here, not pass).
    fn block_on<F: Future>(fut: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(out) => return out,
                Poll::Pending => std::thread::park(),
            }
        }
    }

    #[test]
    fn async_consumer_on_another_thread_sees_every_frame_in_order() {
        let q = Arc::new(OutboundQueue::new(8));
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                block_on(async {
                    let mut got = Vec::new();
                    while let Some(p) = q.pop().await {
                        got.push(p.item);
                    }
                    got
                })
            })
        };
        let mut sent = 0u32;
        while sent < 1000 {
            match q.push(sent) {
                PushResult::Ok | PushResult::BecameFull => sent += 1,
                PushResult::Overflow => std::thread::yield_now(),
                PushResult::Closed => unreachable!(),
            }
        }
        q.close();
        let got = consumer.join().expect("consumer thread");
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }
}
