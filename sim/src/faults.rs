//! Faults: when they strike (a plan derived from the seed) and how many of
//! each kind were injected.
//!
//! Host crashes, KV capacity changes, clock jumps and the graceful shutdown
//! are planned at event counts of the safety phase, so they land among the
//! traffic whatever the simulated time scale; engine faults are rolled per
//! step at the swarm's rates.

use std::fmt;

use tokenwire_core::rng::Rng;
use tokenwire_core::{Duration, EngineFaultKind};

use crate::swarm::{FaultOptions, Swarm};

/// A fault that happens at a planned moment.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Drop the Host and build a new one from nothing.
    Crash,
    /// Memory pressure: the KV pool shrinks to this many blocks, and grows
    /// back to the model's size after this long (simulated time, so that a
    /// run whose traffic stalls on the small pool still sees it end).
    KvShrink(u32, Duration),
    /// The clock leaps forward (the process was frozen this long).
    TimeJump(Duration),
}

/// Faults at event counts of the safety phase, in order.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// `(event count, fault)`, sorted by event count.
    pub at: Vec<(u64, Fault)>,
}

/// Clock jumps that cross the deadlines: keepalive (30 s / 60 s), slow client
/// (30 s), pause timeout (5 min), idle timeout (10 min).
const JUMPS: [u64; 6] = [31, 65, 301, 601, 660, 900];

impl FaultPlan {
    /// The plan of `swarm` over a safety phase of `events` events.
    pub fn new(swarm: &Swarm, events: u64, rng: &mut Rng) -> FaultPlan {
        let f: &FaultOptions = &swarm.faults;
        let span = events.max(10);
        let mut at = Vec::new();
        let when = |rng: &mut Rng| span / 20 + rng.below(span - span / 10);
        for _ in 0..f.crashes {
            at.push((when(rng), Fault::Crash));
        }
        for _ in 0..f.kv_shrinks {
            let start = when(rng);
            let len = Duration::from_millis(1 + rng.below(20_000));
            let pool = swarm.model.num_blocks;
            let blocks = match rng.below(3) {
                0 => 1,
                1 => pool / 4,
                _ => pool / 2,
            }
            .max(1);
            at.push((start, Fault::KvShrink(blocks, len)));
        }
        for _ in 0..f.time_jumps {
            let secs = JUMPS[rng.below(JUMPS.len() as u64) as usize];
            at.push((when(rng), Fault::TimeJump(Duration::from_secs(secs))));
        }
        at.sort_by_key(|(n, _)| *n);
        FaultPlan { at }
    }

    /// Takes the faults due at or before event count `n`.
    pub fn due(&mut self, n: u64) -> Vec<Fault> {
        let k = self.at.iter().take_while(|(e, _)| *e <= n).count();
        self.at.drain(..k).map(|(_, f)| f).collect()
    }
}

/// Rolls an engine fault for one step, if any.
pub fn roll_step(f: &FaultOptions, rng: &mut Rng) -> Option<EngineFaultKind> {
    let x = rng.next_f64();
    if x < f.oom_p {
        Some(EngineFaultKind::OutOfMemory)
    } else if x < f.oom_p + f.device_lost_p {
        Some(EngineFaultKind::DeviceLost)
    } else if x < f.oom_p + f.device_lost_p + f.internal_p {
        Some(EngineFaultKind::Internal("simulated engine failure".into()))
    } else {
        None
    }
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Host crashes.
    pub crash: u64,
    /// Engine out-of-memory steps.
    pub oom: u64,
    /// Device-lost steps.
    pub device_lost: u64,
    /// Internal engine errors.
    pub engine_internal: u64,
    /// KV pool shrinks.
    pub kv_shrink: u64,
    /// Clock jumps.
    pub time_jump: u64,
    /// Graceful shutdowns.
    pub shutdown: u64,
    /// Outbound queues that filled (slow readers).
    pub queue_full: u64,
    /// Malformed or hostile frames sent by clients.
    pub hostile_frame: u64,
    /// Early disconnects by clients.
    pub disconnect: u64,
    /// Times the Host asked to stop reading a connection (frames piling up).
    pub read_paused: u64,
    /// Jobs the simulated verifier refused.
    pub job_refused: u64,
    /// Text jobs the simulated tokenizer failed (for a reason other than
    /// length: a template it could not render).
    pub text_failed: u64,
}

impl FaultCounts {
    /// Adds `other` into `self`.
    pub fn add(&mut self, o: &FaultCounts) {
        self.crash += o.crash;
        self.oom += o.oom;
        self.device_lost += o.device_lost;
        self.engine_internal += o.engine_internal;
        self.kv_shrink += o.kv_shrink;
        self.time_jump += o.time_jump;
        self.shutdown += o.shutdown;
        self.queue_full += o.queue_full;
        self.hostile_frame += o.hostile_frame;
        self.disconnect += o.disconnect;
        self.read_paused += o.read_paused;
        self.job_refused += o.job_refused;
        self.text_failed += o.text_failed;
    }

    /// Counts an engine fault.
    pub fn count_engine(&mut self, kind: &EngineFaultKind) {
        match kind {
            EngineFaultKind::OutOfMemory => self.oom += 1,
            EngineFaultKind::DeviceLost => self.device_lost += 1,
            EngineFaultKind::Internal(_) => self.engine_internal += 1,
        }
    }
}

impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "crash={} oom={} device_lost={} engine_internal={} kv_shrink={} time_jump={} shutdown={} queue_full={} hostile_frame={} disconnect={} read_paused={} job_refused={} text_failed={}",
            self.crash,
            self.oom,
            self.device_lost,
            self.engine_internal,
            self.kv_shrink,
            self.time_jump,
            self.shutdown,
            self.queue_full,
            self.hostile_frame,
            self.disconnect,
            self.read_paused,
            self.job_refused,
            self.text_failed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_sorted_and_drained_in_order() {
        for seed in 0..50 {
            let sw = Swarm::from_seed(seed);
            let mut plan = FaultPlan::new(&sw, 1000, &mut Rng::new(seed));
            assert!(plan.at.windows(2).all(|w| w[0].0 <= w[1].0));
            let total = plan.at.len();
            let mut got = 0;
            for n in 0..3000 {
                got += plan.due(n).len();
            }
            assert_eq!(got, total);
        }
    }
}
