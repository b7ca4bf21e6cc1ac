//! `cai_conversations`: a request that continues a conversation (a
//! `conversationId` and no `context`) is prompted with exactly what the
//! store keeps of it, by a reference model of the store (PROTOCOLS.md,
//! `cai`): per (organisation, `conversationId`), the messages of the
//! request that last ended in it (its context or the conversation it
//! continued, its prompt, and the reply: `STREAM_COMPLETE`'s full content
//! or `INTERRUPTED_ACK`'s partial one), the oldest non-system messages
//! dropped past `conversation_max_messages` and past
//! `conversation_max_bytes` (nothing
//! kept when its system messages alone are over it), kept for
//! `conversation_ttl` after it was stored, at most
//! `max_conversations_per_org` per organisation (the organisation's least
//! recently stored goes) and `max_conversations` in all (the least recently
//! stored goes). Reading one does not make it more recent. A crash forgets
//! them all.
//!
//! The prompt a request is tokenized with is its conversation and then its
//! own message, so a continued conversation the store forgot is its
//! message alone.

use std::collections::BTreeMap;

use tokenwire_core::{ChatMessage, ConnId, Instant, Output, Role, TextWork};

use super::view::{Expect, Msg};
use crate::invariants::{Check, Checker, Cx, Frame};

/// One kept conversation.
#[derive(Debug, Clone, PartialEq)]
struct Kept {
    org: String,
    id: String,
    messages: Vec<ChatMessage>,
    expires: Instant,
}

/// The reference store: least recently stored first.
#[derive(Debug, Default)]
struct Store {
    kept: Vec<Kept>,
}

/// Drops the oldest non-system messages past the count and byte bounds;
/// false when the system messages alone are over `max_bytes`.
fn trim(messages: &mut Vec<ChatMessage>, max_messages: usize, max_bytes: usize) -> bool {
    loop {
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if messages.len() <= max_messages && bytes <= max_bytes {
            return true;
        }
        match messages.iter().position(|m| m.role != Role::System) {
            Some(i) => {
                messages.remove(i);
            }
            None => return bytes <= max_bytes,
        }
    }
}

impl Store {
    fn expire(&mut self, now: Instant) {
        self.kept.retain(|k| k.expires > now);
    }

    fn get(&mut self, now: Instant, org: &str, id: &str) -> Vec<ChatMessage> {
        self.expire(now);
        self.kept
            .iter()
            .find(|k| k.org == org && k.id == id)
            .map(|k| k.messages.clone())
            .unwrap_or_default()
    }

