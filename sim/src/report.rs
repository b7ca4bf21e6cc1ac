//! What a run reports: its figures on success, the broken invariant and the
//! command that reproduces it on failure.

use std::collections::BTreeMap;
use std::fmt;

use tokenwire_core::Instant;

use crate::faults::FaultCounts;

/// A run that broke an invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    /// The seed as the user gave it (a number or a commit hash), for the
    /// reproduce command; the number itself when empty.
    pub seed_text: String,
    /// The broken invariant.
    pub invariant: String,
    /// What was seen.
    pub detail: String,
    /// The event (Host input, counted from 1) after which it was seen.
    pub event: u64,
    /// The simulated time then.
    pub time: Instant,
}

impl Failure {
    /// The command that runs this seed again.
    pub fn reproduce(&self) -> String {
        let seed = if self.seed_text.is_empty() {
            self.seed.to_string()
        } else {
            self.seed_text.clone()
        };
        format!("cargo run --release -p tokenwire-sim -- --seed {seed}")
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "invariant `{}` violated: {}",
            self.invariant, self.detail
        )?;
        writeln!(
            f,
            "  seed {} at event {} (simulated time {:.3} s)",
            self.seed,
            self.event,
            self.time.as_nanos() as f64 / 1e9
        )?;
        write!(f, "  reproduce: {}", self.reproduce())
    }
}

impl std::error::Error for Failure {}

/// A run that held every invariant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunReport {
    /// The run's seed.
    pub seed: u64,
    /// Events (Host inputs) handled, both phases.
    pub events: u64,
    /// Of which in the liveness phase and the final hang-up.
    pub liveness_events: u64,
    /// Faults injected.
    pub faults: FaultCounts,
    /// Simulated clients.
    pub clients: u64,
    /// Requests started: `generate` `init`s, `session` turns, `responses`
    /// responses.
    pub requests: u64,
    /// Engine steps planned.
    pub steps: u64,
    /// Simulated time at the end.
    pub sim_time: Instant,
    /// SHA-256 of every input, hex.
    pub inputs_hash: String,
    /// SHA-256 of every output, hex.
    pub outputs_hash: String,
    /// How often each kind of frame and close happened (coverage).
    pub tally: BTreeMap<String, u64>,
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} events ({} in liveness), {} clients, {} requests, {} steps, {:.1} s simulated, faults: {}, outputs {}",
            self.seed,
            self.events,
            self.liveness_events,
            self.clients,
            self.requests,
            self.steps,
            self.sim_time.as_nanos() as f64 / 1e9,
            self.faults,
            &self.outputs_hash[..self.outputs_hash.len().min(16)]
        )
    }
}
