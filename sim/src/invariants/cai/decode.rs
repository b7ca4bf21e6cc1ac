//! `cai_decode`: the dialect reads each client message as the contract
//! says. The view reads messages with the dialect's own decoder, so a
//! decoder that mistakes one kind of message for another would go unseen;
//! this checker reads the shapes it is sure of by its own means (a JSON
//! object with a known `type`, a non-empty string `requestId`, `payload`
//! absent or an object, and for `AWAIT_MORE` a `lastReceivedIndex` absent or
//! a non-negative integer, for `SENTENCE_COMPLETED` a `sentenceIndex` that
//! is one, for `INTERRUPTED` nothing more, for `COMPLETION` a `payload` with
//! a string `prompt`, `model` absent or a string, `options` absent or an
//! object, `conversationId` absent or a non-empty string, and `context`
//! absent or plain `system` / `user` / `assistant` messages) and holds that
//! the decoder gives that message, with those values (a `COMPLETION`'s
//! `model`, `options` and `context` included); whatever it decodes is
//! of the `type` the frame names.

use serde_json::Value;
use tokenwire_core::dialect::cai::codec::{self, ClientMessage};
use tokenwire_core::Input;

use crate::invariants::{Check, Checker, Cx};

/// A message this checker reads by itself.
#[derive(Debug, PartialEq)]
enum Known {
    /// A `COMPLETION`.
    Completion(KnownCompletion),
    Interrupted(String),
    AwaitMore(String, Option<u64>),
    SentenceCompleted(String, u64),
}

/// A `COMPLETION` as this checker reads it.
#[derive(Debug, PartialEq)]
struct KnownCompletion {
    rid: String,
    prompt: String,
    conversation: Option<String>,
    model: Option<String>,
    /// `options` as sent (empty when absent).
    options: serde_json::Map<String, Value>,
    /// `context` as (role, content) pairs.
    context: Option<Vec<(String, String)>>,
}

/// The frame's `type`, and the message when its shape is one of [`Known`].
fn reference(text: &str) -> Option<(String, Option<Known>)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let kind = v.get("type")?.as_str()?.to_string();
    let rid = v
        .get("requestId")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty());
    let payload = match v.get("payload") {
        None => Some(serde_json::Map::new()),
        Some(Value::Object(p)) => Some(p.clone()),
        Some(_) => None,
    };
    let (Some(rid), Some(p)) = (rid, payload) else {
        return Some((kind, None));
    };
    let rid = rid.to_string();
    let known = match kind.as_str() {
        "COMPLETION" if v.get("payload").is_some() => completion(rid, &p),
        "INTERRUPTED" => Some(Known::Interrupted(rid)),
        "AWAIT_MORE" => match p.get("lastReceivedIndex") {
            None => Some(Known::AwaitMore(rid, None)),
            Some(n) => n.as_u64().map(|n| Known::AwaitMore(rid, Some(n))),
        },
        "SENTENCE_COMPLETED" => p
            .get("sentenceIndex")
            .and_then(Value::as_u64)
            .map(|n| Known::SentenceCompleted(rid, n)),
        _ => None,
    };
    Some((kind, known))
}

/// A `COMPLETION` whose payload `p` has the shape the module docs name.
fn completion(rid: String, p: &serde_json::Map<String, Value>) -> Option<Known> {
    let plain = |m: &Value| {
        let role_ok = matches!(m["role"].as_str(), Some("system" | "user" | "assistant"));
        let keys_ok = m
            .as_object()
            .is_some_and(|o| o.keys().all(|k| k == "role" || k == "content"));
        role_ok && keys_ok && m["content"].is_string()
    };
    let shapes = [
        p.keys().all(|k| {
            matches!(
                k.as_str(),
                "prompt" | "model" | "options" | "conversationId" | "context"
            )
        }),
        p.get("model").is_none_or(Value::is_string),
        p.get("options").is_none_or(Value::is_object),
        p.get("context")
            .is_none_or(|c| c.as_array().is_some_and(|a| a.iter().all(plain))),
    ];
    let conversation = match p.get("conversationId") {
        None => None,
        Some(Value::String(c)) if !c.is_empty() => Some(c.clone()),
        Some(_) => return None,
    };
    let prompt = p.get("prompt")?.as_str()?.to_string();
    let context = p.get("context").and_then(Value::as_array).map(|a| {
        a.iter()
            .map(|m| {
                let text = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                (text("role"), text("content"))
            })
            .collect()
    });
    shapes.iter().all(|&ok| ok).then(|| {
        Known::Completion(KnownCompletion {
            rid,
            prompt,
            conversation,
            model: p.get("model").and_then(Value::as_str).map(str::to_string),
            options: p
                .get("options")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            context,
        })
    })
}

