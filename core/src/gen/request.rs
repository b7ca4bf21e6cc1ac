//! What a dialect asks of the generation machine and what can go wrong: the
//! request to start one, why it could not start, and why it failed.
//!
//! These live beside the generation (not in the dialect layer or the Host) so
//! that imports run one way: the Host uses the dialects, the dialects use the
//! generation machine, and nothing points back.

use crate::engine::{SeqId, TokenId};
use crate::params::GenParams;

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
    /// The connection already has its share of the waiting requests
    /// (`max_queued_per_conn`).
    ConnQueueFull {
        /// The share.
        limit: u32,
    },
    /// The organisation of the key the request came with is over its
    /// rate limit (requests or tokens per minute).
    RateLimited {
        /// Milliseconds until a request would be admitted.
        retry_after_ms: u64,
    },
    /// A prompt token the model has no embedding for (a tokenizer whose
    /// added tokens go past the model's vocabulary).
    TokenOutOfVocab {
        /// The token.
        token: u32,
        /// The model's vocabulary size.
        vocab: u32,
    },
    /// A prompt or message matches a content-filter `refuse` rule
    /// ([`crate::filter`]); nothing was computed.
    ContentFiltered {
        /// The rule's name (never the text it matched).
        rule: String,
    },
    /// The server is shutting down.
    ShuttingDown,
    /// The model is not loaded.
    NotLoaded,
}

impl StartError {
    /// What went wrong, for the client, naming the request's length field
    /// as the dialect spells it (`max_tokens`, `maxTokens`, ...). Each
    /// dialect chooses its own error code; the words are shared.
    pub fn message(&self, max_tokens_field: &str) -> String {
        match *self {
            StartError::ContextLength {
                prompt_tokens,
                max_tokens,
                context_len,
            } => format!("the prompt ({prompt_tokens} tokens) plus {max_tokens_field} ({max_tokens}) exceed the context length of {context_len} tokens"),
            StartError::PromptTooLong {
                bytes,
                min_tokens,
                max_tokens,
                context_len,
            } => format!("the prompt ({bytes} bytes, so at least {min_tokens} tokens) plus {max_tokens_field} ({max_tokens}) exceed the context length of {context_len} tokens"),
            StartError::NeverFits {
                needed_blocks,
                total_blocks,
            } => format!("the request needs {needed_blocks} KV cache blocks but the cache holds {total_blocks}; lower {max_tokens_field}"),
            StartError::QueueFull => "the request queue is full; retry later".into(),
            StartError::ConnQueueFull { limit } => format!(
                "this connection already has {limit} requests waiting, the most one connection may; retry once one has started"
            ),
            StartError::RateLimited { retry_after_ms } => format!(
                "the rate limit is reached (the key's organisation's, or without a key this address's); retry in {retry_after_ms} ms"
            ),
            StartError::TokenOutOfVocab { token, vocab } => format!(
                "the prompt holds token {token}, which this model's vocabulary ({vocab} tokens) does not have; it comes from the tokenizer's added tokens, so remove the text that makes it"
            ),
            StartError::ShuttingDown => {
                "the server is shutting down; retry on another server".into()
            }
            StartError::NotLoaded => "the model is not loaded".into(),
            StartError::ContentFiltered { ref rule } => format!(
                "the request matches the server's content filter (rule `{rule}`); nothing was generated"
            ),
        }
    }
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
    /// A raw generation (one beam of a beam search): it never ends by itself
    /// (no end-of-sequence, stop string or `max_tokens` check) and decodes no
    /// text; its owner reads the sampled tokens and logprobs and ends it.
    pub raw: bool,
    /// KV blocks kept from an earlier generation ([`KeptKv`]) whose tokens
    /// should be exactly `prompt_ids`: the new generation continues from them
    /// without recomputing its prompt. When they are gone (memory pressure)
    /// or their tokens differ, the prompt is computed as usual, so this
    /// changes time, never tokens.
    pub reuse_kv: Option<KeptKv>,
    /// The grammar its output must follow (structured output), compiled
    /// with [`crate::TextCodec::constrain`]; `None` = free text.
    pub constraint: Option<crate::constraint::Constraint>,
    /// An embedding instead of text: the prompt is computed and its final
    /// hidden states pooled this way into one vector, the generation's only
    /// piece ([`TokenPiece::embedding`](super::TokenPiece::embedding)); set
    /// `params.max_tokens` to 0 (nothing is generated, so a prompt may take
    /// the whole context). `None`: text.
    pub embed: Option<crate::engine::Pooling>,
    /// Score the prompt (Completions' `echo` with `logprobs`): with
    /// `Some(k)`, the first piece carries each prompt token's
    /// log-probability given the tokens before it, with the `k` most likely
    /// tokens at its position
    /// ([`TokenPiece::prompt_logprobs`](super::TokenPiece::prompt_logprobs)).
    /// The prompt is then computed from position 0 (no prefix cache, and
    /// `reuse_kv` is dropped). Ignored with `embed`. `None`: no scoring.
    pub prompt_logprobs: Option<u8>,
    /// Which part of its client's request it is, for the rate limits.
    pub part: RequestPart,
}

/// Which part of a client request a generation computes, for the rate
/// limits: a request counts once however many generations compute it, and
/// once admitted is computed whole ([`crate::dialect::Cx::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestPart {
    /// The request's first (or only) generation: admitted under the
    /// requests-per-minute limit (or refused), its prompt and generated
    /// tokens charged.
    #[default]
    First,
    /// A later generation of an admitted request with a prompt of its own
    /// (another Completions prompt, another embedding input): never
    /// refused by a limit; its prompt and generated tokens charged.
    NewPrompt,
    /// Another choice of a prompt a generation of the same request already
    /// computes (Chat Completions' `n`): never refused by a limit, and only
    /// its generated tokens charged, as the prompt was (the usage counts it
    /// once).
    SamePrompt,
}

/// A finished generation's KV blocks kept by the Host for a continuation
/// ([`crate::dialect::Cx::keep_kv`]). Only a handle: the blocks may be freed
/// at any time under memory pressure, and every use checks that they are
/// still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeptKv(pub(crate) SeqId);
