//! The dialect layer: each wire protocol is a codec plus a small per-connection
//! state machine that drives the shared generation machine through [`Cx`].
//!
//! Adding a dialect is adding one module here that implements [`DialectConn`]
//! (only the hooks it needs: the others have no-op defaults) and its row in
//! [`registry::DIALECTS`]: its machine, its HTTP routes if it has any (an
//! [`crate::http::HttpSpec`] in its module), and the host-wide state it keeps
//! if any (its own type, implementing [`state::HostWide`], reached through
//! [`Cx::state`]). Its variant in [`crate::Dialect`] names its path.
//!
//! Imports run one way: the Host uses this layer (it implements
//! [`cx::HostPort`] for [`Cx`]), and this layer uses the generation machine
//! ([`crate::gen`]); nothing here names the Host. [`registry`] is the one
//! module that names every dialect, and no dialect imports it.

pub mod anthropic;
pub mod batch;
pub mod cai;
pub mod chat;
pub mod cx;
pub mod generate;
pub mod guided;
pub mod messages;
pub mod openai;
pub mod registry;
pub mod responses;
pub mod session;
pub mod state;

pub use crate::gen::{Failure, FailureKind, GenRequest, RequestPart, StartError};
pub use cx::{Cx, HostPort};
pub use registry::machine_for;

use crate::api::{JobCheckId, JobGrant};
use crate::engine::SeqId;
use crate::gen::TokenPiece;
use crate::text::{Encoded, TextJobId};
use crate::time::Duration;

/// A connection refused when it opens: closed with `code` and `reason`
/// after whatever the dialect sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// WebSocket close code.
    pub code: u16,
    /// Close reason (short, no client content).
    pub reason: String,
}

/// The per-connection state machine of one dialect.
///
/// The Host calls these hooks; each may send frames and steer generations
/// through its [`Cx`]. Hooks a dialect does not need keep their no-op bodies.
pub trait DialectConn: Send {
    /// The connection opened (`query` is the raw query string without `?`;
    /// `peer` the remote address). Refusing closes it with the refusal's code,
    /// after whatever was sent here. Runs before the model is loaded too, so
    /// it must not ask for the model.
    fn on_open(&mut self, _cx: &mut Cx<'_>, _query: &str, _peer: &str) -> Result<(), Refusal> {
        Ok(())
    }
    /// A text frame arrived (already checked against the frame size limit).
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str);
    /// A binary frame arrived.
    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize);
    /// A generation of this connection produced a token or ended. When
    /// `piece.finish` is set the generation is over and is dropped after this
    /// call. This is the one route of a generation's last piece, whether it
    /// ended by itself, by a deadline or by [`Cx::end`].
    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece);
    /// A generation of this connection failed; it is dropped after this call.
    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure);
    /// A text job this connection asked for ([`Cx::encode_prompt`],
    /// [`Cx::encode_chat`]) is done: the prompt's token ids, or the
    /// tokenizer's error. The connection's frames that arrived meanwhile are
    /// handed over after this call.
    fn on_text_done(
        &mut self,
        _cx: &mut Cx<'_>,
        _job: TextJobId,
        _result: Result<Encoded, String>,
    ) {
    }
    /// A job id this connection asked to verify ([`Cx::verify_job`]) was
    /// answered: what the job may use, or why it was refused. Frames that
    /// arrived meanwhile are handed over after this call.
    fn on_job_verified(
        &mut self,
        _cx: &mut Cx<'_>,
        _check: JobCheckId,
        _verdict: Result<JobGrant, String>,
    ) {
    }
    /// A generation is waiting for admission at 1-based `position`.
    fn on_queued(&mut self, _cx: &mut Cx<'_>, _id: SeqId, _position: u32) {}
    /// The scheduler admitted a generation of this connection: its prompt is
    /// being computed from the step just planned.
    fn on_admitted(&mut self, _cx: &mut Cx<'_>, _id: SeqId) {}
    /// An engine step that computed generations of this connection is done,
    /// and every token it produced was delivered.
    fn on_step_end(&mut self, _cx: &mut Cx<'_>) {}
    /// A timer this connection set ([`Cx::set_timer`]) is due.
    fn on_timer(&mut self, _cx: &mut Cx<'_>, _tag: u8) {}
    /// The model is loading (sent to connections that are waiting for it).
    fn on_model_loading(
        &mut self,
        _cx: &mut Cx<'_>,
        _progress: f32,
        _message: &str,
        _eta: Option<Duration>,
    ) {
    }
    /// The shutdown grace is over and no generation is left: answer what the
    /// connection still holds (with the dialect's error, retry elsewhere);
    /// it is closed with 1001 right after.
    fn on_shutdown(&mut self, _cx: &mut Cx<'_>) {}
    /// The connection is gone (either side closed it): release what it holds
    /// in [`state::DialectState`]. Nothing can be sent any more; its
    /// generations are cancelled by the Host after this call.
    fn on_closed(&mut self, _cx: &mut Cx<'_>) {}
    /// True while a request is in flight (idle timeout does not apply).
    fn busy(&self) -> bool;
    /// True while the connection holds replies whose generation has ended
    /// (waiting for the client's flow-control window): a shutdown waits for
    /// them within its grace, then [`DialectConn::on_shutdown`] answers them.
    fn holds_output(&self) -> bool {
        false
    }
}