fn type_of(m: &ClientMessage) -> &'static str {
    match m {
        ClientMessage::Completion(_) => "COMPLETION",
        ClientMessage::Interrupted { .. } => "INTERRUPTED",
        ClientMessage::AwaitMore { .. } => "AWAIT_MORE",
        ClientMessage::SentenceCompleted { .. } => "SENTENCE_COMPLETED",
    }
}

fn as_known(m: &ClientMessage) -> Option<Known> {
    match m {
        ClientMessage::Interrupted { request_id } => Some(Known::Interrupted(request_id.clone())),
        ClientMessage::AwaitMore {
            request_id,
            last_received_index,
        } => Some(Known::AwaitMore(request_id.clone(), *last_received_index)),
        ClientMessage::SentenceCompleted {
            request_id,
            sentence_index,
        } => Some(Known::SentenceCompleted(
            request_id.clone(),
            *sentence_index,
        )),
        ClientMessage::Completion(c) => Some(Known::Completion(KnownCompletion {
            rid: c.request_id.clone(),
            prompt: c.prompt.clone(),
            conversation: c.conversation_id.clone(),
            model: c.model.clone(),
            options: c.options.clone(),
            context: c.context.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| (m.role.as_str().to_string(), m.content.clone()))
                    .collect()
            }),
        })),
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiDecode;

impl Checker for CaiDecode {
    fn name(&self) -> &'static str {
        "cai_decode"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        let Input::Text { conn, text } = input else {
            return Ok(());
        };
        if cx.view.cai(conn).is_none() {
            return Ok(());
        }
        let Some((kind, known)) = reference(text) else {
            return Ok(());
        };
        judge(&kind, known.as_ref(), &codec::decode_client(text))
            .map_err(|e| format!("{conn:?} {e}"))
    }
}

