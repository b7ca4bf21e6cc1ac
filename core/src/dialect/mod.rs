//! The dialect layer: each wire protocol is a codec plus a small per-connection
//! state machine that drives the shared generation machine through [`Cx`].
//!
//! Adding a dialect is adding one module here that implements [`DialectConn`]
//! and one arm in [`machine_for`].

pub mod generate;
pub mod http;

use serde_json::Value;

use crate::api::{ConnId, Dialect, Event, FeedbackRecord, Output, Transport};
use crate::config::HostConfig;
use crate::engine::{ModelInfo, SeqId, TokenId};
use crate::gen::{FinishReason, Generation, TokenPiece};
use crate::host::shared::Shared;
use crate::params::GenParams;
use crate::text::{min_tokens_for_bytes, Encoded, TextCodec, TextJobId, TextWork};
use crate::time::{Duration, Instant};

/// Why a generation failed (as opposed to finishing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The KV cache cannot hold it, now or ever.
    MemoryPressure,
    /// The engine failed.
    Internal,
    /// The server is shutting down; retry elsewhere.
    ShuttingDown,
}

/// A generation that ended in failure; its partial text is in the Generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// Operator-facing explanation (no client content).
    pub message: String,
}

/// Why a generation could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// Prompt plus `max_tokens` exceed the context window.
    ContextLength {
        /// Tokens in the prompt.
        prompt_tokens: u32,
        /// Requested `max_tokens`.
        max_tokens: u32,
        /// The model's context window.
        context_len: u32,
    },
    /// The prompt's byte length alone shows it cannot fit the context with
    /// `max_tokens` (found before tokenizing it).
    PromptTooLong {
        /// The prompt's length in bytes.
        bytes: usize,
        /// The fewest tokens that many bytes can encode to.
        min_tokens: u32,
        /// Requested `max_tokens`.
        max_tokens: u32,
        /// The model's context window.
        context_len: u32,
    },
    /// The KV cache can never hold it.
    NeverFits {
        /// Blocks it would need.
        needed_blocks: u32,
        /// Blocks in the pool.
        total_blocks: u32,
    },
    /// Too many requests are waiting.
    QueueFull,
    /// The server is shutting down.
    ShuttingDown,
    /// The model is not loaded.
    NotLoaded,
}

/// What a dialect asks the Host to start.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt token ids (BOS included as the tokenizer adds it).
    pub prompt_ids: Vec<TokenId>,
    /// Validated parameters.
    pub params: GenParams,
    /// Logprob alternatives, if wanted.
    pub logprobs: Option<u8>,
}

/// The per-connection state machine of one dialect.
pub trait DialectConn: Send {
    /// A text frame arrived (already checked against the frame size limit).
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str);
    /// A binary frame arrived.
    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize);
    /// A generation of this connection produced a token or ended. When
    /// `piece.finish` is set the generation is over and is dropped after this call.
    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece);
    /// A generation of this connection failed; it is dropped after this call.
    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure);
    /// A text job this connection asked for ([`Cx::encode_prompt`]) is done:
    /// the prompt's token ids, or the tokenizer's error. The connection's
    /// frames that arrived meanwhile are handed over after this call.
    fn on_text_done(
        &mut self,
        _cx: &mut Cx<'_>,
        _job: TextJobId,
        _result: Result<Encoded, String>,
    ) {
    }
    /// A generation is waiting for admission at 1-based `position`.
    fn on_queued(&mut self, cx: &mut Cx<'_>, id: SeqId, position: u32);
    /// The model is loading (sent to connections that are waiting for it).
    fn on_model_loading(
        &mut self,
        cx: &mut Cx<'_>,
        progress: f32,
        message: &str,
        eta: Option<Duration>,
    );
    /// True while a request is in flight (idle timeout does not apply).
    fn busy(&self) -> bool;
}

/// The machine for a dialect, if this build serves it.
pub fn machine_for(dialect: Dialect) -> Option<Box<dyn DialectConn>> {
    match dialect {
        Dialect::Generate => Some(Box::new(generate::GenerateConn::default())),
        _ => None,
    }
}

/// What a dialect machine may do: send, close, start and steer generations.
pub struct Cx<'a> {
    /// Current time.
    pub now: Instant,
    /// The connection being served.
    pub conn: ConnId,
    /// Its dialect.
    pub dialect: Dialect,
    /// Its transport.
    pub transport: Transport,
    pub(crate) sh: &'a mut Shared,
}

