//! The Host's inputs and outputs: everything that crosses the sans-IO boundary.

pub use crate::conn::{ConnId, Dialect, Transport};
use crate::engine::{EngineFault, ModelInfo, StepDone, StepPlan};
use crate::text::{SharedCodec, TextDone, TextJob};
use crate::time::Duration;

/// The reasons the Host gives in [`Output::Close`], so shells and checkers can
/// tell closes apart without repeating the strings.
pub mod close_reason {
    /// A frame over the size limit (code 1009).
    pub const FRAME_TOO_LARGE: &str = "frame too large";
    /// Graceful shutdown (code 1001).
    pub const SHUTTING_DOWN: &str = "server shutting down";
    /// The outbound queue stayed full past the slow-client timeout (code 1008).
    pub const SLOW_CLIENT: &str = "client too slow to read";
    /// No request and no frame for the idle timeout (code 1000).
    pub const IDLE: &str = "idle timeout";
    /// A ping went unanswered for the keepalive timeout (code 1000).
    pub const KEEPALIVE: &str = "keepalive timeout";
    /// The first frame was not the dialect's opening message (code 1008).
    pub const FIRST_FRAME: &str = "first message must be config";
    /// Frames piled up past every bound while the connection waited (code 1008).
    pub const HELD_TOO_MANY: &str = "too many frames while the connection waits";
}

/// Everything that can happen to the Host. Pass each with the current time to
/// [`crate::Host::handle`], then drain [`crate::Host::poll_output`].
#[derive(Debug, Clone)]
pub enum Input {
    /// A client connected on a dialect's path.
    Open {
        /// Caller-chosen id for the connection.
        conn: ConnId,
        /// Dialect from the path.
        dialect: Dialect,
        /// How it is carried.
        transport: Transport,
        /// Raw query string (without `?`), for dialects that authenticate there.
        query: String,
        /// The `Authorization` header's value, when the upgrade or request
        /// carried one: the key that names the connection's principal
        /// ([`crate::principal::Principal`]). Never logged.
        authorization: Option<String>,
        /// Peer address, for logs and limits.
        peer: String,
    },
    /// A text frame arrived.
    Text {
        /// The connection.
        conn: ConnId,
        /// The frame's text.
        text: String,
    },
    /// A binary frame arrived (its content is irrelevant: binary is not spoken).
    Binary {
        /// The connection.
        conn: ConnId,
        /// Its length in bytes.
        len: usize,
    },
    /// A frame larger than the configured maximum arrived (it was not read).
    FrameTooLarge {
        /// The connection.
        conn: ConnId,
    },
    /// The client answered a ping.
    Pong {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is gone (closed by either side, or broken).
    Closed {
        /// The connection.
        conn: ConnId,
    },
    /// The connection's outbound queue is full: stop producing for it.
    QueueFull {
        /// The connection.
        conn: ConnId,
    },
    /// The connection's outbound queue drained below its low mark.
    QueueDrained {
        /// The connection.
        conn: ConnId,
    },
    /// The time returned by [`crate::Host::poll_timeout`] has come.
    Timeout,
    /// A [`TextJob`] handed out as [`Output::Tokenize`] is done.
    Tokenized(TextDone),
    /// The shell's verdict on a [`JobCheck`] handed out as [`Output::VerifyJob`].
    JobVerified {
        /// The check answered.
        check: JobCheckId,
        /// What the job may use, or why it is refused (a message for the client).
        verdict: Result<JobGrant, String>,
    },
    /// The engine finished the outstanding step.
    StepDone(StepDone),
    /// The engine failed the outstanding step.
    EngineFault(EngineFault),
    /// The engine's KV pool changed size (memory pressure, or pressure gone).
    /// Shrinking evicts paused sequences first, then preempts the newest running
    /// ones; they are recomputed later, invisibly to clients.
    KvCapacity {
        /// Blocks now available.
        num_blocks: u32,
    },
    /// Model weights are loading (before [`Input::ModelLoaded`]).
    ModelLoading {
        /// Percent done, 0..=100.
        progress: f32,
        /// What is being loaded (no client content).
        message: String,
        /// Estimated time remaining.
        eta: Option<Duration>,
    },
    /// The model is loaded and the engine ready: the Host starts serving it.
    ModelLoaded {
        /// What the engine serves.
        info: ModelInfo,
        /// Its tokenizer and chat template.
        codec: SharedCodec,
    },
    /// Begin graceful shutdown: refuse new work, let generations run for the
    /// shutdown grace, then end them and close every connection with 1001.
    Shutdown,
}

/// Something the caller must do. Drain with [`crate::Host::poll_output`] after every input.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send a text frame.
    Send {
        /// The connection.
        conn: ConnId,
        /// JSON text.
        text: String,
    },
    /// Send a WebSocket ping; answer with [`Input::Pong`] when the pong comes.
    Ping {
        /// The connection.
        conn: ConnId,
    },
    /// Close the connection with this code; then report [`Input::Closed`].
    Close {
        /// The connection.
        conn: ConnId,
        /// WebSocket close code.
        code: u16,
        /// Close reason (short, no client content).
        reason: String,
    },
    /// Stop reading this connection's socket (its frames are piling up while
    /// it waits); frames already read may still be handed in.
    PauseReading {
        /// The connection.
        conn: ConnId,
    },
    /// Read this connection's socket again.
    ResumeReading {
        /// The connection.
        conn: ConnId,
    },
    /// Run this step on the engine; answer with [`Input::StepDone`] or [`Input::EngineFault`].
    RunStep(StepPlan),
    /// Tokenize (render a chat template, count tokens) off the thread that
    /// drives the Host: run `job` anywhere ([`TextJob::run`]) and answer with
    /// [`Input::Tokenized`]. Any number may be outstanding; the frames of the
    /// connection that asked wait, in order, until its answer comes.
    Tokenize(TextJob),
    /// Verify a client's job id (payment, quota) with whatever service the
    /// shell trusts, and answer with [`Input::JobVerified`]. The frames of
    /// the connection that asked wait, in order, until then.
    VerifyJob(JobCheck),
    /// A client's feedback, for the operator's feedback log (the only client text
    /// the core ever hands out for writing, and only the shell decides to write it).
    Feedback(FeedbackRecord),
    /// Metrics and audit: counts, durations, ids; never conversation text.
    Event(Event),
    /// Graceful shutdown is complete: every connection is closed.
    ShutdownComplete,
}

