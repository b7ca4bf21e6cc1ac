//! The simulated clients, one module per dialect, each a scripted user whose
//! every choice comes from its own seeded stream:
//!
//! - [`generate`]: `/generate` (config, control, feedback; HTTP too);
//! - [`session`]: `/ws/session` (client-held conversations, resumed after a
//!   crash or a disconnect with the history the client holds);
//! - [`responses`]: `/v1/responses` (creates, continuations, warm-ups,
//!   cancels, the connection limit and lifetime);
//! - [`cai`]: `/` (credentials in the query string, good and bad; several
//!   completions in flight, conversations, interrupts, chunk and sentence
//!   windows acknowledged eagerly, late or never, a speaking client's pace);
//! - [`batch`]: `/ws` (payloads of raw prompts queued several at once,
//!   continuations of its own finished batches, duplicate ids, invalid
//!   payloads);
//! - [`http`]: `POST /v1/inference`, `POST /v1/responses` and
//!   `GET /v1/responses/{id}`, one request per connection, mapped with the
//!   dialects' own HTTP mappings (a `session` or `responses` client speaks
//!   HTTP now and then, see [`new_client`]), and every `chat` client's
//!   requests;
//! - [`chat`]: the OpenAI routes a `chat` client asks (Chat Completions,
//!   Completions with batches and prompt scoring, Embeddings, the tokenizer
//!   routes);
//! - [`anthropic`]: Anthropic's Messages routes an `anthropic` client asks.
//!
//! Each only reacts to what it reads and speaks through the same
//! [`ClientOp`]s, and keeps what every client keeps (its connection, whether
//! it stopped, its [`Habits`]) in a [`ClientBase`] ([`base`]); whether the server was right is the invariant checkers'
//! business, never the clients'. Every prompt starts with the tag
//! `<c{conn}>` (the connection id) after the tokenizer's BOS, so that
//! checkers can tell which connection a sequence in an engine step belongs
//! to: a `generate` prompt as given, a `session` conversation through its
//! first (system) message, which the Host always keeps, a `responses` one
//! through its instructions or its first input message, a `cai` one through
//! the system message its `context` starts with (or, continuing a kept
//! conversation, the one the conversation started with: conversation ids are
//! unique per connection) and its prompt, which carries the tag too, a
//! `batch` prompt as given (a continued batch's sequences keep the tag of
//! the connection the batch started on), a `chat` request's through its
//! system message, its prompts (text or ids) and its embedding inputs, an
//! `anthropic` one's through its `system`.

pub mod anthropic;
pub mod base;
pub mod batch;
pub mod cai;
pub mod chat;
pub mod generate;
pub mod http;
pub mod responses;
pub mod session;

use tokenwire_core::rng::{mix64, Rng};
use tokenwire_core::{ConnId, Dialect, Duration, Instant, Transport};

pub use base::{ClientBase, Habits};
pub use batch::BatchClient;
pub use cai::CaiClient;
pub use generate::GenerateClient;
pub use http::HttpClient;
pub use responses::ResponsesClient;
pub use session::SessionClient;

use crate::swarm::{Swarm, STREAM_HTTP};

/// Something a client does; the runner carries it out.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientOp {
    /// Open a new connection (the runner then calls [`SimClient::on_open`]).
    Open(Transport),
    /// Send a text frame.
    Text(String),
    /// Send a binary frame of this length.
    Binary(usize),
    /// Send a frame over the size limit (the shell reports `FrameTooLarge`).
    TooLarge,
    /// Hang up this connection.
    Close(ConnId),
    /// Act again after this long.
    Wake(Duration),
}

/// What a client may know when it acts.
#[derive(Debug, Clone, Copy)]
pub struct ClientCx<'a> {
    /// The current time.
    pub now: Instant,
    /// The run's options.
    pub swarm: &'a Swarm,
    /// The liveness phase: no new work, no hostility, no hanging up.
    pub liveness: bool,
}

