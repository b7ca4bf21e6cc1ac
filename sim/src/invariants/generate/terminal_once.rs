//! `terminal_once`: a request gets at most one terminal event (`completion`,
//! or an `error` carrying `generated_text`), only while it is the one in
//! flight on its connection, and a new request never starts while another is
//! in flight (which would leave the first without its terminal event). That
//! every request does get one, unless its connection died or a `regenerate`
//! replaced it, is [`crate::invariants::common::liveness`]'s job at the end of the run.

use tokenwire_core::Output;

use super::view::Pending;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct TerminalOnce;

impl Checker for TerminalOnce {
    fn name(&self) -> &'static str {
        "terminal_once"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        if f.kind() == "init" {
            // A held regenerate being handled replaces the request in flight.
            let regenerate = c.pending.front().map(|h| &h.kind) == Some(&Pending::Regenerate);
            if let Some(cur) = c.current.as_ref().filter(|_| !regenerate) {
                return Err(format!(
                    "{conn:?} started request {:?} while {cur} was in flight",
                    f.request_id().unwrap_or("?")
                ));
            }
            return Ok(());
        }
        if !f.is_terminal() {
            return Ok(());
        }
        let Some(rid) = f.request_id() else {
            return Err(format!("{} without a request_id on {conn:?}", f.kind()));
        };
        if let Some(r) = cx.view.requests.get(rid) {
            if r.terminals > 0 {
                return Err(format!(
                    "second terminal event ({}) for request {rid} on {conn:?}",
                    f.kind()
                ));
            }
            if r.superseded {
                return Err(format!(
                    "terminal event ({}) for request {rid}, which a regenerate replaced",
                    f.kind()
                ));
            }
        }
        match c.current.as_deref() {
            Some(cur) if cur == rid => Ok(()),
            cur => Err(format!(
                "terminal event ({}) for request {rid} on {conn:?}, but the request in flight is {cur:?}",
                f.kind()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    fn completion(rid: &str) -> serde_json::Value {
        json!({"type": "completion", "request_id": rid, "generated_text": "", "finish_reason": "stop",
               "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}})
    }

    #[test]
    fn a_second_completion_is_caught() {
        let mut k = kit(Box::new(TerminalOnce));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.send(1, completion("gen_a")).expect("first terminal");
        let err = k.send(1, completion("gen_a")).expect_err("second");
        assert_eq!(err.invariant, "terminal_once");
        assert!(err.detail.contains("second terminal"), "{}", err.detail);
    }

    #[test]
    fn a_held_regenerate_replaces_the_request_its_job_started() {
        use tokenwire_core::testing::ByteCodec;
        use tokenwire_core::{ConnId, Input, Output, TextJob, TextJobId, TextWork};
        let mut k = kit(Box::new(TerminalOnce));
        k.open(1);
        // A config goes out to be tokenized; the regenerate behind it waits.
        k.text(1, json!({"type": "config", "prompt": "hi"}))
            .expect("config");
        let job = TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Encode {
                text: "hi".into(),
                add_special: true,
            },
        };
        k.out(Output::Tokenize(job.clone())).expect("job");
        k.end().expect("end");
        k.text(1, json!({"type": "control", "action": "regenerate"}))
            .expect("held");
        k.end().expect("end");
        // Its tokens come back: the request starts, then the held regenerate
        // replaces it with a new one.
        k.input(Input::Tokenized(job.run())).expect("tokenized");
        k.send(1, json!({"type": "init", "request_id": "gen_a"}))
            .expect("init of the config");
        k.send(1, json!({"type": "init", "request_id": "gen_b"}))
            .expect("init of the regenerate");
        k.end().expect("end");
        let err = k.send(1, completion("gen_a")).expect_err("replaced");
        assert!(err.detail.contains("regenerate replaced"), "{}", err.detail);
        k.send(1, completion("gen_b")).expect("the new one ends");
    }

    #[test]
    fn a_new_init_while_one_is_in_flight_is_caught() {
        let mut k = kit(Box::new(TerminalOnce));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        let err = k
            .send(1, json!({"type": "init", "request_id": "gen_b"}))
            .expect_err("overlapping requests");
        assert!(err.detail.contains("in flight"));
    }
}
