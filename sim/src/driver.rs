//! Feeds inputs to a Host and runs everything that must follow each one:
//! tracing, digests, the invariant checkers, plan validation by the engine,
//! and catching a panic (a panicking core is itself a broken invariant).
//! Shared by live runs and `--replay`, so both judge a run the same way.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{Host, HostConfig, Input, Instant, ModelInfo, Output, StepPlan};

use crate::digest::Digest;
use crate::engine::{SimEngine, ENGINE_PLAN};
use crate::invariants::{EndState, Monitor, Violation};
use crate::swarm::EngineOptions;
use crate::trace::Line;

/// Name of the invariant a panic in the core breaks.
pub const NO_PANIC: &str = "no_panic";

/// A Host under observation.
pub struct Driver<'w> {
    /// The Host.
    pub host: Host,
    /// The engine (computing in live runs, a shadow in replays).
    pub engine: SimEngine,
    /// The checkers.
    pub monitor: Monitor,
    /// The step handed out and not yet answered.
    pub pending_plan: Option<StepPlan>,
    /// Digest of the inputs.
    pub inputs: Digest,
    /// Digest of the outputs.
    pub outputs: Digest,
    /// Steps planned.
    pub steps: u64,
    /// Host crashes so far.
    pub crashes: u64,
    trace: Option<&'w mut dyn Write>,
    config: HostConfig,
    model: ModelInfo,
    engine_opts: EngineOptions,
}

impl<'w> Driver<'w> {
    /// A driver for `host`, checked by `monitor`, tracing to `trace`.
    pub fn new(
        host: Host,
        config: HostConfig,
        model: ModelInfo,
        engine_opts: EngineOptions,
        monitor: Monitor,
        trace: Option<&'w mut dyn Write>,
    ) -> Driver<'w> {
        Driver {
            host,
            engine: SimEngine::new(engine_opts.clone(), model.clone()),
            monitor,
            pending_plan: None,
            inputs: Digest::default(),
            outputs: Digest::default(),
            steps: 0,
            crashes: 0,
            trace,
            config,
            model,
            engine_opts,
        }
    }

    /// Writes a trace line (tracing failures are ignored: the run goes on).
    pub fn write(&mut self, line: &Line) {
        if let Some(w) = self.trace.as_mut() {
            let _ = writeln!(w, "{}", line.to_json());
        }
    }

    /// True when a trace is being written.
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Feeds `input` at `now` (meant for `nominal`) and returns the outputs.
    pub fn feed(
        &mut self,
        now: Instant,
        nominal: Instant,
        input: Input,
    ) -> Result<Vec<Output>, Violation> {
        if self.trace.is_some() {
            let line = Line::Input {
                t: now,
                nominal,
                input: input.clone(),
            };
            self.write(&line);
        }
        self.inputs.input(&input);
        self.monitor.input(now, nominal, &input)?;
        if matches!(input, Input::StepDone(_) | Input::EngineFault(_)) {
            self.pending_plan = None;
        }
        let host = &mut self.host;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| host.handle(now, input))) {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            return Err(Violation {
                invariant: NO_PANIC.into(),
                detail: format!("Host::handle panicked: {msg}"),
            });
        }
        let mut outs = Vec::new();
        while let Some(out) = self.host.poll_output() {
            self.outputs.output(&out);
            self.monitor.output(&out)?;
            if let Output::RunStep(plan) = &out {
                self.steps += 1;
                if let Some(p) = &self.pending_plan {
                    return Err(Violation {
                        invariant: ENGINE_PLAN.into(),
                        detail: format!(
                            "step {} handed out while step {} is outstanding",
                            plan.step_id, p.step_id
                        ),
                    });
                }
                self.engine.validate(plan).map_err(|detail| Violation {
                    invariant: ENGINE_PLAN.into(),
                    detail,
                })?;
                self.pending_plan = Some(plan.clone());
            }
            outs.push(out);
        }
        let end = EndState {
            stats: self.host.stats(),
            sched: self.host.check_invariants(),
        };
        self.monitor.end(&end)?;
        Ok(outs)
    }

    /// Drops the Host (a crash) and builds a new one from nothing, with a
    /// fresh engine: every connection and every step in flight is gone.
    pub fn crash(&mut self, now: Instant, host_seed: u64) {
        self.crashes += 1;
        self.write(&Line::Crash { t: now, host_seed });
        self.inputs.mark("crash", host_seed);
        self.outputs.mark("crash", host_seed);
        self.host = Host::with_model(
            self.config.clone(),
            self.model.clone(),
            ByteCodec::shared(),
            host_seed,
        );
        self.engine = SimEngine::new(self.engine_opts.clone(), self.model.clone());
        self.pending_plan = None;
        self.monitor.crash(now);
    }
}
