//! The `session` dialect (`/ws/session`): its checkers and its part of the
//! view ([`view`]: each connection's messages, sessions and turns).
//!
//! The checkers: wire format, replies in order, message indexes, the
//! history a session continues from (after a resume on a rebuilt Host too),
//! chunks against responses, and that nothing of a session outlives its end
//! or its connection, the session bounds (per connection and per host) and
//! the bytes of text a session keeps, the reasons of job-budget refusals,
//! no job past its token budget, each job's account modelled exactly
//! (refusals for the budget when, and only when, nothing fits),
//! signed prompts (against a reference ECDSA verifier of its own), an init
//! never refused for the resume's `last_message_index`; and what a
//! client of `POST /v1/inference` gets ([`http`]). The other checkers judge
//! WebSocket sessions: an HTTP request's one-turn session is judged by what
//! its client gets.

pub mod bounds;
pub mod budget;
pub mod bytes;
pub mod cleanup;
pub mod history;
pub mod http;
pub mod index;
pub mod job_ledger;
pub mod job_tokens;
pub mod replies;
pub mod signatures;
pub mod start_fields;
pub mod stream;
pub mod view;
pub mod wire;

use super::Checker;

/// The `session` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(wire::SessionWire),
        Box::new(replies::SessionReplies),
        Box::new(index::SessionIndex),
        Box::new(history::SessionHistory),
        Box::new(stream::SessionStream),
        Box::new(cleanup::SessionCleanup),
        Box::new(bounds::SessionBounds),
        Box::new(bytes::SessionBytes),
        Box::new(budget::SessionBudget),
        Box::new(job_tokens::SessionJobTokens::default()),
        Box::new(job_ledger::SessionJobLedger::default()),
        Box::new(signatures::SessionSignatures),
        Box::new(start_fields::SessionStartFields),
        Box::new(http::SessionHttp::default()),
    ]
}
