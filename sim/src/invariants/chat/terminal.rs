//! `chat_terminal`: every `chat` (and `anthropic`) request gets exactly one
//! answer and
//! nothing after it: chunks (only when it asked to stream, and only on the
//! generating routes) then `done` or an error, or one reply or error; the
//! Host sends nothing to a connection before its request or after its
//! answer. At the end of the run every request whose connection is still
//! open was answered (or its connection closed by the Host, which the shell
//! answers as a 500 or 503).

use std::collections::BTreeMap;

use tokenwire_core::{ConnId, Dialect, Input, Output, Transport};

use super::answers::Request;
use crate::invariants::{clip, Check, Checker, Cx, Frame};

/// Where one request stands.
#[derive(Debug, Default)]
struct State {
    /// Its body's route and whether it streams (`None`: no request yet).
    request: Option<(String, bool)>,
    /// A chunk was sent.
    streamed: bool,
    /// Its answer ended (or the Host closed its connection).
    over: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatTerminal {
    live: BTreeMap<ConnId, State>,
}

impl Checker for ChatTerminal {
    fn name(&self) -> &'static str {
        "chat_terminal"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, input: &Input) -> Check {
        match input {
            Input::Open {
                conn,
                dialect: Dialect::Chat | Dialect::Anthropic,
                transport: Transport::Http,
                ..
            } => {
                self.live.insert(*conn, State::default());
            }
            Input::Text { conn, text } => {
                if let Some(s) = self.live.get_mut(conn).filter(|s| s.request.is_none()) {
                    let r = Request::of_frame(text);
                    let stream = r.stream();
                    s.request = Some((r.route, stream));
                }
            }
            Input::Closed { conn } => {
                self.live.remove(conn);
            }
            _ => {}
        }
        Ok(())
    }

    fn on_output(&mut self, _cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let conn = match out {
            Output::Send { conn, .. } | Output::Close { conn, .. } => *conn,
            _ => return Ok(()),
        };
        let Some(s) = self.live.get_mut(&conn) else {
            return Ok(());
        };
        if matches!(out, Output::Close { .. }) {
            s.over = true;
            return Ok(());
        }
        let text = frame.map(|f| f.v.to_string()).unwrap_or_default();
        let Some((route, stream)) = s.request.clone() else {
            return Err(format!(
                "{conn:?} was sent {} before its request",
                clip(&text)
            ));
        };
        if s.over {
            return Err(format!(
                "{conn:?} was sent {} after its answer",
                clip(&text)
            ));
        }
        let kind = frame.and_then(|f| f.v["kind"].as_str()).unwrap_or("");
        let generating = matches!(route.as_str(), "chat" | "completions" | "messages");
        let ok = match kind {
            "chunk" | "done" => generating && stream && (kind == "chunk" || s.streamed),
            "reply" => !(generating && stream),
            "error" => true,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "a {route} request (stream: {stream}, streamed: {}) was sent {}",
                s.streamed,
                clip(&text)
            ));
        }
        s.streamed |= kind == "chunk";
        s.over = kind != "chunk";
        Ok(())
    }

    fn on_crash(&mut self) {
        self.live.clear();
    }

    fn on_finish(&mut self, _cx: &Cx<'_>) -> Check {
        let left: Vec<String> = self
            .live
            .iter()
            .filter(|(_, s)| !s.over && s.request.is_some())
            .map(|(c, s)| format!("{c:?} ({:?})", s.request.as_ref().map(|r| &r.0)))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} chat request(s) never answered: {}",
                left.len(),
                left.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::{json, Value};

    fn request(k: &mut crate::invariants::testkit::Kit, conn: u64, route: &str, body: Value) {
        k.open_http(conn, Dialect::Chat);
        k.input(Input::Text {
            conn: ConnId(conn),
            text: json!({"route": route, "body": body}).to_string(),
        })
        .expect("request");
    }

    #[test]
    fn one_answer_per_request_passes() {
        let mut k = kit(Box::new(ChatTerminal::default()));
        request(&mut k, 1, "chat", json!({"stream": true}));
        k.send(1, json!({"kind": "chunk", "data": {}}))
            .expect("chunk");
        k.send(1, json!({"kind": "done"})).expect("done");
        request(&mut k, 2, "completions", json!({}));
        k.send(2, json!({"kind": "reply", "data": {}}))
            .expect("reply");
        request(&mut k, 3, "embeddings", json!({}));
        k.send(3, json!({"kind": "error", "status": 400, "data": {}}))
            .expect("error");
        k.m.finish(k.now()).expect("all answered");
    }

    /// Fabricated violations.
    #[test]
    fn a_second_answer_a_chunk_unasked_or_no_answer_is_caught() {
        let mut k = kit(Box::new(ChatTerminal::default()));
        request(&mut k, 1, "chat", json!({}));
        k.send(1, json!({"kind": "reply", "data": {}}))
            .expect("reply");
        let e = k
            .send(1, json!({"kind": "reply", "data": {}}))
            .expect_err("twice");
        assert!(e.detail.contains("after its answer"), "{e}");

        let mut k = kit(Box::new(ChatTerminal::default()));
        request(&mut k, 1, "completions", json!({"stream": false}));
        let e = k
            .send(1, json!({"kind": "chunk", "data": {}}))
            .expect_err("unasked chunk");
        assert!(e.detail.contains("stream: false"), "{e}");

        let mut k = kit(Box::new(ChatTerminal::default()));
        request(&mut k, 1, "chat", json!({"stream": true}));
        let e = k
            .send(1, json!({"kind": "reply", "data": {}}))
            .expect_err("a reply to a stream");
        assert!(e.detail.contains("stream: true"), "{e}");

        let mut k = kit(Box::new(ChatTerminal::default()));
        request(&mut k, 1, "chat", json!({"stream": true}));
        k.send(1, json!({"kind": "chunk", "data": {}}))
            .expect("chunk");
        let e = k.m.finish(k.now()).expect_err("never answered");
        assert!(e.detail.contains("never answered"), "{e}");
    }
}