    fn put(&mut self, cx: &Cx<'_>, org: &str, id: &str, mut messages: Vec<ChatMessage>) {
        self.expire(cx.now);
        self.kept.retain(|k| !(k.org == org && k.id == id));
        let (max_messages, max_bytes) = (
            cx.config.conversation_max_messages,
            cx.config.conversation_max_bytes,
        );
        if !trim(&mut messages, max_messages, max_bytes) {
            return;
        }
        let of_org = self.kept.iter().filter(|k| k.org == org).count();
        if of_org >= cx.config.max_conversations_per_org.max(1) {
            if let Some(i) = self.kept.iter().position(|k| k.org == org) {
                self.kept.remove(i);
            }
        }
        while self.kept.len() >= cx.config.max_conversations.max(1) {
            self.kept.remove(0);
        }
        self.kept.push(Kept {
            org: org.to_string(),
            id: id.to_string(),
            messages,
            expires: cx.now + cx.config.conversation_ttl,
        });
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiConversations {
    store: Store,
    /// Requests in a conversation, by connection and `requestId`: the
    /// organisation, the conversation and the messages it was prompted with.
    requests: BTreeMap<(ConnId, String), (String, String, Vec<ChatMessage>)>,
}

/// The organisation `conn` acts for, if it was let in.
fn org_of(cx: &Cx<'_>, conn: ConnId) -> Option<String> {
    cx.view
        .cai(&conn)
        .and_then(|c| c.auth.as_ref().ok())
        .map(|a| a.org.clone())
}

impl CaiConversations {
    fn on_tokenize(&mut self, cx: &Cx<'_>, conn: ConnId, work: &TextWork) -> Check {
        let Some(Expect::Completion {
            msg:
                Msg::Completion {
                    rid,
                    conversation,
                    continues,
                    ..
                },
            ..
        }) = cx.view.cai(&conn).and_then(|c| c.cur.as_ref())
        else {
            return Ok(());
        };
        let TextWork::Chat { messages, .. } = work else {
            return Err(format!(
                "COMPLETION {rid:?} on {conn:?} was tokenized as a raw prompt"
            ));
        };
        self.requests.remove(&(conn, rid.clone()));
        let (Some(id), Some(org)) = (conversation, org_of(cx, conn)) else {
            return Ok(());
        };
        if *continues {
            let want = self.store.get(cx.now, &org, id);
            let got = &messages[..messages.len().saturating_sub(1)];
            if got != want.as_slice() {
                return Err(format!(
                    "COMPLETION {rid:?} on {conn:?} continues {org}/{id} with {} messages ({} bytes) before its own; the store keeps {} ({} bytes)",
                    got.len(),
                    got.iter().map(|m| m.content.len()).sum::<usize>(),
                    want.len(),
                    want.iter().map(|m| m.content.len()).sum::<usize>(),
                ));
            }
        }
        self.requests
            .insert((conn, rid.clone()), (org, id.clone(), messages.clone()));
        Ok(())
    }
}

impl Checker for CaiConversations {
    fn name(&self) -> &'static str {
        "cai_conversations"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Tokenize(job), _) => self.on_tokenize(cx, job.conn, &job.work),
            (Output::Send { conn, .. }, Some(f)) => {
                let reply = match f.kind() {
                    "STREAM_COMPLETE" => f.v["payload"]["fullContent"].as_str(),
                    "INTERRUPTED_ACK" => f.v["payload"]["partialContent"].as_str(),
                    _ => None,
                };
                let (Some(reply), Some(rid)) = (reply, f.str("requestId")) else {
                    return Ok(());
                };
                if let Some((org, id, mut messages)) =
                    self.requests.remove(&(*conn, rid.to_string()))
                {
                    messages.push(ChatMessage::new(Role::Assistant, reply.to_string()));
                    self.store.put(cx, &org, &id, messages);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_crash(&mut self) {
        self.store = Store::default();
        self.requests.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{cai_kit, Kit};
    use serde_json::json;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{TextJob, TextJobId};

    fn tokenize(k: &mut Kit, messages: Vec<ChatMessage>) -> Check {
        k.jobs += 1;
        let job = TextJob {
            id: TextJobId(k.jobs),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages,
                max_messages: usize::MAX,
                max_tokens: 100,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        };
        k.out(Output::Tokenize(job)).map_err(|v| v.detail)
    }

    /// A conversation `v` kept from request `a` (its system message, its
    /// prompt, its reply `ok`), then request `b` continuing it.
    fn kept_then_continued(k: &mut Kit) {
        k.open_cai(1);
        k.text(
            1,
            json!({"type": "COMPLETION", "requestId": "a",
                         "payload": {"prompt": "<c1>hi", "conversationId": "v",
                                     "context": [{"role": "system", "content": "<c1>"}]}}),
        )
        .expect("a");
        tokenize(
            k,
            vec![msg(Role::System, "<c1>"), msg(Role::User, "<c1>hi")],
        )
        .expect("a's prompt");
        k.end().expect("end");
        k.tokenized(1).expect("a's tokens");
        k.end().expect("end");
        k.send(
            1,
            json!({"type": "STREAM_COMPLETE", "requestId": "a",
                         "payload": {"fullContent": "ok", "model": "tiny", "finishReason": "stop",
                                     "usage": {"promptTokens": 3, "completionTokens": 1}}}),
        )
        .expect("a completes");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "COMPLETION", "requestId": "b",
                         "payload": {"prompt": "<c1>more", "conversationId": "v"}}),
        )
        .expect("b");
    }

    #[test]
    fn a_continued_conversation_prompted_with_what_the_store_keeps_passes() {
        let mut k = cai_kit(Box::new(CaiConversations::default()));
        kept_then_continued(&mut k);
        tokenize(
            &mut k,
            vec![
                msg(Role::System, "<c1>"),
                msg(Role::User, "<c1>hi"),
                msg(Role::Assistant, "ok"),
                msg(Role::User, "<c1>more"),
            ],
        )
        .expect("the kept conversation, then b's prompt");
    }

    /// Fabricated violations: the conversation forgotten, or its system
    /// message dropped.
    #[test]
    fn a_continued_conversation_prompted_otherwise_is_caught() {
        let mut k = cai_kit(Box::new(CaiConversations::default()));
        kept_then_continued(&mut k);
        let e = tokenize(&mut k, vec![msg(Role::User, "<c1>more")]).expect_err("forgotten");
        assert!(e.contains("the store keeps 3"), "{e}");

        let mut k = cai_kit(Box::new(CaiConversations::default()));
        kept_then_continued(&mut k);
        let e = tokenize(
            &mut k,
            vec![
                msg(Role::User, "<c1>hi"),
                msg(Role::Assistant, "ok"),
                msg(Role::User, "<c1>more"),
            ],
        )
        .expect_err("its system message dropped");
        assert!(e.contains("with 2 messages"), "{e}");
    }

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    #[test]
    fn trimming_drops_the_oldest_non_system_messages_first() {
        let mut m = vec![
            msg(Role::System, "sys"),
            msg(Role::User, "aaaa"),
            msg(Role::Assistant, "bb"),
            msg(Role::User, "c"),
        ];
        let mut six = m.clone();
        assert!(trim(&mut six, 256, 6));
        assert_eq!(
            six,
            vec![
                msg(Role::System, "sys"),
                msg(Role::Assistant, "bb"),
                msg(Role::User, "c")
            ]
        );
        let mut three = m.clone();
        assert!(trim(&mut three, 3, 1 << 20));
        assert_eq!(
            three,
            vec![
                msg(Role::System, "sys"),
                msg(Role::Assistant, "bb"),
                msg(Role::User, "c")
            ],
            "past the count bound too"
        );
        assert!(trim(&mut m, 256, 5));
        assert_eq!(m, vec![msg(Role::System, "sys"), msg(Role::User, "c")]);
        let mut m = vec![msg(Role::System, "long system"), msg(Role::User, "a")];
        assert!(!trim(&mut m, 256, 4), "the system message alone is over");
    }
}
