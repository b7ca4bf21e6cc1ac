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
    use crate::invariants::testkit::kit;
    use serde_json::{json, Value};
    use tokenwire_core::text::byte::ByteCodec;
    use tokenwire_core::{
        ChatMessage, ConnId, Dialect, Input, Role, TextDone, TextJob, TextJobId, TextWork,
    };

    /// A create of "hi" whose tokenizer gave `result`, then `answer`.
    fn answered(result: Result<(), String>, answer: Value) -> Check {
        let mut k = kit(Box::new(ResponsesUnreadableInput));
        k.open_as(1, Dialect::Responses);
        k.text(1, json!({"type": "response.create", "input": "hi"}))
            .map_err(|v| v.detail)?;
        k.out(Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages: vec![ChatMessage {
                    role: Role::User,
                    content: "hi".into(),
                }],
                max_messages: usize::MAX,
                max_tokens: 100,
                tools: Vec::new(),
            },
        }))
        .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(1),
            result: result.map(|()| tokenwire_core::Encoded {
                ids: vec![1, 2],
                dropped: 0,
            }),
        }))
        .map_err(|v| v.detail)?;
        k.send(1, answer).map_err(|v| v.detail)
    }

    fn error(code: &str) -> Value {
        json!({"type": "error", "status": 400,
               "error": {"type": "invalid_request_error", "code": code,
                         "message": "m", "param": "input"}})
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
