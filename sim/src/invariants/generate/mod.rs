//! The `generate` dialect (`/generate`): its checkers, the reference model
//! of its replies ([`model`]), and its part of the view ([`view`]: each
//! request's config, streamed text and sampled tokens).
//!
//! The checkers judge `generate` connections only (each is wrapped in a
//! [`ForDialect`]): wire format, replies, queue positions, sampling, engine
//! faults, terminal events, streamed text, stop strings, the content
//! filter's stop rules, `max_tokens`, token
//! delivery, pause and its timeout; and that the engine never idles while a
//! request waits.

pub mod after_terminal;
pub mod content_filter;
pub mod engine_faults;
pub mod max_tokens;
pub mod model;
pub mod pause;
pub mod pause_timeout;
pub mod queue_position;
pub mod replies;
pub mod sampling;
pub mod stop_strings;
pub mod stream_text;
pub mod terminal_once;
pub mod token_delivery;
pub mod view;
pub mod wire;
pub mod work_conserving;

use tokenwire_core::Dialect;

use super::{Checker, ForDialect};

/// The `generate` dialect's checkers, in the order they run, each judging
/// only what goes to `generate` connections (see [`ForDialect`]).
pub fn checkers() -> Vec<Box<dyn Checker>> {
    let v: Vec<Box<dyn Checker>> = vec![
        Box::new(wire::WireFormat::default()),
        Box::new(replies::Replies::default()),
        Box::new(queue_position::QueuePosition::default()),
        Box::new(work_conserving::WorkConserving),
        Box::new(sampling::Sampling),
        Box::new(engine_faults::EngineFaults::default()),
        Box::new(terminal_once::TerminalOnce),
        Box::new(after_terminal::AfterTerminal),
        Box::new(stream_text::StreamText),
        Box::new(stop_strings::StopStrings),
        Box::new(content_filter::ContentFilter),
        Box::new(max_tokens::MaxTokens),
        Box::new(token_delivery::TokenDelivery),
        Box::new(pause::Pause),
        Box::new(pause_timeout::PauseTimeout),
    ];
    v.into_iter()
        .map(|c| ForDialect::wrap(Dialect::Generate, c))
        .collect()
}