/// A simulated client of any dialect, as the runner drives it.
pub trait SimClient: std::fmt::Debug + Send {
    /// The dialect it speaks.
    fn dialect(&self) -> Dialect;
    /// How its next connection is carried.
    fn transport(&self) -> Transport;
    /// The query string its next connection opens with (without `?`).
    fn query(&self) -> String {
        String::new()
    }
    /// What it shares with every client: its connection, whether it
    /// stopped, its habits.
    fn base(&self) -> &ClientBase;
    /// The same, to change.
    fn base_mut(&mut self) -> &mut ClientBase;
    /// Its connection, if it has one.
    fn conn(&self) -> Option<ConnId> {
        self.base().conn
    }
    /// Binds the connection the runner opened for it.
    fn bind(&mut self, conn: ConnId) {
        self.base_mut().conn = Some(conn);
    }
    /// Its wake-up came.
    fn act(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp>;
    /// The connection it asked for is open: its first frames.
    fn on_open(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp>;
    /// A frame from the server arrived on `conn`.
    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp>;
    /// `conn` is gone: closed by the server with `code`, or broken (`None`:
    /// the host crashed).
    fn on_closed(&mut self, cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp>;
    /// The liveness phase begins: no new work (a client with work to wind
    /// down, such as acknowledgements owed, does more).
    fn start_liveness(&mut self) -> Vec<ClientOp> {
        self.base_mut().liveness = true;
        Vec::new()
    }
    /// How its connection behaves, and what it counted.
    fn habits(&self) -> &Habits {
        &self.base().habits
    }
    /// Its reader: (slow, stalls now and then).
    fn reader(&self) -> (bool, bool) {
        (self.habits().slow_reader, self.habits().stalls)
    }
    /// It never answers pings.
    fn silent(&self) -> bool {
        self.habits().silent
    }
    /// (malformed or hostile frames sent, early disconnects).
    fn counts(&self) -> (u64, u64) {
        (self.habits().hostile_sent, self.habits().disconnects)
    }
}

/// Client `id` of a run with `swarm`, speaking its dialect, drawing from `rng`.
pub fn new_client(id: usize, swarm: &Swarm, rng: Rng) -> Box<dyn SimClient> {
    let dialect = swarm.dialects.get(id).copied().unwrap_or(Dialect::Generate);
    let http = match dialect {
        Dialect::Chat | Dialect::Anthropic => true,
        Dialect::Session | Dialect::Responses => speaks_http(id, swarm),
        _ => false,
    };
    if http {
        return Box::new(HttpClient::new(id, dialect, swarm, rng));
    }
    match dialect {
        Dialect::Session => Box::new(SessionClient::new(id, swarm, rng)),
        Dialect::Responses => Box::new(ResponsesClient::new(id, swarm, rng)),
        Dialect::Cai => Box::new(CaiClient::new(id, swarm, rng)),
        Dialect::Batch => Box::new(BatchClient::new(id, swarm, rng)),
        _ => Box::new(GenerateClient::new(id, swarm, rng)),
    }
}

/// Whether `session` or `responses` client `id` speaks HTTP: with the mix's
/// `http_p`, and at least one chance in eight, so that any run of those
/// dialects may hold one. Drawn from a stream of its own, so that the
/// WebSocket clients' streams stay as they were.
fn speaks_http(id: usize, swarm: &Swarm) -> bool {
    let mut rng = Rng::new(mix64(swarm.seed, STREAM_HTTP + id as u64));
    chance(&mut rng, swarm.mix.http_p.max(0.125))
}

/// How long a client waits before acting again: mostly a moment up to the
/// mix's `think_max`, now and then long enough to cross the pause timeout
/// or the idle timeout.
pub(crate) fn think(rng: &mut Rng, cx: &ClientCx<'_>) -> Duration {
    let m = &cx.swarm.mix;
    if chance(rng, m.long_wait_p) {
        let mins = if chance(rng, 0.5) { 6 } else { 11 };
        return Duration::from_secs(mins * 60);
    }
    crate::swarm::between(rng, Duration::from_micros(1), m.think_max)
}

/// The tag every prompt of connection `conn` carries (`<c{conn}>`), by which
/// checkers tell whose sequence an engine step computes.
pub(crate) fn conn_tag(conn: Option<ConnId>) -> String {
    format!("<c{}>", conn.map_or(0, |c| c.0))
}

/// True with chance `p`.
pub(crate) fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.next_f64() < p
}

/// Characters prompts are made of (no `<`, so no text but the tag looks
/// like one).
pub(crate) const PROMPT_CHARS: &[&str] = &[
    "a", "b", "c", "d", "e", "t", "h", "o", " ", " ", ".", ",", "?", "\n", "Q", "Z", "7", "ü",
    "中", "\"", "\\", "{", "}",
];

/// Random text of up to `max` characters.
pub(crate) fn text(rng: &mut Rng, max: u64) -> String {
    let len = rng.below(max + 1);
    (0..len)
        .map(|_| PROMPT_CHARS[rng.below(PROMPT_CHARS.len() as u64) as usize])
        .collect()
}

/// A malformed frame any dialect must refuse without harm: text that is not
/// JSON, nesting past the limit, JSON that is not an object, control bytes.
pub(crate) fn garbage(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 => "{not json".to_string(),
        1 => {
            let mut b = vec![0u8; 1 + rng.below(64) as usize];
            rng.fill(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        }
        2 => {
            let d = 65 + rng.below(300) as usize;
            "[".repeat(d) + &"]".repeat(d)
        }
        3 => {
            let d = 60 + rng.below(10) as usize;
            "{\"a\":".repeat(d) + "1" + &"}".repeat(d)
        }
        4 => "[1,2,3]".into(),
        5 => "null".into(),
        6 => String::new(),
        _ => "\u{0}\u{FFFF}\u{1F980}\"".into(),
    }
}
