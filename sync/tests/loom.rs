//! Loom models of the primitives: every interleaving of a few threads racing on
//! each one, within a preemption bound. Built only under `--cfg loom`:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p tokenwire-sync --release --test loom
//! ```
//!
//! A model fails by panicking (an assertion) or by deadlocking: loom reports a
//! deadlock when every thread is blocked, which is how a lost wakeup shows up
//! under `loom::future::block_on`.

#![cfg(loom)]

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::task::{Context, Wake, Waker};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use tokenwire_sync::{CancelFlag, ConnectionLimiter, OutboundQueue, PerKeyLimiter, PushResult};

/// Runs `f` under loom with a default preemption bound of 3, which
/// `LOOM_MAX_PREEMPTIONS` overrides.
fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A waker that counts its wakes (in a loom atomic, so the count is part of
/// the model).
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts, across all the executions of one model, those that reached a case
/// the model is meant to cover; checked after the model so a model that stops
/// reaching it fails instead of passing vacuously.
struct Coverage(StdAtomicUsize);

impl Coverage {
    const fn new() -> Coverage {
        Coverage(StdAtomicUsize::new(0))
    }
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn assert_hit(&self, what: &str) {
        assert!(
            self.0.load(Ordering::Relaxed) > 0,
            "no execution of the model {what}"
        );
    }
}

fn counting_waker() -> (std::sync::Arc<CountingWaker>, Waker) {
    let count = std::sync::Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    (count, waker)
}

/// Three threads race for two slots: at no point are more than two permits
/// alive, and once every permit is dropped the count is back to zero and a
/// new acquire succeeds.
#[test]
fn limiter_never_exceeds_its_limit() {
    const LIMIT: usize = 2;
    const THREADS: usize = 3;
    static REFUSED: Coverage = Coverage::new();
    model(|| {
        let limiter = ConnectionLimiter::new(LIMIT);
        // Permits this model holds now: raised after an acquire succeeds,
        // lowered before the permit is dropped, so it never overcounts.
        let alive = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let limiter = limiter.clone();
                let alive = alive.clone();
                thread::spawn(move || {
                    if let Some(permit) = limiter.try_acquire() {
                        let now = alive.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= LIMIT, "{now} permits alive, limit {LIMIT}");
                        assert!(limiter.current() <= LIMIT);
                        alive.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        true
                    } else {
                        false
                    }
                })
            })
            .collect();
        let admitted = handles
            .into_iter()
            .map(|h| h.join().expect("limiter thread"))
            .filter(|&admitted| admitted)
            .count();
        assert!(admitted >= LIMIT, "a refusal needs {LIMIT} permits alive");
        if admitted < THREADS {
            REFUSED.hit();
        }
        assert_eq!(limiter.current(), 0, "every permit was released");
        let again = limiter.try_acquire();
        assert!(again.is_some(), "a freed limiter admits again");
        assert_eq!(limiter.current(), 1);
    });
    REFUSED.assert_hit("refused a thread (all slots taken at once)");
}

/// Two threads of one address race with one of another for a limit of one
/// per address: never two permits of one address alive, the other address
/// never refused, and no address is remembered once its permits are gone.
#[test]
fn per_key_limiter_caps_each_key_and_forgets_free_ones() {
    static REFUSED: Coverage = Coverage::new();
    model(|| {
        let limiter = PerKeyLimiter::new(1);
        let alive_a = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = ["a", "a", "b"]
            .into_iter()
            .map(|key| {
                let limiter = limiter.clone();
                let alive_a = alive_a.clone();
                thread::spawn(move || match limiter.try_acquire(key) {
                    Some(permit) => {
                        if key == "a" {
                            let now = alive_a.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 1, "{now} permits of one address alive");
                            alive_a.fetch_sub(1, Ordering::SeqCst);
                        }
                        drop(permit);
                        true
                    }
                    None => {
                        assert_eq!(key, "a", "the other address is never refused");
                        false
                    }
                })
            })
            .collect();
        let admitted: Vec<bool> = handles
            .into_iter()
            .map(|h| h.join().expect("limiter thread"))
            .collect();
        if admitted.iter().filter(|&&a| !a).count() > 0 {
            REFUSED.hit();
        }
        assert_eq!(limiter.keys(), 0, "no address kept without a permit");
    });
    REFUSED.assert_hit("refused an address that held its permit");
}

