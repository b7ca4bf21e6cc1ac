//! `--replay`: feeds a recorded trace back to a fresh Host, with the same
//! checkers, and compares what comes out with what the trace recorded.
//!
//! A shadow engine checks every plan as the live engine did and recomputes
//! every recorded step result, so a replay also proves the engine
//! deterministic. The outputs' digest at the end must equal the one in the
//! trace's last line.

use std::io::BufRead;

use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{Host, Input};

use crate::driver::Driver;
use crate::invariants::{checkers_except, Monitor};
use crate::report::Failure;
use crate::trace::{End, Line};

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// The recorded run's seed.
    pub seed: u64,
    /// Inputs fed.
    pub events: u64,
    /// Digest of the replayed outputs.
    pub outputs_hash: String,
    /// Digest of the replayed inputs.
    pub inputs_hash: String,
    /// The trace's last line, if it has one.
    pub recorded: Option<End>,
    /// An invariant the replay saw broken (the checkers ran again).
    pub failure: Option<Failure>,
}

impl ReplayReport {
    /// True when the replay produced exactly the recorded outputs.
    pub fn matches(&self) -> bool {
        self.recorded.as_ref().is_some_and(|e| {
            e.outputs == self.outputs_hash
                && e.inputs == self.inputs_hash
                && e.events == self.events
        })
    }
}

/// Replays the trace read from `r`. Errors are unreadable traces.
pub fn replay(r: impl BufRead) -> Result<ReplayReport, String> {
    let mut lines = r.lines();
    let first = lines
        .next()
        .ok_or("empty trace")?
        .map_err(|e| e.to_string())?;
    let Line::Header(h) = Line::parse(&first)? else {
        return Err("the first line of a trace must be its header".into());
    };
    let host = if h.start_loading {
        Host::new(h.host.clone(), h.host_seed)
    } else {
        Host::with_model(
            h.host.clone(),
            h.model.clone(),
            ByteCodec::shared(),
            h.host_seed,
        )
    };
    let mut monitor = Monitor::new(
        h.host.clone(),
        h.model.clone(),
        h.slack,
        checkers_except(&h.skip),
    );
    monitor.set_loaded(!h.start_loading);
    let mut d = Driver::new(host, h.host, h.model, h.engine, monitor, None);
    let mut events = 0u64;
    let mut recorded = None;
    let mut failure = None;
    for (n, line) in lines.enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        match Line::parse(&line).map_err(|e| format!("line {}: {e}", n + 2))? {
            Line::Header(_) => return Err(format!("line {}: a second header", n + 2)),
            Line::End(e) => recorded = Some(e),
            Line::Crash { t, host_seed } => {
                if failure.is_none() {
                    d.crash(t, host_seed);
                }
            }
            Line::Input { t, nominal, input } => {
                if failure.is_some() {
                    continue;
                }
                events += 1;
                let fail = |invariant: &str, detail: String| Failure {
                    seed: h.seed,
                    seed_text: String::new(),
                    invariant: invariant.into(),
                    detail,
                    event: events,
                    time: t,
                };
                match (&input, d.pending_plan.clone()) {
                    (Input::StepDone(done), Some(plan)) => {
                        let ours = d.engine.run(&plan);
                        if ours != *done {
                            failure = Some(fail(
                                "replay",
                                format!(
                                    "the engine answers step {} differently than recorded",
                                    plan.step_id
                                ),
                            ));
                            continue;
                        }
                    }
                    (Input::EngineFault(f), Some(plan)) => d.engine.fail(&plan, &f.kind),
                    _ => {}
                }
                if let Err(v) = d.feed(t, nominal, input) {
                    failure = Some(fail(&v.invariant, v.detail));
                }
            }
        }
    }
    Ok(ReplayReport {
        seed: h.seed,
        events,
        outputs_hash: d.outputs.hex(),
        inputs_hash: d.inputs.hex(),
        recorded,
        failure,
    })
}
