//! `responses_too_long`: a create whose own input is longer than the
//! model's whole context (its messages' texts, read from the frame, hold
//! more bytes than the context has tokens; the simulator's byte codec
//! spends at least a token a byte) never starts a response: once its
//! tokens are back it is answered with `context_length_exceeded`, and with
//! no other error (unless the tokenizer failed for another reason).

use tokenwire_core::Output;

use super::view::{code, RKind, RMsg, RStage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesTooLong;

impl Checker for ResponsesTooLong {
    fn name(&self) -> &'static str {
        "responses_too_long"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(RMsg {
            kind: RKind::Create { texts, .. },
            stage: RStage::Tokenized,
            ..
        }) = cx.view.responses(conn).and_then(|r| r.head())
        else {
            return Ok(());
        };
        let bytes: usize = texts.iter().map(String::len).sum();
        // A tokenizer that failed otherwise never counted it
        // (`responses_unreadable_input`).
        if bytes <= cx.model.context_len as usize || cx.view.text_failure == Some(*conn) {
            return Ok(());
        }
        match f.kind() {
            "error" if code(f) == "context_length_exceeded" => Ok(()),
            "error" => Err(format!(
                "a create on {conn:?} whose input alone holds {bytes} bytes (the context is {} tokens) was refused with {:?}, not context_length_exceeded",
                cx.model.context_len,
                code(f)
            )),
            "response.created" => Err(format!(
                "a create on {conn:?} whose input alone holds {bytes} bytes started a response (the context is {} tokens)",
                cx.model.context_len
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

    /// A create of `input` tokenized (too long for the context), then `answer`.
    fn answered(input: &str, answer: Value) -> Check {
        let long = Err(format!("{} 10001 tokens", tokenwire_core::CONTEXT_TOO_LONG));
        create_answered(Box::new(ResponsesTooLong), input, long, answer)
    }

    #[test]
    fn an_input_longer_than_the_context_refused_otherwise_is_caught() {
        let long = "z".repeat(10_000);
        answered(&long, error("context_length_exceeded")).expect("the right code");
        let e = answered(&long, error("invalid_request")).expect_err("the wrong code");
        assert!(e.contains("\"invalid_request\""), "{e}");
        let e = answered(&long, json!({"type": "response.created", "response": {}}))
            .expect_err("started");
        assert!(e.contains("started a response"), "{e}");
        // A short input may be refused for anything.
        answered("hi", error("invalid_request")).expect("short");
    }
}
