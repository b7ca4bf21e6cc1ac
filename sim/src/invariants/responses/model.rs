//! `responses_model`: a create naming a model other than the served one
//! gets `model_not_found` (404) and starts nothing; one naming the served
//! model, or none, never gets `model_not_found`.

use tokenwire_core::Output;

use super::view::{code, RKind, RMsg, RStage, ResponsesConnView};
use crate::invariants::{Check, Checker, Cx, Frame};

/// The `model` of the create being handled on the connection, if the head
/// of its queue is a create not yet handled (outer `None`: it is not).
fn handled_model(r: &ResponsesConnView) -> Option<Option<&str>> {
    match r.head() {
        Some(RMsg {
            kind: RKind::Create { model, .. },
            stage: RStage::Sent,
            ..
        }) => Some(model.as_deref()),
        _ => None,
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesModel;

impl Checker for ResponsesModel {
    fn name(&self) -> &'static str {
        "responses_model"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let served = cx.model.name.as_str();
        match (out, frame) {
            (Output::Tokenize(job), _) => {
                let Some(r) = cx.view.responses(&job.conn) else {
                    return Ok(());
                };
                match handled_model(r) {
                    Some(Some(m)) if m != served => Err(format!(
                        "a create on {:?} naming model {m:?} was accepted (the server serves {served:?})",
                        job.conn
                    )),
                    _ => Ok(()),
                }
            }
            (Output::Send { conn, .. }, Some(f))
                if f.kind() == "error" && code(f) == "model_not_found" =>
            {
                let Some(r) = cx.view.responses(conn) else {
                    return Ok(());
                };
                match handled_model(r) {
                    Some(Some(m)) if m != served => Ok(()),
                    named => Err(format!(
                        "model_not_found on {conn:?} for a create naming {:?} (the server serves {served:?})",
                        named.flatten()
                    )),
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::text::byte::ByteCodec;
    use tokenwire_core::{ConnId, Dialect, TextJob, TextJobId, TextWork};

    fn not_found() -> serde_json::Value {
        json!({"type": "error", "status": 404,
               "error": {"type": "invalid_request_error", "code": "model_not_found",
                         "message": "m", "param": "model"}})
    }

    #[test]
    fn a_wrong_model_accepted_or_the_served_one_refused_is_caught() {
        let mut k = kit(Box::new(ResponsesModel));
        k.open_as(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.create", "model": "tiny", "input": "hi"}),
        )
        .expect("create");
        let e = k.send(1, not_found()).expect_err("the served model");
        assert_eq!(e.invariant, "responses_model");

        let mut k = kit(Box::new(ResponsesModel));
        k.open_as(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.create", "model": "gpt-nope", "input": "hi"}),
        )
        .expect("create");
        let e = k
            .out(Output::Tokenize(TextJob {
                id: TextJobId(1),
                conn: ConnId(1),
                codec: ByteCodec::shared(),
                work: TextWork::Encode {
                    text: "x".into(),
                    add_special: true,
                },
            }))
            .expect_err("another model accepted");
        assert!(e.detail.contains("gpt-nope"), "{}", e.detail);

        let mut k = kit(Box::new(ResponsesModel));
        k.open_as(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.create", "model": "gpt-nope", "input": "hi"}),
        )
        .expect("create");
        k.send(1, not_found()).expect("refused as it must be");
    }
}
