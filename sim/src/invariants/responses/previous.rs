//! `responses_previous`: `previous_response_id` resolves only against this
//! connection's cache: the last response that ended completed or incomplete
//! (a cancelled one leaves the cache as it was, a failed one empties it).
//! A create naming any other id (one of another connection, one that failed,
//! an older one, an invented one) gets `previous_response_not_found` (404),
//! unless something checked before it is wrong (a response in flight, the
//! model, a parameter); it is never accepted, and no response is created
//! continuing it. A create naming the cached id never gets a 404.
//!
//! Over HTTP the id resolves against the host's store instead: a create
//! may continue only a response an HTTP request stored (every simulated
//! HTTP request is the anonymous principal's); the store forgets the least
//! recently used, so a 404 is a violation only for a response stored since
//! the Host last started while no more were stored than the store holds.

use tokenwire_core::{ConnId, Output, Transport};

use super::view::{code, RKind, RMsg, RStage, ResponsesConnView};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesPrevious;

/// What `id` is, for messages.
fn describe(cx: &Cx<'_>, r: &ResponsesConnView, id: &str) -> String {
    if r.ended.contains(id) {
        return format!(
            "an older response of this connection (the cache holds {:?})",
            r.latest
        );
    }
    let elsewhere = cx
        .view
        .conns
        .iter()
        .find(|(_, c)| c.responses.as_ref().is_some_and(|o| o.ended.contains(id)));
    match elsewhere {
        Some((other, _)) => format!("a response of {other:?}"),
        None => "unknown here".into(),
    }
}

/// True when `conn` is an HTTP request.
fn over_http(cx: &Cx<'_>, conn: ConnId) -> bool {
    cx.view
        .conns
        .get(&conn)
        .is_some_and(|c| c.transport == Transport::Http)
}

/// True when a create on `conn` may continue `id`.
fn may_resolve(cx: &Cx<'_>, conn: ConnId, r: &ResponsesConnView, id: &str) -> bool {
    if over_http(cx, conn) {
        return cx.view.responses_stored.contains(id);
    }
    r.latest.as_deref() == Some(id)
}

/// True when a create on `conn` must be able to continue `id`.
fn must_resolve(cx: &Cx<'_>, conn: ConnId, r: &ResponsesConnView, id: &str) -> bool {
    if over_http(cx, conn) {
        return ResponsesConnView::store_holds(cx.view, cx.config.response_store_size, id);
    }
    r.latest.as_deref() == Some(id)
}

/// The `previous_response_id` of the create being handled now, if any.
fn handled_create(r: &ResponsesConnView) -> Option<&str> {
    match r.head() {
        Some(RMsg {
            kind: RKind::Create { prev: Some(p), .. },
            stage: RStage::Sent,
            ..
        }) if r.current.is_none() => Some(p),
        _ => None,
    }
}

