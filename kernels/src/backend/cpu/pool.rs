//! A persistent pool of worker threads for the CPU backend's matrix
//! products, built for many small jobs per step: a decode step of a 30-layer
//! model runs about 200 products of well under a millisecond each, and
//! waking a sleeping thread through the OS for each (as a general-purpose
//! pool does) costs as much as the product. Workers spin briefly on a job
//! counter after each job, so the next one starts within nanoseconds, and
//! sleep on a condition variable once idle (between steps), so an idle
//! server burns no CPU.
//!
//! [`Pool::run`] hands out task indices `0..tasks` of one job to the workers
//! and the calling thread, and returns when every task has finished.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker spins for the next job before it sleeps: longer than
/// the gaps between the products of one step, far shorter than a step.
const SPIN: Duration = Duration::from_micros(200);

/// A job with its lifetime erased: `call(data, i)` runs task `i`.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize),
    tasks: u64,
    epoch: u64,
}

// SAFETY: `data` points to an `F: Sync` (see `Pool::run`), so calling it from
// other threads is allowed; the pointer itself is just an address.
unsafe impl Send for Job {}

struct Shared {
    job: Mutex<Option<Job>>,
    /// Bumped for every job; workers wait for it to change.
    epoch: AtomicU64,
    /// `epoch << 32 | next task index`: a task is claimed by moving the index
    /// on only while the epoch is the claimer's, so a worker late to one job
    /// can never claim a task of the next with the first one's pointer.
    claim: AtomicU64,
    done: AtomicUsize,
    sleeping: AtomicUsize,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The pool. Dropping it stops and joins its workers.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads())
    }
}

unsafe fn trampoline<F: Fn(usize) + Sync>(data: *const (), i: usize) {
    // SAFETY: `data` was made from a `&F` by `Pool::run`, which does not
    // return (so the `F` lives) until every task that could call this is done.
    let f = unsafe { &*(data as *const F) };
    f(i)
}

impl Shared {
    /// Claims and runs tasks of `job` until none is left.
    fn work(&self, job: Job) {
        loop {
            let c = self.claim.load(Ordering::Acquire);
            let (epoch, i) = (c >> 32, c & 0xFFFF_FFFF);
            if epoch != job.epoch & 0xFFFF_FFFF || i >= job.tasks {
                return;
            }
            if self
                .claim
                .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // SAFETY: task `i` of job `epoch` was claimed while that job's
            // `run` waits for it, so `data` is live (see `trampoline`).
            unsafe { (job.call)(job.data, i as usize) };
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn worker(&self) {
        let mut seen = 0;
        loop {
            let start = Instant::now();
            let mut spins = 0u32;
            while self.epoch.load(Ordering::Acquire) == seen && !self.stop.load(Ordering::Acquire) {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                    self.sleeping.fetch_add(1, Ordering::SeqCst);
                    let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                    while self.epoch.load(Ordering::SeqCst) == seen
                        && !self.stop.load(Ordering::SeqCst)
                    {
                        g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                    drop(g);
                    self.sleeping.fetch_sub(1, Ordering::SeqCst);
                }
                std::hint::spin_loop();
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            seen = self.epoch.load(Ordering::Acquire);
            let job = *self.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(job) = job {
                self.work(job);
            }
        }
    }
}

impl Pool {
    /// A pool running jobs on `threads` threads: the caller plus
    /// `threads - 1` workers.
    pub(crate) fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            epoch: AtomicU64::new(0),
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .filter_map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("tokenwire-cpu-{i}"))
                    .spawn(move || s.worker())
                    .ok()
            })
            .collect();
        Pool { shared, workers }
    }

    /// Threads that run a job (the caller included).
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) .. f(tasks - 1)` across the pool and the calling thread;
    /// returns when all have run.
    pub(crate) fn run<F: Fn(usize) + Sync>(&self, tasks: usize, f: &F) {
        if self.workers.is_empty() || tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        let epoch = s.epoch.load(Ordering::Acquire) + 1;
        let job = Job {
            data: f as *const F as *const (),
            call: trampoline::<F>,
            tasks: tasks as u64,
            epoch,
        };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.done.store(0, Ordering::Release);
        s.claim
            .store((epoch & 0xFFFF_FFFF) << 32, Ordering::Release);
        s.epoch.store(epoch, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.work(job);
        // Every task is claimed; wait for those still running elsewhere.
        while s.done.load(Ordering::Acquire) < tasks {
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Pool {
    /// Runs `f(i, chunk)` for every `chunk_len`-long chunk `i` of `dst`
    /// across the pool. Each task locks only its own chunk (uncontended),
    /// which lets tasks write disjoint parts of `dst` without `unsafe`.
    pub(crate) fn for_each_chunk<T: Send, F>(&self, dst: &mut [T], chunk_len: usize, f: F)
    where
        F: Fn(usize, &mut [T]) + Sync,
    {
        let chunk_len = chunk_len.max(1);
        // One chunk, or no workers: no hand-off (and no allocation) needed.
        if self.workers.is_empty() || dst.len() <= chunk_len {
            for (i, c) in dst.chunks_mut(chunk_len).enumerate() {
                f(i, c);
            }
            return;
        }
        let chunks: Vec<Mutex<&mut [T]>> = dst.chunks_mut(chunk_len).map(Mutex::new).collect();
        self.run(chunks.len(), &|i| {
            let mut c = chunks[i].lock().unwrap_or_else(|e| e.into_inner());
            f(i, &mut c)
        });
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_of_every_job_runs_exactly_once() {
        let pool = Pool::new(3);
        for round in 0..2000usize {
            let tasks = round % 37 + 1;
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(tasks, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
            if round % 500 == 0 {
                // Wait until both workers have gone to sleep: the next job
                // must wake them.
                let deadline = Instant::now() + Duration::from_secs(10);
                while pool.shared.sleeping.load(Ordering::SeqCst) < 2 {
                    assert!(Instant::now() < deadline, "workers never slept");
                    std::thread::yield_now();
                }
            }
        }
    }

    #[test]
    fn a_pool_of_one_runs_inline_and_drops_cleanly() {
        let pool = Pool::new(1);
        let sum = AtomicUsize::new(0);
        pool.run(10, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
        drop(Pool::new(4));
    }
}