/// Identifies one [`JobCheck`] of a Host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobCheckId(pub u64);

/// A job id to verify ([`Output::VerifyJob`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCheck {
    /// Echo it in [`Input::JobVerified`].
    pub id: JobCheckId,
    /// The connection that presented the job.
    pub conn: ConnId,
    /// Its dialect.
    pub dialect: Dialect,
    /// The job id as the client sent it.
    pub job_id: String,
    /// The public key the client signs its prompts with (`session`'s
    /// signed prompts), so a verifier can bind the key to the job.
    pub public_key: Option<String>,
}

/// What a verified job may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobGrant {
    /// Most tokens (prompt and generated) the job may use on this host;
    /// `None`: no cap.
    pub token_budget: Option<u64>,
}

/// Feedback sent by a client about one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackRecord {
    /// The generation it concerns, if one was known.
    pub request_id: Option<String>,
    /// -1..=1.
    pub rating: f64,
    /// Position in the generation, if given.
    pub position: Option<u64>,
    /// Free text, at most 4 KiB.
    pub text: Option<String>,
}

/// How a request ended, for the requests counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Finished normally (length, stop string, end of sequence).
    Completed,
    /// Stopped or interrupted by the client, or its connection went away.
    Cancelled,
    /// Ended by a deadline.
    TimedOut,
    /// Ended with an error.
    Failed,
}

