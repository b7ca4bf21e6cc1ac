//! The `batch` dialect (`/ws`): its checkers and its part of the view
//! ([`view`]: each connection's payloads and prompts, and the Host's
//! continue-generation cache as the frames tell it).
//!
//! The checkers: every frame an array of events of one type; each payload
//! answered in order (ACCEPTED, or one ERROR per prompt it names), exactly
//! one COMPLETE or ERROR per accepted prompt and nothing after, STARTED /
//! INITIALIZED at most once and before PROGRESS; frames in payload order,
//! PROGRESS only when streaming; continued batches starting from the text
//! the modelled continue-generation cache holds; `new_tokens_count` within
//! `max_new_tokens` and streamed texts adding up; payloads refused exactly
//! at the per-connection bound; the clients' hostile payloads never accepted,
//! and their valid ones refused only at that bound;
//! prompts run exactly when they fit the context; a beam search completes
//! with a reference search's best hypothesis, and its `is_eos` as that
//! hypothesis ends; a sampled prompt's `is_eos` exactly when its run ended
//! with the end-of-sequence token; every COMPLETE after STARTED and
//! INITIALIZED, its `execution_time` the time since STARTED.

pub mod beams;
pub mod bounds;
pub mod cache;
pub mod context;
pub mod continuation;
pub mod eos;
pub mod honest;
pub mod hostile;
pub mod order;
pub mod terminal;
pub mod text;
pub mod timing;
pub mod view;
pub mod wire;

use super::Checker;

/// The `batch` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(wire::BatchWire),
        Box::new(terminal::BatchTerminal),
        Box::new(order::BatchOrder),
        Box::new(continuation::BatchContinuation),
        Box::new(text::BatchText),
        Box::new(bounds::BatchBounds),
        Box::new(hostile::BatchHostile),
        Box::new(honest::BatchHonest),
        Box::new(context::BatchContext),
        Box::new(beams::BatchBeams::default()),
        Box::new(eos::BatchEos),
        Box::new(timing::BatchTiming),
    ]
}
