//! # tokenwire-io
//!
//! The tokio shell around tokenwire's sans-IO core, and the library behind the
//! `tokenwire` binary.
//!
//! What clients see (every route, each dialect's messages, errors and a
//! sample session, running many hosts behind a load balancer, the metrics) is
//! documented in the repository's `docs/` directory. `GET /` without an
//! upgrade serves the playground page (`src/playground.html`).
//!
//! - hyper serves HTTP/1.1; every accepted connection holds a slot of the
//!   connection limit for its life (past it: 503). Upgrade requests on a
//!   dialect's path become WebSocket connections (yawc: RFC 6455, and
//!   permessage-deflate when the client offers it)
//!   ([`conn`](crate#modules)), other paths are the HTTP endpoints (`/health`,
//!   `/metrics`, `/v1/models`, and each dialect's route, such as
//!   `POST /v1/generate` and `POST /v1/inference`, whose body and replies the
//!   dialect's own mapping in the core translates; the shell only reads the
//!   body within its deadline). The `http` module routes (its `state` is what
//!   handlers share, `reply` builds responses, `dialect` carries out a
//!   dialect's HTTP routes as the core's registry names them).
//! - One driver task owns the [`tokenwire_core::Host`]: connection tasks and the
//!   engine thread send it inputs over a channel (the `channel` module: the
//!   messages, the handle, the per-connection queues; the `driver` module is
//!   the event loop alone); it drains the Host's outputs
//!   into per-connection bounded queues ([`sync::OutboundQueue`]), the engine
//!   thread, a small pool of text workers (tokenizing prompts off the driver),
//!   the metrics and the feedback log, the job verifier ([`jobs`]), pauses
//!   and resumes connection readers when the Host asks, and sleeps until the
//!   Host's next deadline.
//! - The model engine runs on its own OS thread.
//!
//! ## Running a server from a test
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use tokenwire_io::{start, ServerConfig};
//! let config = ServerConfig { listen: "127.0.0.1:0".parse()?, ..ServerConfig::default() };
//! let server = start(config).await?;          // the built-in tiny model, loaded
//! let addr = server.local_addr;                // ws://{addr}/generate, http://{addr}/health
//! // ... talk to it ...
//! server.shutdown().await;                     // graceful; returns when it is done
//! // (or `server.finish().await?` to get the error it stopped with, if any)
//! # Ok(()) }
//! ```
//!
//! [`start_loading`] returns before the model is loaded (to observe the loading
//! state); [`RunningServer::wait_ready`] then waits for it. [`serve`] is what
//! the binary runs: it stops on a shutdown future such as [`shutdown::signal`].

mod channel;
mod clock;
pub mod config;
mod conn;
pub mod content_filter;
mod driver;
mod engine_thread;
mod feedback;
pub mod hf_cache;
mod http;
pub mod jobs;
pub mod keys;
mod load_progress;
pub mod metrics;
pub mod panic_hook;
mod server;
pub mod shutdown;
pub mod tenancy;
mod ws;

/// The shared sync primitives (connection limiter, cancel flag, outbound
/// queue), from their own crate so loom can model-check them without
/// recompiling this shell's dependencies.
pub use tokenwire_sync as sync;

pub use config::{Backend, LogFormat, ModelSource, ServerConfig};
pub use server::{serve, start, start_loading, start_loading_with, RunningServer};
