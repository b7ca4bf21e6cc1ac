//! `session_start_fields`: `last_message_index` is what a `session_resume`
//! must carry and a `session_init` need not (PROTOCOLS.md): an init is
//! never refused for it. And a start whose `job_id` is a non-empty string
//! or an integer (of either sign, any size JSON gives) is never refused
//! for its `job_id`, and one with any other `job_id`, or none, never
//! starts a session. The message's type and job id are read from the
//! frame, not through the dialect's decoder, which is what this judges.

use serde_json::Value;
use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionStartFields;

impl Checker for SessionStartFields {
    fn name(&self) -> &'static str {
        "session_start_fields"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let message = f.v["message"].as_str().unwrap_or("");
        let head = cx.view.session(conn).and_then(|s| s.head());
        // The message answered, when it was a start.
        let start = head.filter(|m| {
            matches!(
                m.raw_type.as_deref(),
                Some("session_init" | "session_resume")
            )
        });
        if f.kind() == "session_ready" {
            if let Some(m) = start.filter(|m| !valid_job(m.raw_job.as_ref())) {
                return Err(format!(
                    "a start on {conn:?} with job_id {:?} started a session",
                    m.raw_job
                ));
            }
            return Ok(());
        }
        if f.kind() != "error" {
            return Ok(());
        }
        let valid_start = start.is_some_and(|m| valid_job(m.raw_job.as_ref()));
        // The decoder's refusals of the field itself (the verifier's
        // refusal of a job names the field too, for another reason).
        let for_the_field = ["`job_id`: must", "`job_id`: is required"]
            .iter()
            .any(|m| message.contains(m));
        if valid_start && for_the_field {
            return Err(format!(
                "a start on {conn:?} with a valid job_id was refused for it: {message}"
            ));
        }
        if !message.contains("last_message_index") {
            return Ok(());
        }
        let init = head.is_some_and(|m| m.raw_type.as_deref() == Some("session_init"));
        if init {
            return Err(format!(
                "a session_init on {conn:?} was refused for last_message_index: {message}"
            ));
        }
        Ok(())
    }
}

/// A `job_id` as PROTOCOLS.md allows it: a non-empty string or an integer.
fn valid_job(job: Option<&Value>) -> bool {
    match job {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Dialect;

    fn refused() -> serde_json::Value {
        json!({"type": "error", "code": "invalid_request",
               "message": "invalid `last_message_index`: is required",
               "recoverable": true, "timestamp": 1})
    }

    #[test]
    fn an_init_refused_for_last_message_index_is_caught() {
        let mut k = kit(Box::new(SessionStartFields));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        let e = k.send(1, refused()).expect_err("an init needs no index");
        assert_eq!(e.invariant, "session_start_fields");
        // A resume without it is refused as it must be.
        let mut k = kit(Box::new(SessionStartFields));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_resume", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("resume");
        k.send(1, refused()).expect("a resume needs one");
    }

    /// A fabricated violation: a negative integer job id refused.
    #[test]
    fn a_start_refused_for_a_valid_job_id_is_caught() {
        let refusal = json!({"type": "error", "code": "invalid_request",
                             "message": "invalid `job_id`: must be a non-empty string or an integer, got number",
                             "recoverable": true, "timestamp": 1});
        for (job, ok) in [
            (json!(-7), false),
            (json!(18_446_744_073_709_551_615u64), false),
            (json!("j"), false),
            (json!(""), true),
            (json!(1.5), true),
        ] {
            let mut k = kit(Box::new(SessionStartFields));
            k.open_as(1, Dialect::Session);
            k.text(
                1,
                json!({"type": "session_init", "session_id": "s", "job_id": job,
                       "conversation_context": []}),
            )
            .expect("init");
            let got = k.send(1, refusal.clone());
            assert_eq!(got.is_ok(), ok, "{job}: {got:?}");
        }
    }

    /// A fabricated violation: a start with an empty job id answered with
    /// a session.
    #[test]
    fn a_session_started_by_an_invalid_job_id_is_caught() {
        let ready = json!({"type": "session_ready", "session_id": "s", "message_count": 0,
                           "context_tokens": 0, "messages_dropped": 0, "timestamp": 1});
        for (job, bad) in [
            (Some(json!("")), true),
            (Some(json!(1.5)), true),
            (Some(Value::Null), true),
            (None, true),
            (Some(json!("j")), false),
            (Some(json!(-3)), false),
        ] {
            let mut k = kit(Box::new(SessionStartFields));
            k.open_as(1, Dialect::Session);
            let mut init = json!({"type": "session_init", "session_id": "s",
                                  "conversation_context": []});
            if let Some(job) = &job {
                init["job_id"] = job.clone();
            }
            k.text(1, init).expect("init");
            let r = k.send(1, ready.clone());
            assert_eq!(r.is_err(), bad, "{job:?}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.invariant, "session_start_fields");
            }
        }
    }
}
