//! `session_replies`: a `session` connection's messages are answered one at
//! a time, in order, each with what the contract allows for it, and only
//! while that connection's frames are being handled. A start's job is
//! verified only when its model, its `public_key` (one that parses, or none
//! unless signatures are required), its `last_message_index` and its session
//! id allow it (an id the Host holds gets `session_exists`); its
//! `session_ready` comes only after the verifier accepted the job; a refused
//! job is `invalid_request`. A prompt for a session the connection does not
//! hold is `unknown_session`, one while a reply streams `invalid_request`;
//! `session_end` is `session_ended` for a live session and
//! `unknown_session` otherwise; a message that does not decode is
//! `invalid_request`. Errors name the message's session.

use tokenwire_core::{ConnId, Dialect, Output};

use super::view::{code, Msg, MsgKind, SessionConnView, Stage};
use crate::invariants::clip;
use crate::invariants::view::View;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionReplies;

/// Why `model` may not be served: it names another model.
fn wrong_model(cx: &Cx<'_>, model: &Option<String>) -> bool {
    model.as_deref().is_some_and(|m| m != cx.model.name)
}

/// The error a start at `Sent` must get, if it must get one: the model,
/// then `last_message_index`, then the id.
fn start_refusal(cx: &Cx<'_>, view: &View, conn: ConnId, m: &MsgKind) -> Option<&'static str> {
    let MsgKind::Start {
        sid,
        context,
        last_index,
        model,
        public_key,
        ..
    } = m
    else {
        return None;
    };
    if wrong_model(cx, model) {
        return Some("invalid_request");
    }
    // A key that is not one, or none where the server requires signatures.
    let unusable_key = public_key
        .as_deref()
        .is_some_and(|k| super::signatures::reference_key(k).is_none());
    if unusable_key || (public_key.is_none() && cx.config.require_signatures) {
        return Some("invalid_request");
    }
    if let Some(last) = last_index {
        if (context.len() as u64).checked_sub(1) != Some(*last) {
            return Some("message_index_mismatch");
        }
    }
    // Past the connection's own bound it is `rate_limited` (the default
    // below); otherwise a context over the bytes bound is refused before
    // the session is claimed.
    if let Some(s) = view.session(&conn) {
        let at_bound = s.live.len() >= cx.config.max_sessions_per_conn && !s.live.contains_key(sid);
        let bytes: usize = context.iter().map(|m| m.content.len()).sum();
        if !at_bound && bytes > cx.config.session_max_context_bytes {
            return Some("invalid_request");
        }
    }
    // Without keys each connection is its own principal: only its own
    // sessions collide (another's id is invisible to it).
    if view
        .sessions_held()
        .iter()
        .any(|(s, c)| s == sid && *c == conn)
    {
        return Some("session_exists");
    }
    None
}

fn judge(cx: &Cx<'_>, conn: ConnId, s: &SessionConnView, m: &Msg, f: &Frame) -> Result<(), String> {
    let kind = f.kind();
    if matches!(m.stage, Stage::Verifying(_) | Stage::Tokenizing(_)) {
        return Err(format!(
            "{kind} answers a {:?} message still waiting ({:?})",
            m.kind.sid(),
            m.stage
        ));
    }
    if f.str("session_id") != m.kind.sid() {
        return Err(format!(
            "{kind} names session {:?}, the message answered names {:?}",
            f.str("session_id"),
            m.kind.sid()
        ));
    }
    let c = code(f);
    match (&m.kind, kind) {
        (MsgKind::Start { context, .. }, "session_ready") => {
            let verified = match m.stage {
                Stage::Verified => context.is_empty() && m.accepted == Some(true),
                Stage::Tokenized => m.accepted == Some(true),
                _ => false,
            };
            if !verified {
                return Err(format!(
                    "session_ready for a start whose job was not accepted ({:?}, {} context messages)",
                    m.stage,
                    context.len()
                ));
            }
            Ok(())
        }
        (MsgKind::Start { .. }, "error") => {
            let want: Vec<&str> = match m.stage {
                Stage::Sent => {
                    vec![start_refusal(cx, cx.view, conn, &m.kind).unwrap_or("rate_limited")]
                }
                Stage::Verified if m.accepted == Some(false) => vec!["invalid_request"],
                Stage::Tokenized => vec!["context_length_exceeded", "invalid_request"],
                _ => Vec::new(),
            };
            if want.contains(&c) {
                Ok(())
            } else {
                Err(format!(
                    "a start ({:?}, verdict {:?}) got {c}, expected one of {want:?}",
                    m.stage, m.accepted
                ))
            }
        }
        (MsgKind::Prompt { sid, .. }, "error") => {
            let live = s.live.get(sid.as_str());
            let want: &[&str] = match (m.stage, live) {
                (Stage::Tokenized, _) => {
                    return if SessionConnView::refuses_tokenized_prompt(f, sid) {
                        Ok(())
                    } else {
                        Err(format!("a prompt whose tokens are back got {c}"))
                    };
                }
                (_, None) => &["unknown_session"],
                (_, Some(l)) if l.turn.is_some() => &["invalid_request"],
                _ => &[
                    "message_index_mismatch",
                    "invalid_request",
                    "token_budget_exhausted",
                ],
            };
            if want.contains(&c) {
                Ok(())
            } else {
                Err(format!(
                    "a prompt for {sid:?} got {c}, expected one of {want:?}"
                ))
            }
        }
        (MsgKind::End { sid }, "session_ended") if s.live.contains_key(sid) => Ok(()),
        (MsgKind::End { sid }, "error") if !s.live.contains_key(sid) && c == "unknown_session" => {
            Ok(())
        }
        (MsgKind::End { sid }, k) => Err(format!(
            "session_end for {sid:?} (live here: {}) got {k} {c}",
            s.live.contains_key(sid)
        )),
        (MsgKind::Other { .. }, "error") if c == "invalid_request" => Ok(()),
        (k, got) => Err(format!("{got} {c} does not answer {k:?}")),
    }
}

impl Checker for SessionReplies {
    fn name(&self) -> &'static str {
        "session_replies"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::VerifyJob(check) => {
                let Some(s) = cx.view.session(&check.conn) else {
                    return Ok(());
                };
                let Some(m) = s.next_handled().filter(|m| m.stage == Stage::Sent) else {
                    return Err(format!(
                        "job check for {:?} with no start to handle",
                        check.conn
                    ));
                };
                if !matches!(m.kind, MsgKind::Start { .. }) {
                    return Err(format!(
                        "job check for {:?} to answer {:?}",
                        check.conn, m.kind
                    ));
                }
                if let Some(code) = start_refusal(cx, cx.view, check.conn, &m.kind) {
                    return Err(format!(
                        "the start of {:?} on {:?} went to the job verifier, but it calls for {code}",
                        m.kind.sid(),
                        check.conn
                    ));
                }
                Ok(())
            }
            Output::Tokenize(job) => {
                let Some(s) = cx.view.session(&job.conn) else {
                    return Ok(());
                };
                match s.next_handled() {
                    Some(Msg {
                        kind: MsgKind::Start { .. },
                        stage: Stage::Verified,
                        accepted: Some(true),
                        ..
                    })
                    | Some(Msg {
                        kind: MsgKind::Prompt { .. },
                        stage: Stage::Sent,
                        ..
                    }) => Ok(()),
                    other => Err(format!(
                        "text job for {:?} with no accepted start or new prompt to handle ({other:?})",
                        job.conn
                    )),
                }
            }
            Output::Send { conn, text } => {
                let (Some(f), Some(c)) = (frame, cx.view.conns.get(conn)) else {
                    return Ok(());
                };
                if c.dialect != Dialect::Session {
                    return Ok(());
                }
                let Some(s) = c.session.as_ref() else {
                    return Ok(());
                };
                if s.is_turn_frame(f) {
                    return Ok(());
                }
                if !cx.view.handles(*conn) {
                    return Err(format!(
                        "{} sent to {conn:?} while none of its messages is handled: {}",
                        f.kind(),
                        clip(text)
                    ));
                }
                let Some(m) = s.answered_by(f) else {
                    return Err(format!(
                        "{} sent to {conn:?}, which has no message to answer: {}",
                        f.kind(),
                        clip(text)
                    ));
                };
                judge(cx, *conn, s, m, f).map_err(|e| format!("{e} on {conn:?}: {}", clip(text)))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use crate::invariants::testkit::Kit;
    use serde_json::{json, Value};
    use tokenwire_core::{ConnId, Input, JobCheck, JobCheckId, JobGrant};

    fn err(sid: Value, code: &str) -> Value {
        json!({"type": "error", "session_id": sid, "code": code, "message": "m",
               "recoverable": true, "timestamp": 0})
    }

    fn verify(k: &mut Kit, id: u64) -> Result<(), crate::invariants::Violation> {
        k.out(Output::VerifyJob(JobCheck {
            id: JobCheckId(id),
            conn: ConnId(1),
            dialect: Dialect::Session,
            job_id: "j".into(),
            public_key: None,
        }))
    }

    fn started(k: &mut Kit) {
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j"}),
        )
        .expect("frame");
        k.job_verified(1, "j", JobGrant::default());
        k.send(1, ready()).expect("ready after an accepted verdict");
        k.end().expect("end");
    }

    fn ready() -> Value {
        json!({"type": "session_ready", "session_id": "s", "message_count": 0,
               "context_tokens": 0, "truncated_messages": 0, "timestamp": 0})
    }

    #[test]
    fn a_session_ready_before_the_verdict_is_caught() {
        let mut k = kit(Box::new(SessionReplies));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j"}),
        )
        .expect("frame");
        let e = k.send(1, ready()).expect_err("not verified");
        assert_eq!(e.invariant, "session_replies");
    }

    #[test]
    fn a_reply_while_the_start_waits_is_caught() {
        let mut k = kit(Box::new(SessionReplies));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j"}),
        )
        .expect("frame");
        verify(&mut k, 1).expect("check");
        k.end().expect("end");
        k.input(Input::Timeout).expect("input");
        let e = k
            .send(1, err(json!("s"), "rate_limited"))
            .expect_err("spontaneous");
        assert!(e.detail.contains("none of its messages"), "{}", e.detail);
    }

    #[test]
    fn wrong_codes_are_caught() {
        let mut k = kit(Box::new(SessionReplies));
        started(&mut k);
        k.text(
            1,
            json!({"type": "prompt", "session_id": "t", "content": "x", "message_index": 0}),
        )
        .expect("frame");
        let e = k
            .send(1, err(json!("t"), "invalid_request"))
            .expect_err("wrong code");
        assert!(e.detail.contains("unknown_session"), "{}", e.detail);
        k.end().expect("end");
        k.text(1, json!({"type": "session_end", "session_id": "s"}))
            .expect("frame");
        let e = k
            .send(1, err(json!("s"), "unknown_session"))
            .expect_err("it is live");
        assert_eq!(e.invariant, "session_replies");
    }

    #[test]
    fn a_held_session_sent_to_the_verifier_is_caught() {
        let mut k = kit(Box::new(SessionReplies));
        started(&mut k);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j"}),
        )
        .expect("frame");
        let e = verify(&mut k, 2).expect_err("session_exists due");
        assert!(e.detail.contains("session_exists"), "{}", e.detail);
    }
}