/// One thread waits on `cancelled()` (parking between polls) while another
/// cancels: the waiter always wakes up and sees the flag (a lost wakeup is a
/// deadlock, which loom reports).
#[test]
fn cancel_wakes_a_parked_waiter() {
    model(|| {
        let flag = CancelFlag::new();
        let waiter = {
            let flag = flag.clone();
            thread::spawn(move || {
                loom::future::block_on(flag.cancelled());
                assert!(flag.is_cancelled());
            })
        };
        flag.cancel();
        waiter.join().expect("waiter thread");
        assert!(flag.is_cancelled());
    });
}

/// Two threads cancel while the main thread polls `Cancelled` once with a
/// counting waker: if that poll was `Pending`, the waker is woken exactly once
/// (cancel is idempotent: the second cancel wakes nobody again), and the next
/// poll is `Ready`; if it was `Ready`, nobody was registered to wake.
#[test]
fn cancel_is_idempotent_and_wakes_each_waiter_once() {
    static PENDING: Coverage = Coverage::new();
    static READY: Coverage = Coverage::new();
    model(|| {
        let flag = CancelFlag::new();
        let cancellers: Vec<_> = (0..2)
            .map(|_| {
                let flag = flag.clone();
                thread::spawn(move || flag.cancel())
            })
            .collect();

        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(flag.cancelled());
        let first = fut.as_mut().poll(&mut cx);

        for c in cancellers {
            c.join().expect("canceller thread");
        }
        let wakes = count.0.load(Ordering::SeqCst);
        if first.is_pending() {
            PENDING.hit();
            assert_eq!(wakes, 1, "a registered waiter is woken exactly once");
            assert!(fut.as_mut().poll(&mut cx).is_ready());
        } else {
            READY.hit();
            assert_eq!(wakes, 0, "nothing was registered");
        }
        assert!(flag.is_cancelled());
        let mut fresh = pin!(flag.cancelled());
        assert!(fresh.as_mut().poll(&mut cx).is_ready());
    });
    PENDING.assert_hit("registered the waiter before the cancel");
    READY.assert_hit("saw the cancel on the first poll");
}

/// What one push returned, with what the producer knew around it.
struct PushRecord {
    item: usize,
    result: PushResult,
    /// Pops finished before the push (a lower bound on the pops before it).
    popped_before: usize,
    /// Pops started by the time the push returned (an upper bound).
    popping_after: usize,
}