impl Checker for ResponsesPrevious {
    fn name(&self) -> &'static str {
        "responses_previous"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::Tokenize(job) => {
                let Some(r) = cx.view.responses(&job.conn) else {
                    return Ok(());
                };
                match handled_create(r) {
                    Some(p) if !may_resolve(cx, job.conn, r, p) => Err(format!(
                        "a create on {:?} continuing {p} ({}) was accepted",
                        job.conn,
                        describe(cx, r, p)
                    )),
                    _ => Ok(()),
                }
            }
            Output::Send { conn, text } => {
                let Some(f) = frame else {
                    return Ok(());
                };
                let Some(r) = cx.view.responses(conn) else {
                    return Ok(());
                };
                if f.kind() == "response.created" {
                    let prev = f.v["response"]["previous_response_id"].as_str();
                    return match prev {
                        Some(p) if !may_resolve(cx, *conn, r, p) => Err(format!(
                            "response created on {conn:?} continuing {p} ({})",
                            describe(cx, r, p)
                        )),
                        _ => Ok(()),
                    };
                }
                if f.kind() != "error" || ResponsesConnView::is_unprompted_error(f) {
                    return Ok(());
                }
                let Some(p) = handled_create(r) else {
                    return Ok(());
                };
                let resolves = must_resolve(cx, *conn, r, p);
                let c = code(f);
                let input_missing = c == "invalid_request"
                    && f.v["error"]["param"] == "input"
                    && f.v["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("required"));
                let ok = match (resolves, c) {
                    (true, "previous_response_not_found") => false,
                    (true, _) | (false, "previous_response_not_found") => true,
                    (false, "model_not_found") => true,
                    (false, "invalid_request") => !input_missing,
                    _ => false,
                };
                if ok {
                    return Ok(());
                }
                Err(format!(
                    "a create on {conn:?} continuing {p} ({}; the cache holds {:?}) got {c}: {}",
                    if resolves && over_http(cx, *conn) {
                        "stored by an HTTP request since the Host started".to_string()
                    } else if resolves {
                        "the cached one".to_string()
                    } else {
                        describe(cx, r, p)
                    },
                    r.latest,
                    clip(text)
                ))
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
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{ConnId, Dialect, Input, TextJob, TextJobId, TextWork};

    fn ev(t: &str, n: u64, id: &str, status: &str) -> serde_json::Value {
        json!({"type": t, "sequence_number": n,
               "response": {"id": id, "status": status, "previous_response_id": null}})
    }

    fn tokenize(conn: u64) -> Output {
        Output::Tokenize(TextJob {
            id: TextJobId(conn),
            conn: ConnId(conn),
            codec: ByteCodec::shared(),
            work: TextWork::Encode {
                text: "x".into(),
                add_special: true,
            },
        })
    }

    #[test]
    fn an_id_of_another_connection_or_a_failed_response_is_caught() {
        let mut k = kit(Box::new(ResponsesPrevious));
        k.open_as(1, Dialect::Responses);
        k.open_as(2, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        k.send(1, ev("response.created", 0, "resp_a", "in_progress"))
            .expect("created");
        k.send(1, ev("response.completed", 1, "resp_a", "completed"))
            .expect("completed");
        k.end().expect("end");
        // Another connection names resp_a: it must not be accepted.
        k.text(
            2,
            json!({"type": "response.create", "input": "x", "previous_response_id": "resp_a"}),
        )
        .expect("frame");
        let e = k.out(tokenize(2)).expect_err("resolved across connections");
        assert!(e.detail.contains("ConnId(1)"), "{}", e.detail);
        k.end().expect("end");
        // On its own connection, after a failure, it is gone.
        k.input(Input::Timeout).expect("input");
        k.send(1, ev("response.created", 0, "resp_b", "in_progress"))
            .expect("created");
        k.send(1, ev("response.failed", 1, "resp_b", "failed"))
            .expect("failed");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "response.create", "input": "x", "previous_response_id": "resp_a"}),
        )
        .expect("frame");
        let e = k
            .send(
                1,
                json!({"type": "response.created", "sequence_number": 0,
                            "response": {"id": "resp_c", "previous_response_id": "resp_a"}}),
            )
            .expect_err("continues past a failure");
        assert_eq!(e.invariant, "responses_previous");
    }

    #[test]
    fn a_404_for_the_cached_id_is_caught() {
        let mut k = kit(Box::new(ResponsesPrevious));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        k.send(1, ev("response.created", 0, "resp_a", "in_progress"))
            .expect("created");
        k.send(1, ev("response.incomplete", 1, "resp_a", "incomplete"))
            .expect("incomplete");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "response.create", "input": "x", "previous_response_id": "resp_a"}),
        )
        .expect("frame");
        let e = k
            .send(1, json!({"type": "error", "status": 404,
                            "error": {"code": "previous_response_not_found", "param": "previous_response_id"}}))
            .expect_err("it is cached");
        assert_eq!(e.invariant, "responses_previous");
    }

    /// A fabricated violation: over HTTP, a 404 for a response stored since
    /// the Host started, the store far from full; after a crash, none.
    #[test]
    fn a_404_for_a_stored_id_over_http_is_caught() {
        let not_found = json!({"type": "error", "status": 404,
                               "error": {"code": "previous_response_not_found",
                                         "param": "previous_response_id"}});
        let create =
            json!({"type": "response.create", "input": "x", "previous_response_id": "resp_s"});
        let mut k = kit(Box::new(ResponsesPrevious));
        k.m.view_mut().responses_stored.insert("resp_s".into());
        k.m.view_mut().responses_kept.insert("resp_s".into());
        k.open_http(1, Dialect::Responses);
        k.text(1, create.clone()).expect("frame");
        let e = k.send(1, not_found.clone()).expect_err("it is stored");
        assert!(
            e.detail.contains("stored by an HTTP request"),
            "{}",
            e.detail
        );

        let mut k = kit(Box::new(ResponsesPrevious));
        k.m.view_mut().responses_stored.insert("resp_s".into());
        k.open_http(1, Dialect::Responses);
        k.text(1, create).expect("frame");
        k.send(1, not_found).expect("stored before a crash");
    }
}
