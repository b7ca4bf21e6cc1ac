//! The `cai` dialect (`/`): its checkers and its part of the view ([`view`]:
//! each connection's credentials, messages and requests, and the reference
//! authentication).
//!
//! The checkers: client messages read as a reference of their own reads
//! them, authentication at the opening against the keys file, the
//! answer each message gets, exactly one terminal frame per accepted request
//! and nothing of it after, chunk and sentence indices and texts that add
//! up, chunk and sentence windows (and no compute for a connection whose
//! generations are all window-paused; a request ended for a full window no
//! sooner than the pause timeout), per-organisation request buckets and
//! the reasons of `RATE_LIMITED`, token buckets (no admission past what the
//! reported usage allows), the decoder's shape of every frame, and the
//! conversations a continued request is prompted with (a reference model of
//! the store).

pub mod auth;
pub mod conversations;
pub mod decode;
pub mod rate;
pub mod replies;
pub mod sentences;
pub mod stall;
pub mod terminal;
pub mod tokens;
pub mod view;
pub mod window;
pub mod wire;

use super::Checker;

/// The `cai` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(wire::CaiWire),
        Box::new(decode::CaiDecode),
        Box::new(auth::CaiAuth),
        Box::new(replies::CaiReplies),
        Box::new(terminal::CaiTerminal),
        Box::new(sentences::CaiSentences),
        Box::new(window::CaiWindow),
        Box::new(stall::CaiStall),
        Box::new(rate::CaiRate::default()),
        Box::new(tokens::CaiTokens::default()),
        Box::new(conversations::CaiConversations::default()),
    ]
}