/// The producer pushes up to five frames into a queue of capacity 2 (hard
/// limit 4), stopping at the first `Overflow`, then closes; the consumer pops
/// with `pop().await` (parking between polls) until the end.
///
/// Checks FIFO with nothing lost or duplicated, and the full/drained signals
/// against the pops the producer knows happened before a push (finished) and
/// could have happened (started): `BecameFull` exactly when the length
/// reaches the capacity with no full period open, `Ok` past the capacity only
/// inside a full period, `Overflow` only at the hard limit, and one `drained`
/// per full period, after its `BecameFull` and before the next.
#[test]
fn queue_fifo_with_full_and_drained_signals() {
    const CAP: usize = 2;
    const PUSHES: usize = 5;
    static OVERFLOWED: Coverage = Coverage::new();
    static FULL_TWICE: Coverage = Coverage::new();
    model(|| {
        let q = Arc::new(OutboundQueue::<usize>::new(CAP));
        // Pops finished: raised after a pop returns, so never an overcount.
        let popped = Arc::new(AtomicUsize::new(0));
        // Pops started: raised before a pop begins, so never an undercount.
        let popping = Arc::new(AtomicUsize::new(0));

        let consumer = {
            let q = q.clone();
            let (popped, popping) = (popped.clone(), popping.clone());
            thread::spawn(move || {
                loom::future::block_on(async {
                    let mut got = Vec::new();
                    loop {
                        popping.store(got.len() + 1, Ordering::SeqCst);
                        let Some(p) = q.pop().await else { break };
                        got.push((p.item, p.drained));
                        popped.store(got.len(), Ordering::SeqCst);
                    }
                    got
                })
            })
        };

        let mut pushes = Vec::new();
        for item in 0..PUSHES {
            let popped_before = popped.load(Ordering::SeqCst);
            let result = q.push(item);
            let popping_after = popping.load(Ordering::SeqCst);
            pushes.push(PushRecord {
                item,
                result,
                popped_before,
                popping_after,
            });
            if result != PushResult::Ok && result != PushResult::BecameFull {
                break;
            }
        }
        q.close();
        let got = consumer.join().expect("consumer thread");

        let accepted = pushes
            .iter()
            .filter(|r| matches!(r.result, PushResult::Ok | PushResult::BecameFull))
            .count();
        let items: Vec<usize> = got.iter().map(|&(item, _)| item).collect();
        assert_eq!(items, (0..accepted).collect::<Vec<_>>(), "FIFO, all once");
        let became_full: Vec<usize> = pushes
            .iter()
            .filter(|r| r.result == PushResult::BecameFull)
            .map(|r| r.item)
            .collect();
        let drained: Vec<usize> = got
            .iter()
            .filter(|&&(_, drained)| drained)
            .map(|&(item, _)| item)
            .collect();
        let signals = format!("BecameFull at {became_full:?}, drained at {drained:?}");
        // Emptying the queue always passes capacity / 2, so every full period
        // ends with exactly one drained.
        assert_eq!(became_full.len(), drained.len(), "{signals}");

        // Pushing item `j` makes the length `j + 1 - pops`, where `pops`
        // (before the push) lies in `popped_before..=popping_after`. A
        // drained pop of item `i` leaves at most `CAP / 2` queued, so it comes
        // before the push of every item `j > i + CAP / 2`.
        for r in &pushes {
            let j = r.item;
            let (len_min, len_max) = (
                (j + 1).saturating_sub(r.popping_after),
                j - r.popped_before + 1,
            );
            let fulls_before = became_full.iter().filter(|&&b| b < j).count();
            match r.result {
                PushResult::BecameFull => assert!(
                    (len_min..=len_max).contains(&CAP),
                    "BecameFull at item {j} with {len_min}..={len_max} queued; {signals}"
                ),
                PushResult::Ok if len_min >= CAP => {
                    // Past the capacity: only inside a full period, that is
                    // before the drained of the last BecameFull.
                    assert!(
                        fulls_before > 0,
                        "Ok at item {j} with {len_min} queued; {signals}"
                    );
                    let open = drained
                        .get(fulls_before - 1)
                        .is_none_or(|&i| i + CAP / 2 >= j);
                    assert!(
                        open,
                        "Ok at item {j} with {len_min} queued after the drain; {signals}"
                    );
                }
                PushResult::Ok => {}
                PushResult::Overflow => {
                    assert!(
                        len_max > q.hard_limit(),
                        "Overflow at item {j} with at most {} queued (hard limit {})",
                        len_max - 1,
                        q.hard_limit()
                    );
                    OVERFLOWED.hit();
                }
                PushResult::Closed => panic!("nobody else closes the queue"),
            }
        }
        for (k, (&full_at, &drained_at)) in became_full.iter().zip(&drained).enumerate() {
            // The push of `full_at` left `CAP` frames queued, so the items
            // before `full_at + 1 - CAP` were popped before it, the rest after.
            assert!(
                drained_at + CAP > full_at,
                "drained #{k} before its BecameFull; {signals}"
            );
            if let Some(&next_full_at) = became_full.get(k + 1) {
                assert!(
                    drained_at + CAP <= next_full_at,
                    "BecameFull #{} before drained #{k}; {signals}",
                    k + 1
                );
            }
        }
        if became_full.len() >= 2 {
            FULL_TWICE.hit();
        }
        assert!(q.is_closed() && q.is_empty() && !q.is_full());
    });
    OVERFLOWED.assert_hit("overflowed");
    FULL_TWICE.assert_hit("went full, drained and went full again");
}

/// Closing an empty queue wakes a consumer parked in `pop()`, which then
/// ends (a lost wakeup is a deadlock).
#[test]
fn queue_close_wakes_a_consumer_parked_in_pop() {
    model(|| {
        let q = Arc::new(OutboundQueue::<u32>::new(2));
        let consumer = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.pop()))
        };
        q.close();
        assert_eq!(consumer.join().expect("consumer thread"), None);
    });
}

/// Closing a queue wakes a consumer parked in `closed()`.
#[test]
fn queue_close_wakes_a_consumer_parked_in_closed() {
    model(|| {
        let q = Arc::new(OutboundQueue::<u32>::new(2));
        let consumer = {
            let q = q.clone();
            thread::spawn(move || {
                loom::future::block_on(q.closed());
                q.is_closed()
            })
        };
        q.close();
        assert!(consumer.join().expect("consumer thread"));
    });
}