/// Whether `decoded` is what a frame of type `kind` (read as `known`, when
/// the reference could) must decode to.
fn judge(
    kind: &str,
    known: Option<&Known>,
    decoded: &Result<ClientMessage, codec::DecodeError>,
) -> Check {
    match (known, decoded) {
        (Some(k), Ok(m)) if as_known(m).as_ref() == Some(k) => Ok(()),
        (Some(k), _) => Err(format!(
            "sent {k:?}; the dialect read {:?}",
            decoded.as_ref().map(type_of).map_err(|e| e.message.clone())
        )),
        (None, Ok(m)) if type_of(m) != kind => Err(format!(
            "sent a `{kind}`; the dialect read a {}",
            type_of(m)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_reads_the_shapes_it_is_sure_of() {
        let r = |t: &str| reference(t).and_then(|(_, k)| k);
        assert_eq!(
            r(r#"{"type":"AWAIT_MORE","requestId":"a"}"#),
            Some(Known::AwaitMore("a".into(), None))
        );
        assert_eq!(
            r(r#"{"type":"AWAIT_MORE","requestId":"a","payload":{"lastReceivedIndex":3}}"#),
            Some(Known::AwaitMore("a".into(), Some(3)))
        );
        assert_eq!(
            r(r#"{"type":"SENTENCE_COMPLETED","requestId":"a","payload":{"sentenceIndex":0}}"#),
            Some(Known::SentenceCompleted("a".into(), 0))
        );
        assert_eq!(r(r#"{"type":"SENTENCE_COMPLETED","requestId":"a"}"#), None);
        assert_eq!(r(r#"{"type":"INTERRUPTED","requestId":""}"#), None);
        assert_eq!(
            r(r#"{"type":"AWAIT_MORE","requestId":"a","payload":[]}"#),
            None
        );
    }

    #[test]
    fn the_dialects_decoder_agrees_today() {
        for text in [
            r#"{"type":"AWAIT_MORE","requestId":"a","payload":{"lastReceivedIndex":3}}"#,
            r#"{"type":"AWAIT_MORE","requestId":"a"}"#,
            r#"{"type":"SENTENCE_COMPLETED","requestId":"a","payload":{"sentenceIndex":2}}"#,
            r#"{"type":"INTERRUPTED","requestId":"a"}"#,
            r#"{"type":"COMPLETION","requestId":"a","payload":{"prompt":"hi","options":{"stream":false},
               "conversationId":"c","context":[{"role":"system","content":"s"}]}}"#,
        ] {
            let (_, known) = reference(text).expect("read");
            assert!(known.is_some(), "{text}");
            let m = codec::decode_client(text).expect("decodes");
            assert_eq!(as_known(&m), known, "{text}");
        }
    }

    #[test]
    fn a_misread_message_is_caught() {
        let text = r#"{"type":"AWAIT_MORE","requestId":"a"}"#;
        let (kind, known) = reference(text).expect("read");
        // What a decoder that lost its AWAIT_MORE arm gives.
        let misread = codec::decode_client(
            r#"{"type":"SENTENCE_COMPLETED","requestId":"a","payload":{"sentenceIndex":1}}"#,
        );
        let e = judge(&kind, known.as_ref(), &misread).expect_err("misread");
        assert!(e.contains("SENTENCE_COMPLETED"), "{e}");
        let refused = codec::decode_client(r#"{"type":"SENTENCE_COMPLETED","requestId":"a"}"#);
        assert!(refused.is_err());
        judge(&kind, known.as_ref(), &refused).expect_err("refused");
        judge(&kind, known.as_ref(), &codec::decode_client(text)).expect("read right");
        // A COMPLETION read as another kind, or refused.
        judge("COMPLETION", None, &misread).expect_err("another kind");
        let text = r#"{"type":"COMPLETION","requestId":"a","payload":{"prompt":"hi"}}"#;
        let (kind, known) = reference(text).expect("read");
        let hi = KnownCompletion {
            rid: "a".into(),
            prompt: "hi".into(),
            conversation: None,
            model: None,
            options: serde_json::Map::new(),
            context: None,
        };
        assert_eq!(known, Some(Known::Completion(hi)));
        let refused = codec::decode_client(r#"{"type":"NOPE","requestId":"a"}"#);
        let e = judge(&kind, known.as_ref(), &refused).expect_err("a decoder without its arm");
        assert!(e.contains("Completion"), "{e}");
    }

    /// A fabricated violation: a decoder that loses a COMPLETION's context,
    /// or reads its options other than sent.
    #[test]
    fn a_completion_read_with_other_context_or_options_is_caught() {
        let text = r#"{"type":"COMPLETION","requestId":"a","payload":{"prompt":"hi",
            "conversationId":"c","options":{"stream":false},
            "context":[{"role":"user","content":"before"}]}}"#;
        let (kind, known) = reference(text).expect("read");
        let decoded = codec::decode_client(text);
        judge(&kind, known.as_ref(), &decoded).expect("read right");
        let Ok(ClientMessage::Completion(c)) = decoded else {
            panic!("a completion")
        };
        let lost = ClientMessage::Completion(codec::Completion {
            context: None,
            ..c.clone()
        });
        let e = judge(&kind, known.as_ref(), &Ok(lost)).expect_err("context lost");
        assert!(e.contains("before"), "{e}");
        let mut options = c.options.clone();
        options.insert("stream".into(), Value::Bool(true));
        let other = ClientMessage::Completion(codec::Completion { options, ..c });
        judge(&kind, known.as_ref(), &Ok(other)).expect_err("options changed");
    }
}