impl<'a> Cx<'a> {
    /// Sends a JSON frame to this connection.
    pub fn send(&mut self, v: Value) {
        self.send_text(v.to_string());
    }

    /// Sends a text frame to this connection.
    pub fn send_text(&mut self, text: String) {
        self.sh.outputs.push_back(Output::Send {
            conn: self.conn,
            text,
        });
    }

    /// Closes this connection with `code` after what was already sent.
    pub fn close(&mut self, code: u16, reason: &str) {
        self.sh.request_close(self.conn, code, reason);
    }

    /// Counts an error code sent to the client.
    pub fn count_error(&mut self, code: &'static str) {
        let dialect = self.dialect;
        self.sh
            .outputs
            .push_back(Output::Event(Event::Error { dialect, code }));
    }

    /// The Host's settings.
    pub fn config(&self) -> &HostConfig {
        &self.sh.config
    }

    /// The served model. Dialects only run once it is loaded.
    pub fn model(&self) -> &ModelInfo {
        self.sh.model_info()
    }

    /// The model's tokenizer and chat template.
    pub fn codec(&self) -> &dyn TextCodec {
        self.sh.codec()
    }

    /// Wall-clock milliseconds since the unix epoch.
    pub fn unix_ms(&self) -> u64 {
        self.sh.config.epoch_unix_ms + self.now.as_millis()
    }

    /// A fresh `prefix<uuid7>` id.
    pub fn new_id(&mut self, prefix: &str) -> String {
        let ms = self.unix_ms();
        crate::ids::prefixed(prefix, ms, &mut self.sh.rng)
    }

    /// A fresh random sampler seed.
    pub fn draw_seed(&mut self) -> u64 {
        self.sh.rng.next_u64()
    }

    /// Has a raw prompt tokenized off the Host's thread; the ids come back in
    /// [`DialectConn::on_text_done`], and until then this connection's frames
    /// wait. A prompt whose byte length alone shows that it cannot fit the
    /// context with `max_tokens` is refused at once, untokenized.
    pub fn encode_prompt(
        &mut self,
        text: String,
        max_tokens: u32,
    ) -> Result<TextJobId, StartError> {
        let context_len = self.model().context_len;
        let min_tokens =
            u32::try_from(min_tokens_for_bytes(self.codec(), text.len())).unwrap_or(u32::MAX);
        if u64::from(min_tokens) + u64::from(max_tokens) > u64::from(context_len) {
            return Err(StartError::PromptTooLong {
                bytes: text.len(),
                min_tokens,
                max_tokens,
                context_len,
            });
        }
        Ok(self.sh.tokenize(self.conn, TextWork::Encode { text }))
    }

    /// Starts a generation owned by this connection.
    pub fn start(&mut self, req: GenRequest) -> Result<SeqId, StartError> {
        self.sh.start(self.now, self.conn, self.dialect, req)
    }

    /// A live generation.
    pub fn gen(&self, id: SeqId) -> Option<&Generation> {
        self.sh.gens.get(&id)
    }

    /// Ends a generation now (no callback follows). Returns its final piece
    /// (held text released) and the generation.
    pub fn end(&mut self, id: SeqId, reason: FinishReason) -> Option<(TokenPiece, Generation)> {
        self.sh.end(self.now, id, reason)
    }

    /// Pauses a generation: not scheduled, results held until resume. Returns false if unknown.
    pub fn pause(&mut self, id: SeqId) -> bool {
        self.sh.pause(self.now, id)
    }

    /// Resumes a paused generation. Returns false if unknown.
    pub fn resume(&mut self, id: SeqId) -> bool {
        self.sh.resume(id)
    }

    /// Replaces a generation's parameters from the next token on; refused
    /// (nothing changes) when its new length could never fit the KV cache.
    pub fn modify(&mut self, id: SeqId, params: GenParams) -> Result<(), StartError> {
        self.sh.modify(id, params)
    }

    /// Hands feedback to the operator's log and counts it.
    pub fn feedback(&mut self, record: FeedbackRecord) {
        self.sh
            .outputs
            .push_back(Output::Event(Event::FeedbackReceived {
                rating: record.rating,
            }));
        self.sh.outputs.push_back(Output::Feedback(record));
    }
}
