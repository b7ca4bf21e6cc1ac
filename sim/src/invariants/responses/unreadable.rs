//! `responses_unreadable_input`: a create whose input the tokenizer could
//! not read, for a reason other than its length (a template it could not
//! render), never starts a response: it is answered with `invalid_request`
//! on `input`, not with `context_length_exceeded`, which would send the
//! client off shortening an input that was never too long.

use tokenwire_core::Output;

use super::view::{code, RKind, RMsg, RStage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesUnreadableInput;

impl Checker for ResponsesUnreadableInput {
    fn name(&self) -> &'static str {
        "responses_unreadable_input"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if cx.view.text_failure != Some(*conn) {
            return Ok(());
        }
        let Some(RMsg {
            kind: RKind::Create { .. },
            stage: RStage::Tokenized,
            ..
        }) = cx.view.responses(conn).and_then(|r| r.head())
        else {
            return Ok(());
        };
        match f.kind() {
            "error" if code(f) == "invalid_request" && f.v["error"]["param"] == "input" => Ok(()),
            "error" => Err(format!(
                "a create on {conn:?} whose input the tokenizer could not read was refused with {:?} (param {}), not invalid_request on input",
                code(f),
                f.v["error"]["param"]
            )),
            "response.created" => Err(format!(
                "a create on {conn:?} whose input the tokenizer could not read started a response"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::responses::testkit::{create_answered, input_error as error};
    use serde_json::{json, Value};

    /// A create of "hi" whose tokenizer gave `result`, then `answer`.
    fn answered(result: Result<(), String>, answer: Value) -> Check {
        let tokens = result.map(|()| tokenwire_core::Encoded {
            ids: vec![1, 2],
            dropped: 0,
        });
        create_answered(Box::new(ResponsesUnreadableInput), "hi", tokens, answer)
    }

    /// A fabricated violation: a template's failure reported as a length.
    #[test]
    fn an_unreadable_input_refused_as_too_long_is_caught() {
        let failed = || Err("the chat template could not be rendered".to_string());
        answered(failed(), error("invalid_request")).expect("the right code");
        let e = answered(failed(), error("context_length_exceeded")).expect_err("a length");
        assert!(e.contains("context_length_exceeded"), "{e}");
        let e = answered(
            failed(),
            json!({"type": "response.created", "response": {}}),
        )
        .expect_err("started");
        assert!(e.contains("started a response"), "{e}");
        // A length is the other checkers' business; tokens that came back
        // are not this one's.
        let long = Err(format!("{} 900 tokens", tokenwire_core::CONTEXT_TOO_LONG));
        answered(long, error("context_length_exceeded")).expect("a real length");
        answered(Ok(()), error("context_length_exceeded")).expect("tokens came back");
    }
}
