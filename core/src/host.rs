//! The Host: routes inputs to connections, generations and the scheduler.

use std::collections::VecDeque;

use crate::api::{Input, Output};
use crate::config::HostConfig;
use crate::engine::ModelInfo;
use crate::text::SharedCodec;
use crate::time::Instant;

/// The whole server state as a deterministic state machine.
pub struct Host {
    #[allow(dead_code)]
    config: HostConfig,
    outputs: VecDeque<Output>,
    model: Option<(ModelInfo, SharedCodec)>,
}

/// A snapshot of the Host's state for health checks and gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStats {
    /// True once the model is loaded.
    pub loaded: bool,
    /// Loading progress 0..=100 (100 once loaded).
    pub load_progress: f32,
    /// Open connections.
    pub connections: u32,
    /// Requests waiting for admission.
    pub queued: u32,
    /// Sequences running.
    pub running: u32,
    /// KV blocks in use.
    pub kv_blocks_used: u32,
    /// KV blocks in the pool.
    pub kv_blocks_total: u32,
}

impl Host {
    /// A Host whose model is still loading: clients that connect get
    /// `model_loading` status until [`Input::ModelLoaded`].
    pub fn new(config: HostConfig, seed: u64) -> Host {
        let _ = seed;
        Host { config, outputs: VecDeque::new(), model: None }
    }

    /// A Host serving an already loaded model.
    pub fn with_model(config: HostConfig, info: ModelInfo, codec: SharedCodec, seed: u64) -> Host {
        let mut h = Host::new(config, seed);
        h.model = Some((info, codec));
        h
    }

    /// Feeds one input at time `now`. Drain [`Host::poll_output`] afterwards.
    pub fn handle(&mut self, now: Instant, input: Input) {
        let _ = (now, input);
    }

    /// The next thing the caller must do, or `None` when there is nothing.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The earliest time at which [`Input::Timeout`] must be handled.
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// The served model, once loaded.
    pub fn model_info(&self) -> Option<&ModelInfo> {
        self.model.as_ref().map(|(m, _)| m)
    }

    /// Current gauges.
    pub fn stats(&self) -> HostStats {
        HostStats { loaded: self.model.is_some(), load_progress: 0.0, connections: 0, queued: 0, running: 0, kv_blocks_used: 0, kv_blocks_total: 0 }
    }
}
