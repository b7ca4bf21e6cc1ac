//! # tokenwire-core
//!
//! The sans-IO heart of tokenwire: connections, the five wire dialects,
//! generations, pause/resume, deadlines, flow control, scheduling and recovery,
//! as deterministic state machines. No tokio, no clock, no threads, no OS
//! randomness: the same seed and the same inputs give the same outputs, bit for bit.
//!
//! ## Driving a [`Host`]
//!
//! ```
//! use tokenwire_core::{Host, HostConfig, Input, Output, Instant, ConnId, Dialect, Transport};
//! # use tokenwire_core::testing::{ByteCodec, tiny_model_info};
//! let mut host = Host::with_model(HostConfig::default(), tiny_model_info(), ByteCodec::shared(), 42u64);
//! let now = Instant::ZERO;
//! host.handle(now, Input::Open {
//!     conn: ConnId(1), dialect: Dialect::Generate, transport: Transport::WebSocket,
//!     query: String::new(), authorization: None, peer: "127.0.0.1:1".into(),
//! });
//! host.handle(now, Input::Text { conn: ConnId(1), text: r#"{"type":"config","prompt":"hi"}"#.into() });
//! while let Some(out) = host.poll_output() {
//!     match out {
//!         Output::Send { conn, text } => { /* write `text` to `conn` */ }
//!         Output::RunStep(plan) => { /* run on the engine, then handle(now, Input::StepDone(..)) */ }
//!         Output::Tokenize(job) => { /* on a worker: handle(now, Input::Tokenized(job.run())) */ }
//!         _ => {}
//!     }
//! }
//! // Sleep until `host.poll_timeout()`, then `host.handle(now, Input::Timeout)`.
//! ```
//!
//! The rule: after every [`Host::handle`], drain [`Host::poll_output`] until it
//! returns `None`. See the crate README for the full event-loop contract, and
//! the repository's `examples/` for the core embedded in a custom transport
//! (newline-delimited JSON over a Unix socket). The wire protocol each
//! dialect speaks is documented for users in the repository's `docs/`.
//!
//! The example above uses the test helpers of `testing`, behind the
//! `testing` feature; an embedder supplies its own [`TextCodec`] and engine.

pub mod api;
pub mod config;
pub mod conn;
pub mod constraint;
pub mod dialect;
pub mod engine;
pub mod filter;
pub mod fim;
pub mod gen;
pub mod host;
pub mod http;
pub(crate) mod ids;
pub mod json;
pub mod keys;
pub(crate) mod lru;
pub mod params;
pub mod principal;
pub(crate) mod rate;
pub mod reasoning;
pub mod reasoning_gate;
pub mod rng;
pub(crate) mod sched;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod time;
pub(crate) mod timer;
pub mod token_rules;
pub mod tools;

pub use api::{
    ConnId, Dialect, Event, FeedbackRecord, Input, JobCheck, JobCheckId, JobGrant, Outcome, Output,
    Transport,
};
pub use config::HostConfig;
pub use constraint::{Constraint, Grammar, TokenConstraint, TokenMask};
pub use engine::{
    BlockId, EngineFault, EngineFaultKind, Fork, LogitBias, ModelInfo, Pooling, SamplingParams,
    SeqId, SeqResult, SeqStep, StepDone, StepPlan, TokenId, TokenLogprobs,
};
pub use host::Host;
pub use sched::DraftConfig;
pub use text::{
    ChatMessage, Encoded, HistoryCall, Role, SharedCodec, TextCodec, TextDone, TextJob, TextJobId,
    TextWork, CONTEXT_TOO_LONG,
};
pub use time::{Duration, Instant};