impl Outcome {
    /// Lowercase label.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timeout",
            Outcome::Failed => "failed",
        }
    }
}

/// Metrics and audit events. Never carries conversation text.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A connection opened.
    ConnectionOpened {
        /// Its dialect.
        dialect: Dialect,
    },
    /// A connection closed.
    ConnectionClosed {
        /// Its dialect.
        dialect: Dialect,
    },
    /// A request (generation) was admitted: its sequence is queued for the
    /// engine. Every started request ends with one [`Event::RequestFinished`]
    /// of the same `request`.
    RequestStarted {
        /// The connection that asked.
        conn: ConnId,
        /// Its dialect.
        dialect: Dialect,
        /// The request's sequence id (unique for the Host's life).
        request: u64,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// The most tokens it may generate.
        max_tokens: u32,
    },
    /// A request (generation) ended.
    RequestFinished {
        /// Its dialect.
        dialect: Dialect,
        /// The sequence id its [`Event::RequestStarted`] gave.
        request: u64,
        /// How.
        outcome: Outcome,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Generated tokens.
        completion_tokens: u32,
        /// From its arrival to its end (end-to-end latency).
        elapsed: Duration,
    },
    /// First token of a request, measured from its arrival.
    FirstToken {
        /// Time to first token.
        ttft: Duration,
    },
    /// Time between two tokens of one request.
    InterToken {
        /// The gap.
        gap: Duration,
    },
    /// A content-filter rule matched: a request refused, or a generation
    /// ended before text it would have sent (the rule's name, never text).
    ContentFiltered {
        /// The dialect.
        dialect: Dialect,
        /// The rule's name.
        rule: String,
        /// What it did.
        action: crate::filter::FilterAction,
    },
    /// An error frame was sent.
    Error {
        /// Its dialect.
        dialect: Dialect,
        /// The error code sent.
        code: &'static str,
    },
    /// A dialect named a connection for logs and audit (`responses`:
    /// `ws-<uuid7>`), so an operator can follow it without its content.
    ConnectionNamed {
        /// The connection.
        conn: ConnId,
        /// Its dialect.
        dialect: Dialect,
        /// The name.
        name: String,
    },
    /// Feedback was received.
    FeedbackReceived {
        /// The rating.
        rating: f64,
    },
    /// Scheduler gauges after a step was planned or finished.
    Gauges {
        /// Requests waiting for admission.
        queued: u32,
        /// Sequences holding KV blocks and being computed.
        running: u32,
        /// KV blocks in use.
        kv_blocks_used: u32,
        /// Of those, blocks only kept for continuations: the first freed
        /// under memory pressure.
        kv_blocks_kept: u32,
        /// KV blocks in the pool.
        kv_blocks_total: u32,
        /// KV blocks no sequence holds, kept for their content (prefix
        /// caching): available to any request, not counted as used.
        kv_blocks_cached: u32,
    },
    /// Tokens generated by a step, over all sequences.
    TokensGenerated {
        /// How many.
        count: u32,
    },
    /// A step fed draft tokens (speculative decoding by prompt lookup):
    /// `drafted` over all sequences, of which its samples confirmed
    /// `confirmed` (each one a token generated beyond one per sequence).
    DraftTokens {
        /// Draft tokens fed.
        drafted: u32,
        /// Of them, those confirmed.
        confirmed: u32,
    },
    /// A request was admitted with prefix caching on: `queried` prompt
    /// tokens were looked up, and the K/V of `hit` of them came from the
    /// cache instead of being computed (vLLM's prefix cache queries and hits).
    PrefixCacheLookup {
        /// Prompt tokens looked up.
        queried: u32,
        /// Of those, tokens found cached.
        hit: u32,
    },
    /// A generation started from KV blocks kept from an earlier one
    /// ([`crate::gen::GenRequest::reuse_kv`]) instead of computing its prompt.
    PromptTokensReused {
        /// Prompt tokens whose K/V was not computed again.
        count: u32,
    },
}
