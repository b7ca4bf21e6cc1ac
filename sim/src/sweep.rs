//! Sweeps: many seeds over a few worker threads, one seed run twice to check
//! determinism, and the totals for the summary line.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokenwire_core::rng::mix64;

use crate::faults::FaultCounts;
use crate::report::{Failure, RunReport};
use crate::runner::{run_seed_with, RunOptions};

/// Totals of a sweep.
#[derive(Debug, Clone, Default)]
pub struct SweepReport {
    /// Seeds run (the determinism re-run not counted).
    pub seeds: u64,
    /// Events over all seeds (the re-run included).
    pub events: u64,
    /// Faults over all seeds.
    pub faults: FaultCounts,
    /// Requests started over all seeds.
    pub requests: u64,
    /// Failed seeds, in seed order.
    pub failures: Vec<Failure>,
    /// Coverage tallies over all seeds.
    pub tally: std::collections::BTreeMap<String, u64>,
    /// The seed run twice, and whether both runs agreed.
    pub determinism: Option<(u64, Result<(), String>)>,
}

/// The seed of `range` that a sweep runs twice (derived from the range).
pub fn determinism_seed(range: &Range<u64>) -> Option<u64> {
    let len = range.end.checked_sub(range.start)?;
    (len > 0).then(|| range.start + mix64(range.start, range.end) % len)
}

/// Compares two runs of one seed.
pub fn compare_runs(
    a: &Result<RunReport, Failure>,
    b: &Result<RunReport, Failure>,
) -> Result<(), String> {
    match (a, b) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(a), Err(b)) if a == b => Ok(()),
        (Ok(a), Ok(b)) => Err(format!(
            "outputs {} vs {} (inputs {} vs {})",
            a.outputs_hash, b.outputs_hash, a.inputs_hash, b.inputs_hash
        )),
        _ => Err(format!(
            "one run failed and the other did not, or they failed differently: {:?} vs {:?}",
            a.as_ref().err().map(|f| (&f.invariant, f.event)),
            b.as_ref().err().map(|f| (&f.invariant, f.event))
        )),
    }
}

/// Runs every seed of `seeds` with `opts`, on `jobs` threads; `progress`
/// hears of each finished seed (in completion order).
pub fn sweep(
    seeds: Range<u64>,
    opts: &RunOptions,
    jobs: usize,
    progress: &(dyn Fn(&Result<RunReport, Failure>) + Sync),
) -> SweepReport {
    let next = AtomicU64::new(seeds.start);
    let results: Mutex<Vec<Result<RunReport, Failure>>> = Mutex::new(Vec::new());
    let twice = determinism_seed(&seeds);
    let first_of_twice: Mutex<Option<Result<RunReport, Failure>>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    break;
                }
                let r = run_seed_with(seed, opts, None);
                progress(&r);
                if Some(seed) == twice {
                    if let Ok(mut f) = first_of_twice.lock() {
                        *f = Some(r.clone());
                    }
                }
                if let Ok(mut all) = results.lock() {
                    all.push(r);
                }
            });
        }
    });
    let mut report = SweepReport::default();
    let results = results.into_inner().unwrap_or_default();
    for r in &results {
        report.seeds += 1;
        match r {
            Ok(r) => {
                report.events += r.events;
                report.faults.add(&r.faults);
                report.requests += r.requests;
                for (k, v) in &r.tally {
                    *report.tally.entry(k.clone()).or_default() += v;
                }
            }
            Err(f) => {
                report.events += f.event;
                report.failures.push(f.clone());
            }
        }
    }
    report.failures.sort_by_key(|f| f.seed);
    if let Some(seed) = twice {
        let again = run_seed_with(seed, opts, None);
        if let Ok(r) = &again {
            report.events += r.events;
        }
        let first = first_of_twice.into_inner().ok().flatten();
        let verdict = match first {
            Some(first) => compare_runs(&first, &again),
            None => Err("the first run of the seed is missing".into()),
        };
        report.determinism = Some((seed, verdict));
    }
    report
}
