//! The `chat` dialect (the OpenAI HTTP routes: `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/embeddings` and vLLM's tokenizer
//! routes): its checkers, each judging whole answers that [`answers`]
//! assembles from the Host's frames (each a [`answers::JudgeAnswer`] that
//! [`answers::OnAnswers`] runs).
//!
//! The checkers: exactly one answer per request and nothing after it, chunks
//! only when streaming ([`terminal`]); fields the API does not allow
//! refused with a `400` naming them ([`refusals`]); replies and streams shaped as the API
//! says, every choice there and finished once, usage adding up, logprobs
//! the engine's, `max_tokens` kept ([`replies`]); echoed prompts and their
//! scores, position by position, and `max_tokens: 0` ([`scores`]); each
//! embedding the engine's vector of its own input, normalized
//! ([`embeddings`]); the tokenizer routes as the tokenizer reads
//! ([`tokenize`]); vLLM's `allowed_token_ids` and `bad_words` kept in every
//! choice ([`limits`]).

pub mod answers;
pub mod embeddings;
pub mod limits;
pub mod refusals;
pub mod replies;
pub mod scores;
pub mod terminal;
pub mod tokenize;
pub mod view;

use super::Checker;
use answers::OnAnswers;

/// The `chat` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(terminal::ChatTerminal::default()),
        OnAnswers::checker(refusals::ChatRefusals),
        OnAnswers::checker(replies::ChatReplies),
        OnAnswers::checker(scores::ChatScores),
        OnAnswers::checker(embeddings::ChatEmbeddings),
        OnAnswers::checker(tokenize::ChatTokenize),
        OnAnswers::checker(limits::ChatTokenLimits),
    ]
}
