//! The dialect seam as a dialect of one's own sees it: a probe machine,
//! served through `Host::set_machines`, reports every hook the Host calls as
//! a frame, so each hook's timing is checked against the Host's behaviour:
//! refusal at open, admission, the end of each step, timers, hold reasons as
//! a set, and the one route of a generation's last piece.

use tokenwire_core::dialect::{Cx, DialectConn, Failure, Refusal};
use tokenwire_core::engine::SeqId;
use tokenwire_core::gen::{FinishReason, GenRequest, KeptKv, TokenPiece};
use tokenwire_core::params::GenParams;
use tokenwire_core::testing::Harness;
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig, Input, Transport};

#[derive(Default)]
struct Probe {
    gen: Option<SeqId>,
    kept: Option<KeptKv>,
}

impl Probe {
    fn say(cx: &mut Cx<'_>, what: String) {
        cx.send_text(format!("\"{what}\""));
    }
}

impl DialectConn for Probe {
    fn on_open(&mut self, cx: &mut Cx<'_>, query: &str, _peer: &str) -> Result<(), Refusal> {
        if query == "refuse" {
            Self::say(cx, "refused".into());
            return Err(Refusal {
                code: 4000,
                reason: "nope".into(),
            });
        }
        let at = cx.now + Duration::from_secs(1);
        cx.set_timer(2, at);
        Ok(())
    }

    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        match text {
            "start" => {
                let prompt_ids = cx.codec().encode("ab", true).expect("encode");
                let req = GenRequest {
                    prompt_ids,
                    params: GenParams::defaults(6),
                    logprobs: None,
                    raw: false,
                    reuse_kv: None,
                    constraint: None,
                    embed: None,
                    prompt_logprobs: None,
                    part: Default::default(),
                };
                self.gen = cx.start(req).ok();
                Self::say(cx, "started".into());
            }
            "start_oov" => {
                let vocab = cx.model().vocab_size;
                let req = GenRequest {
                    prompt_ids: vec![1, vocab],
                    params: GenParams::defaults(2),
                    logprobs: None,
                    raw: false,
                    reuse_kv: None,
                    constraint: None,
                    embed: None,
                    prompt_logprobs: None,
                    part: Default::default(),
                };
                match cx.start(req) {
                    Ok(_) => Self::say(cx, "started".into()),
                    Err(e) => Self::say(cx, format!("refused: {}", e.message("max_tokens"))),
                }
            }
            "close_window" => {
                let id = self.gen.expect("running");
                cx.close_window(id);
            }
            "open_window" => {
                let id = self.gen.expect("running");
                cx.open_window(id);
            }
            "end" => {
                let id = self.gen.expect("running");
                cx.end(id, FinishReason::Cancelled);
                // The last piece comes after this callback, not inside it.
                Self::say(cx, "end asked".into());
            }
            "keep" => {
                let id = self.gen.expect("running");
                self.kept = cx.keep_kv(id);
            }
            "end_stop" => {
                let id = self.gen.expect("running");
                cx.end(id, FinishReason::Stop);
            }
            "timers" => {
                // Tags far apart: each is its own timer.
                for (tag, ms) in [(0u8, 10u64), (4, 20), (200, 30)] {
                    let at = cx.now + Duration::from_millis(ms);
                    cx.set_timer(tag, at);
                }
            }
            _ => {}
        }
    }

    fn on_binary(&mut self, _cx: &mut Cx<'_>, _len: usize) {}

    fn on_token(&mut self, cx: &mut Cx<'_>, _id: SeqId, piece: &TokenPiece) {
        match piece.finish {
            Some(r) => {
                self.gen = None;
                Self::say(cx, format!("last:{}", r.as_str()));
            }
            None => Self::say(cx, "token".into()),
        }
    }

    fn on_failed(&mut self, _cx: &mut Cx<'_>, _id: SeqId, _failure: &Failure) {}

    fn on_queued(&mut self, _cx: &mut Cx<'_>, _id: SeqId, _position: u32) {}

    fn on_admitted(&mut self, cx: &mut Cx<'_>, _id: SeqId) {
        Self::say(cx, "admitted".into());
    }

    fn on_step_end(&mut self, cx: &mut Cx<'_>) {
        Self::say(cx, "step_end".into());
    }

    fn on_timer(&mut self, cx: &mut Cx<'_>, tag: u8) {
        Self::say(cx, format!("timer:{tag}"));
    }

    fn on_model_loading(&mut self, _cx: &mut Cx<'_>, _p: f32, _m: &str, _eta: Option<Duration>) {}

    fn busy(&self) -> bool {
        self.gen.is_some()
    }
}

fn probes(_d: Dialect) -> Option<Box<dyn DialectConn>> {
    Some(Box::new(Probe::default()))
}

fn harness() -> Harness {
    let mut h = Harness::new(HostConfig::default(), "xyz", 1);
    h.host.set_machines(probes);
    h
}

fn said(h: &Harness, c: ConnId) -> Vec<String> {
    h.received(c)
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_refusal_at_open_closes_with_its_code_after_what_was_sent() {
    let mut h = harness();
    let c = ConnId(1);
    h.input(Input::Open {
        conn: c,
        dialect: Dialect::Cai,
        transport: Transport::WebSocket,
        query: "refuse".into(),
        authorization: None,
        peer: "p".into(),
    });
    assert_eq!(said(&h, c), ["refused"]);
    assert_eq!(h.closes.get(&c), Some(&(4000, "nope".to_string())));
    assert_eq!(h.host.stats().connections, 0);
}

#[test]
fn admission_comes_once_and_each_step_ends_after_its_tokens() {
    let mut h = harness();
    let c = h.open(1, Dialect::Cai);
    h.send_raw(c, "start");
    assert_eq!(
        said(&h, c),
        ["started", "admitted"],
        "admitted as the step is planned"
    );
    h.run(50);
    let s = said(&h, c);
    assert_eq!(s.iter().filter(|x| *x == "admitted").count(), 1);
    // Every step ends after the tokens it produced: `step_end` follows each
    // `token`, and the step that ended the generation ends too, after its
    // last piece (a dialect that gathers a step's events sends them then).
    let n = s.len();
    assert_eq!(s[n - 2..], ["last:length", "step_end"], "{s:?}");
    let tokens = s.iter().filter(|x| *x == "token").count();
    assert_eq!(tokens, 5, "{s:?}");
    for (i, x) in s.iter().enumerate() {
        if x == "token" {
            assert_eq!(s.get(i + 1).map(String::as_str), Some("step_end"), "{s:?}");
        }
    }
}

#[test]
fn hold_reasons_are_a_set_and_the_last_piece_takes_one_route() {
    let mut h = harness();
    let c = h.open(1, Dialect::Cai);
    h.send_raw(c, "start");
    h.run(2);
    h.send_raw(c, "close_window");
    h.input(Input::QueueFull { conn: c });
    h.run(5);
    let before = said(&h, c).len();
    assert!(h.pending_step.is_none(), "nothing runs while held");
    h.send_raw(c, "open_window");
    h.run(5);
    assert_eq!(said(&h, c).len(), before, "the full queue still holds it");
    assert!(h.pending_step.is_none());
    h.input(Input::QueueDrained { conn: c });
    assert!(h.pending_step.is_some(), "no reason left: it runs again");
    h.step();
    h.send_raw(c, "end");
    let s = said(&h, c);
    let n = s.len();
    assert_eq!(s[n - 2..], ["end asked", "last:cancelled"], "{s:?}");
    h.run(10);
    assert_eq!(said(&h, c).len(), n, "exactly one last piece");
    assert_eq!(h.host.stats().generations, 0);
}

#[test]
fn a_timer_fires_once_and_goes_with_its_connection() {
    let mut h = harness();
    let a = h.open(1, Dialect::Cai);
    let b = h.open(2, Dialect::Cai);
    h.input(Input::Closed { conn: b });
    h.advance(Duration::from_millis(999));
    assert!(said(&h, a).is_empty());
    h.advance(Duration::from_millis(2));
    assert_eq!(said(&h, a), ["timer:2"]);
    h.advance(Duration::from_secs(5));
    assert_eq!(said(&h, a), ["timer:2"], "once");
    assert!(said(&h, b).is_empty());
}

#[test]
fn every_timer_tag_is_its_own_timer_and_all_go_with_the_connection() {
    let mut h = harness();
    let a = h.open(1, Dialect::Cai);
    h.send_raw(a, "timers");
    h.advance(Duration::from_millis(40));
    assert_eq!(said(&h, a), ["timer:0", "timer:4", "timer:200"]);
    let b = h.open(2, Dialect::Cai);
    h.send_raw(b, "timers");
    h.input(Input::Closed { conn: a });
    h.input(Input::Closed { conn: b });
    assert_eq!(
        h.host.poll_timeout(),
        None,
        "no deadline outlives its connection"
    );
}

#[test]
fn a_stale_step_result_or_fault_changes_nothing() {
    let mut h = harness();
    let c = h.open(1, Dialect::Cai);
    h.send_raw(c, "start");
    let real = h.pending_step.clone().expect("a step");
    h.input(Input::StepDone(tokenwire_core::StepDone {
        step_id: real.step_id + 7,
        results: Vec::new(),
    }));
    h.input(Input::EngineFault(tokenwire_core::EngineFault {
        step_id: real.step_id + 7,
        kind: tokenwire_core::EngineFaultKind::Internal("stale".into()),
    }));
    assert_eq!(said(&h, c), ["started", "admitted"], "nothing happened");
    assert_eq!(h.host.stats().generations, 1, "nothing failed");
    h.step();
    let s = said(&h, c);
    assert_eq!(
        s[2..],
        ["token", "step_end"],
        "the real step's owner still hears its end"
    );
    h.run(50);
    assert_eq!(said(&h, c).last().map(String::as_str), Some("step_end"));
    assert!(said(&h, c).contains(&"last:length".to_string()));
}

#[test]
fn blocks_kept_for_a_generation_its_dialect_ends_as_complete_stay_kept() {
    let mut h = harness();
    let c = h.open(1, Dialect::Cai);
    h.send_raw(c, "start");
    h.run(2);
    h.send_raw(c, "keep");
    // Out of the next plans, so the end does not meet an outstanding step.
    h.send_raw(c, "close_window");
    h.run(5);
    assert!(h.pending_step.is_none());
    h.send_raw(c, "end_stop");
    assert!(said(&h, c).contains(&"last:stop".to_string()));
    let st = h.host.stats();
    assert_eq!(st.generations, 0);
    assert!(
        st.kv_blocks_kept > 0,
        "keep_kv's blocks survive a completed ending: {st:?}"
    );
}

#[test]
fn a_prompt_token_past_the_vocabulary_is_refused_before_it_can_fail_a_step() {
    let mut h = harness();
    let other = h.open(1, Dialect::Cai);
    h.send_raw(other, "start");
    let c = h.open(2, Dialect::Cai);
    h.send_raw(c, "start_oov");
    let s = said(&h, c);
    assert_eq!(s.len(), 1);
    assert!(s[0].starts_with("refused: the prompt holds token"), "{s:?}");
    h.run(50);
    assert!(
        said(&h, other).contains(&"last:length".to_string()),
        "the other generation's steps never saw it"
    );
}
