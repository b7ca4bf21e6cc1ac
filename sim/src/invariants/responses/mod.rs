//! The `responses` dialect (`/v1/responses`): its checkers and its part of
//! the view ([`view`]: each connection's frames and responses).
//!
//! The checkers: event shapes, one response in flight, exactly one terminal
//! event, sequence numbers, `previous_response_id` resolution, `model`
//! (another model refused, the served one never), `metadata` the API allows
//! never refused, the input reaching the
//! tokenizer as written, an input longer alone than the context refused
//! with `context_length_exceeded`, an input the tokenizer could not read
//! refused with `invalid_request`, `response.retrieve`
//! refused over a WebSocket, the connection limit and
//! the connection lifetime; and what a client of the HTTP routes gets
//! ([`http`]).

pub mod http;
pub mod inflight;
pub mod input;
pub mod lifetime;
pub mod limit;
pub mod metadata;
pub mod model;
pub mod previous;
pub mod retrieve;
pub mod sequence;
pub mod terminal;
pub mod too_long;
pub mod unreadable;
pub mod view;
pub mod wire;

use super::Checker;

/// The `responses` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(wire::ResponsesWire),
        Box::new(inflight::ResponsesInflight),
        Box::new(terminal::ResponsesTerminal),
        Box::new(sequence::ResponsesSequence),
        Box::new(previous::ResponsesPrevious),
        Box::new(model::ResponsesModel),
        Box::new(metadata::ResponsesMetadata),
        Box::new(input::ResponsesInput),
        Box::new(too_long::ResponsesTooLong),
        Box::new(unreadable::ResponsesUnreadableInput),
        Box::new(retrieve::ResponsesRetrieve),
        Box::new(limit::ResponsesLimit::default()),
        Box::new(lifetime::ResponsesLifetime),
        Box::new(http::ResponsesHttp::default()),
    ]
}
