//! `session_history`: the Host holds exactly the conversation the client
//! handed over, so a session started or resumed (on a Host rebuilt after a
//! crash too) continues from the client's history. A start's context goes
//! to the tokenizer as sent; `session_ready` counts its user and assistant
//! messages (`message_count`) and reports the tokens and the messages left
//! out as the tokenizer fitted it; each prompt is built from that context,
//! then every turn's user message and `response`, then the new message,
//! within the window the prompt's `max_tokens` leaves and the Host's
//! `session_max_messages`.

use tokenwire_core::{ChatMessage, Dialect, Output, Role, TextWork};

use super::view::{count_of, Msg, MsgKind, Stage};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionHistory;

/// A start's context is fitted to the whole window less one reply token.
fn default_budget(cx: &Cx<'_>) -> u32 {
    cx.model.context_len.saturating_sub(1)
}

fn summary(m: &[ChatMessage]) -> String {
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    format!("{} messages ({})", m.len(), roles.join(","))
}

fn check_job(
    cx: &Cx<'_>,
    work: &TextWork,
    want: &[ChatMessage],
    budget: u32,
    what: &str,
) -> Result<(), String> {
    let TextWork::Chat {
        messages,
        max_messages,
        max_tokens,
        ..
    } = work
    else {
        return Err(format!("{what} is tokenized as a raw prompt"));
    };
    if messages != want {
        return Err(format!(
            "{what} is built from {}, the conversation is {}",
            summary(messages),
            summary(want)
        ));
    }
    if *max_messages != cx.config.session_max_messages || *max_tokens != budget {
        return Err(format!(
            "{what} is fitted to {max_messages} messages and {max_tokens} tokens, expected {} and {budget}",
            cx.config.session_max_messages
        ));
    }
    Ok(())
}

impl Checker for SessionHistory {
    fn name(&self) -> &'static str {
        "session_history"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::Tokenize(job) => {
                let Some(s) = cx.view.session(&job.conn) else {
                    return Ok(());
                };
                match s.next_handled() {
                    Some(Msg {
                        kind: MsgKind::Start { sid, context, .. },
                        stage: Stage::Verified,
                        ..
                    }) => check_job(
                        cx,
                        &job.work,
                        context,
                        default_budget(cx),
                        &format!("the context of {sid:?} on {:?}", job.conn),
                    ),
                    Some(Msg {
                        kind:
                            MsgKind::Prompt {
                                sid,
                                content,
                                max_tokens,
                                ..
                            },
                        stage: Stage::Sent,
                        ..
                    }) => {
                        let Some(l) = s.live.get(sid) else {
                            return Ok(());
                        };
                        let mut want = l.history.clone();
                        want.push(ChatMessage::new(Role::User, content.clone()));
                        let ctx = cx.model.context_len;
                        let max = max_tokens.map_or(cx.config.default_max_tokens.min(ctx), |m| {
                            u32::try_from(m).unwrap_or(u32::MAX)
                        });
                        check_job(
                            cx,
                            &job.work,
                            &want,
                            ctx.saturating_sub(max),
                            &format!("the prompt of {sid:?} on {:?}", job.conn),
                        )
                    }
                    _ => Ok(()),
                }
            }
            Output::Send { conn, text } => {
                let (Some(f), Some(c)) = (frame, cx.view.conns.get(conn)) else {
                    return Ok(());
                };
                if c.dialect != Dialect::Session || f.kind() != "session_ready" {
                    return Ok(());
                }
                let Some(s) = c.session.as_ref() else {
                    return Ok(());
                };
                let Some(Msg {
                    kind: MsgKind::Start { context, .. },
                    fitted,
                    ..
                }) = s.answered_by(f)
                else {
                    return Ok(());
                };
                let count = count_of(context);
                let fitted = if context.is_empty() {
                    Some((0, 0))
                } else {
                    *fitted
                };
                let got = (
                    f.v["message_count"].as_u64(),
                    f.v["context_tokens"].as_u64(),
                    f.v["truncated_messages"].as_u64(),
                );
                let want = (
                    Some(count),
                    fitted.map(|(t, _)| u64::from(t)),
                    fitted.map(|(_, d)| u64::from(d)),
                );
                if got != want {
                    return Err(format!(
                        "session_ready on {conn:?} reports (messages, tokens, left out) {got:?}, the context handed over gives {want:?}: {}",
                        clip(text)
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{kit, Kit};
    use serde_json::json;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{ConnId, Encoded, Input, JobGrant, TextDone, TextJob, TextJobId};

    fn msg(role: Role, c: &str) -> ChatMessage {
        ChatMessage::new(role, c)
    }

    /// Resumes `s` with a system message and two turns; returns the context.
    fn resume(k: &mut Kit) -> Vec<ChatMessage> {
        let context = vec![
            msg(Role::System, "<c1>"),
            msg(Role::User, "a"),
            msg(Role::Assistant, "b"),
        ];
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_resume", "session_id": "s", "job_id": "j",
                         "last_message_index": 2,
                         "conversation_context": [{"role": "system", "content": "<c1>"},
                                                  {"role": "user", "content": "a"},
                                                  {"role": "assistant", "content": "b"}]}),
        )
        .expect("frame");
        k.job_verified(1, "j", JobGrant::default());
        context
    }

    fn job(messages: Vec<ChatMessage>, max_tokens: u32) -> Output {
        Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages,
                max_messages: 20,
                max_tokens,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        })
    }

    #[test]
    fn a_context_that_is_not_the_clients_is_caught() {
        let mut k = kit(Box::new(SessionHistory));
        let mut context = resume(&mut k);
        context.remove(1);
        // tiny model: context 512; a start is fitted to 511 tokens.
        let e = k.out(job(context, 511)).expect_err("a message lost");
        assert_eq!(e.invariant, "session_history");
    }

    #[test]
    fn a_ready_that_miscounts_the_history_is_caught() {
        let mut k = kit(Box::new(SessionHistory));
        let context = resume(&mut k);
        k.out(job(context, 511)).expect("the client's context");
        k.end().expect("end");
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(1),
            result: Ok(Encoded {
                ids: vec![1; 9],
                dropped: 0,
            }),
        }))
        .expect("tokens");
        let ready = |n: u64| {
            json!({"type": "session_ready", "session_id": "s", "message_count": n,
                                     "context_tokens": 9, "truncated_messages": 0, "timestamp": 0})
        };
        let e = k.send(1, ready(3)).expect_err("the system message counted");
        assert_eq!(e.invariant, "session_history");
    }
}
