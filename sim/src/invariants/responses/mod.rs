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

/// Test scaffolding the responses checkers share.
#[cfg(test)]
pub(crate) mod testkit {
    use serde_json::{json, Value};
    use tokenwire_core::text::byte::ByteCodec;
    use tokenwire_core::{
        ChatMessage, ConnId, Dialect, Encoded, Input, Output, Role, TextDone, TextJob, TextJobId,
        TextWork,
    };

    use crate::invariants::testkit::kit;
    use crate::invariants::{Check, Checker};

    /// A create of `input`, judged by `checker`, whose tokenizer gave
    /// `result` (the tokens are back in this event), then `answer`.
    pub fn create_answered(
        checker: Box<dyn Checker>,
        input: &str,
        result: Result<Encoded, String>,
        answer: Value,
    ) -> Check {
        let mut k = kit(checker);
        k.open_as(1, Dialect::Responses);
        k.text(1, json!({"type": "response.create", "input": input}))
            .map_err(|v| v.detail)?;
        k.out(Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages: vec![ChatMessage::new(Role::User, input)],
                max_messages: usize::MAX,
                max_tokens: 100,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        }))
        .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(1),
            result,
        }))
        .map_err(|v| v.detail)?;
        k.send(1, answer).map_err(|v| v.detail)
    }

    /// An error event of `code` on `input`.
    pub fn input_error(code: &str) -> Value {
        json!({"type": "error", "status": 400,
               "error": {"type": "invalid_request_error", "code": code,
                         "message": "m", "param": "input"}})
    }
}
