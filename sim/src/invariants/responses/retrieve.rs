//! `responses_retrieve`: over a WebSocket, `response.retrieve` is not an
//! event the server takes (retrieving a stored response is the HTTP route
//! `GET /v1/responses/{id}`): the error answering it is
//! `unknown_event_type`, whatever id it names. (Events of a response in
//! flight may come while it waits; only an error answers it.) Over HTTP,
//! a response stored since the Host last started, while the store has
//! forgotten none, is never `not_found`.

use tokenwire_core::Output;

use super::view::{code, RKind, RStage, ResponsesConnView};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesRetrieve;

impl Checker for ResponsesRetrieve {
    fn name(&self) -> &'static str {
        "responses_retrieve"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(r) = cx.view.responses(conn) else {
            return Ok(());
        };
        let Some(id) = r.head().and_then(|m| match &m.kind {
            RKind::Retrieve { id } if m.stage == RStage::Sent => Some(id),
            _ => None,
        }) else {
            return Ok(());
        };
        // Only an error answers a frame: other events belong to the
        // response in flight.
        if f.kind() != "error" || ResponsesConnView::is_unprompted_error(f) {
            return Ok(());
        }
        if !r.websocket {
            let held = ResponsesConnView::store_holds(cx.view, cx.config.response_store_size, id);
            if held && code(f) == "not_found" {
                return Err(format!(
                    "GET /v1/responses/{id} on {conn:?} was not_found, though an HTTP request stored it since the Host started ({} stored, the store holds {})",
                    cx.view.responses_kept.len(),
                    cx.config.response_store_size
                ));
            }
            return Ok(());
        }
        match code(f) {
            "unknown_event_type" => Ok(()),
            code => Err(format!(
                "a response.retrieve over the WebSocket {conn:?} was answered with error {code:?}, not unknown_event_type"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Dialect;

    fn error(status: u64, code: &str) -> serde_json::Value {
        json!({"type": "error", "status": status,
               "error": {"type": "invalid_request_error", "code": code,
                         "message": "m", "param": null}})
    }

    #[test]
    fn a_retrieve_over_a_socket_answered_as_over_http_is_caught() {
        let retrieve = json!({"type": "response.retrieve", "response_id": "resp_1"});
        let mut k = kit(Box::new(ResponsesRetrieve));
        k.open_as(1, Dialect::Responses);
        k.text(1, retrieve.clone()).expect("retrieve");
        let e = k
            .send(1, error(404, "previous_response_not_found"))
            .expect_err("handled as the HTTP route");
        assert_eq!(e.invariant, "responses_retrieve");

        let mut k = kit(Box::new(ResponsesRetrieve));
        k.open_as(1, Dialect::Responses);
        k.text(1, retrieve.clone()).expect("retrieve");
        k.send(1, error(400, "unknown_event_type"))
            .expect("refused as it must be");

        // Over HTTP the route answers with whatever the store holds.
        let mut k = kit(Box::new(ResponsesRetrieve));
        k.open_http(1, Dialect::Responses);
        k.text(1, retrieve.clone()).expect("retrieve");
        k.send(1, error(404, "not_found")).expect("the HTTP route");
    }

    /// A fabricated violation: a response stored since the Host started,
    /// with room to spare in the store, retrieved as not found.
    #[test]
    fn a_stored_response_not_found_over_http_is_caught() {
        let retrieve = json!({"type": "response.retrieve", "response_id": "resp_1"});
        let mut k = kit(Box::new(ResponsesRetrieve));
        k.m.view_mut().responses_kept.insert("resp_1".into());
        k.open_http(1, Dialect::Responses);
        k.text(1, retrieve).expect("retrieve");
        let e = k
            .send(1, error(404, "not_found"))
            .expect_err("stored, never forgotten");
        assert!(e.detail.contains("stored it"), "{}", e.detail);
    }
}
