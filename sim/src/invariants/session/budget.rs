//! `session_budget`: a prompt refused with `token_budget_exhausted` once
//! its tokens are back is refused for a reason that holds: its message
//! names the prompt's tokens (as the tokenizer counted them) and what the
//! job has left, and the prompt needs at least that much. (A job that has
//! nothing left at all is refused before tokenizing, without numbers.)

use tokenwire_core::Output;

use super::view::{code, Msg, MsgKind, Stage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// The (needed, left) numbers of a refusal's message.
fn numbers(message: &str) -> Option<(u64, u64)> {
    let rest = message.strip_prefix("the prompt needs ")?;
    let (needed, rest) = rest.split_once(" tokens but the job has ")?;
    let (left, _) = rest.split_once(" left")?;
    Some((needed.parse().ok()?, left.parse().ok()?))
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionBudget;

impl Checker for SessionBudget {
    fn name(&self) -> &'static str {
        "session_budget"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if f.kind() != "error" || code(f) != "token_budget_exhausted" {
            return Ok(());
        }
        let message = f.str("message").unwrap_or("");
        let Some((needed, left)) = numbers(message) else {
            return Ok(());
        };
        if needed < left {
            return Err(format!(
                "a prompt on {conn:?} refused for the job's budget, needing {needed} tokens with {left} left: {message}"
            ));
        }
        let tokenized = cx.view.session(conn).and_then(|s| match s.queue.front() {
            Some(Msg {
                kind: MsgKind::Prompt { .. },
                stage: Stage::Tokenized,
                fitted: Some((n, _)),
                ..
            }) => Some(u64::from(*n)),
            _ => None,
        });
        match tokenized {
            Some(n) if n != needed => Err(format!(
                "a prompt on {conn:?} of {n} tokens refused as needing {needed}: {message}"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Dialect;

    #[test]
    fn the_numbers_are_read() {
        assert_eq!(
            numbers("the prompt needs 12 tokens but the job has 30 left on this host"),
            Some((12, 30))
        );
        assert_eq!(
            numbers(
                "the job has no tokens left on this host (used, or held by its replies in flight)"
            ),
            None
        );
    }

    #[test]
    fn a_refusal_whose_prompt_fits_the_budget_is_caught() {
        let mut k = kit(Box::new(SessionBudget));
        k.open_as(1, Dialect::Session);
        let refusal = |needed: u64, left: u64| {
            json!({"type": "error", "session_id": "s", "code": "token_budget_exhausted",
                   "message": format!("the prompt needs {needed} tokens but the job has {left} left on this host"),
                   "timestamp": 1})
        };
        k.send(1, refusal(30, 30)).expect("needs all that is left");
        let e = k.send(1, refusal(12, 30)).expect_err("it fits");
        assert_eq!(e.invariant, "session_budget");
    }
}
