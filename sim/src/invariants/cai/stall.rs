//! `cai_stall`: a request ended because its flow window stayed full
//! (`GENERATION_FAILED`, its message naming the flow window) has a full
//! window as the wire shows it (the chunks sent against those its client
//! acknowledged, the sentences against those it completed), and is ended
//! no sooner than `--pause-timeout` after the server accepted it: the
//! window cannot have been full before then for that long.

use tokenwire_core::Output;

use super::view::{code, rid_of};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiStall;

/// Whether `f` ends a request for a window left full.
fn ended_for_a_full_window(f: &Frame) -> bool {
    f.kind() == "ERROR"
        && code(f) == "GENERATION_FAILED"
        && f.v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("flow window"))
}

impl Checker for CaiStall {
    fn name(&self) -> &'static str {
        "cai_stall"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if !ended_for_a_full_window(f) {
            return Ok(());
        }
        let rid = rid_of(f).unwrap_or("");
        let Some(r) = cx.view.cai(conn).and_then(|a| a.requests.get(rid)) else {
            return Ok(());
        };
        if !r.window_full() {
            return Err(format!(
                "{rid:?} on {conn:?} was ended for a full window, but its windows had room: {}",
                r.windows()
            ));
        }
        let due = r.accepted_at + cx.config.pause_timeout;
        if cx.now < due {
            return Err(format!(
                "{rid:?} on {conn:?} was ended for a full window {:?} after it was accepted, before the pause timeout ({:?})",
                cx.now.saturating_duration_since(r.accepted_at),
                cx.config.pause_timeout
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{cai_kit, Kit};
    use serde_json::json;
    use tokenwire_core::ConnId;

    /// The Host's timer fires at `ms` (the event the error goes out in).
    fn timer_at(k: &mut Kit, ms: u64) {
        k.at(ms);
        k.input(tokenwire_core::Input::Timeout).expect("timer");
    }

    fn stalled(rid: &str) -> serde_json::Value {
        json!({"type": "ERROR", "requestId": rid,
               "error": {"code": "GENERATION_FAILED",
                         "message": "the request's flow window stayed full for 300 s, so it was ended"}})
    }

    /// A kit whose connection 1 has request `r1` in flight, accepted at
    /// time 0 with a chunk window of `window`, that has sent one chunk, none
    /// acknowledged; the Host's timer then fires at `ms`.
    fn one_chunk_sent(window: u64, ms: u64) -> Kit {
        let mut k = cai_kit(Box::new(CaiStall));
        k.open_cai(1);
        k.completion(1, "r1", json!({ "window": window }))
            .expect("accepted");
        let c = k.m.view_mut().conns.get_mut(&ConnId(1)).expect("conn");
        let r = c.cai.as_mut().and_then(|a| a.requests.get_mut("r1"));
        r.expect("in flight").chunks = 1;
        timer_at(&mut k, ms);
        k
    }

    #[test]
    fn a_request_ended_for_a_window_with_room_is_caught() {
        let mut k = one_chunk_sent(2, 300_000);
        let e = k.send(1, stalled("r1")).expect_err("one chunk of two");
        assert!(e.detail.contains("had room"), "{}", e.detail);
    }

    #[test]
    fn a_request_ended_for_its_window_before_the_pause_timeout_is_caught() {
        let mut k = one_chunk_sent(1, 1_000);
        let e = k.send(1, stalled("r1")).expect_err("one second in");
        assert_eq!(e.invariant, "cai_stall");

        let mut k = one_chunk_sent(1, 300_000);
        k.send(1, stalled("r1")).expect("the pause timeout passed");

        // An engine failure may end a request at any time.
        let mut k = one_chunk_sent(1, 1_000);
        k.send(
            1,
            json!({"type": "ERROR", "requestId": "r1",
                   "error": {"code": "GENERATION_FAILED", "message": "the engine failed"}}),
        )
        .expect("not a stall");
    }
}
