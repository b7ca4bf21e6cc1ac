//! # tokenwire-sim
//!
//! tokenwire's deterministic simulator (DESIGN.md, "The simulator"): seeded
//! swarms of clients and faults driven through `tokenwire-core`'s sans-IO
//! [`Host`](tokenwire_core::Host) in virtual time, with invariant checkers
//! after every event. TigerBeetle's VOPR is the model.
//!
//! A run mixes clients of the seven dialects the core serves (`generate`,
//! `session`, `responses`, `cai`, `batch`, `chat`, the OpenAI HTTP routes,
//! and `anthropic`, the Messages routes): most seeds have six or seven, a
//! few only one (the swarm decides). The runner plays the shell around the Host: it
//! opens connections with the query string each client chooses (`cai`
//! credentials, checked against the run's keys file), delivers frames over a
//! network with random delays, runs engine steps and text jobs, and
//! answers the job verifier (`Output::VerifyJob`) with a verdict drawn per
//! run (a token budget, refusals). `generate`, `session` and `responses`
//! clients may speak HTTP, one request per connection, and `chat` and
//! `anthropic` clients always do (Chat Completions, Completions with
//! batches and prompt scoring, Embeddings, the tokenizer routes; Messages
//! and `count_tokens`); they all map their bodies with the dialects' own HTTP mappings,
//! as the shell does, and checkers judge what the client gets. The engine
//! computes embeddings and prompt scores as functions of the prompt, so the
//! `chat` checkers recompute each vector and score from what the client
//! sent. Faults: Host crashes (the Host is
//! rebuilt from nothing and `session` clients resume their conversations on
//! it), engine faults, KV pool shrinks, clock jumps, graceful shutdown,
//! slow readers, hostile frames (bad credentials among them), early
//! hang-ups, and text jobs that fail as a tokenizer or a chat template
//! would (not for length).
//!
//! ```no_run
//! let report = tokenwire_sim::run_seed(42, 2_000, None).expect("invariants hold");
//! println!("{report}");
//! ```
//!
//! - [`swarm`]: every option of a run, from its seed.
//! - [`client`]: the simulated clients, one module per dialect, on a shared
//!   [`ClientBase`](client::ClientBase).
//! - [`engine`]: the deterministic model-free engine.
//! - [`net`]: delays, outbound queues, slow readers.
//! - [`faults`]: the fault plan and the counts.
//! - [`invariants`]: the checkers, one file each, laid out like the core's
//!   dialects: `common` for every dialect, then `generate`, `session`,
//!   `responses`, `cai`, `batch`, `chat` and `anthropic`, each beside its
//!   part of the view;
//!   `invariants::http` replays the shell's part of an HTTP request.
//! - [`driver`]: feeds a Host and runs the checkers.
//! - [`runner`]: one whole simulation.
//! - [`trace`], [`replay`](mod@replay): recording inputs and feeding them back.
//! - [`digest`]: hashes of inputs and outputs.
//! - [`sweep`]: many seeds, the determinism check, the summary.
//!
//! The library never reads a clock and never draws OS randomness: the same
//! seed gives the same run, bit for bit.

pub mod client;
pub mod digest;
pub mod driver;
pub mod engine;
pub mod faults;
pub mod invariants;
pub mod net;
pub mod replay;
pub mod report;
pub mod runner;
pub mod swarm;
pub mod sweep;
pub mod trace;

pub use faults::FaultCounts;
pub use replay::{replay, ReplayReport};
pub use report::{Failure, RunReport};
pub use runner::{run_seed, run_seed_with, RunOptions, DEFAULT_EVENTS};
pub use swarm::{parse_seed, Swarm};
