//! `anthropic_http`: what a client of `POST /v1/messages` and
//! `POST /v1/messages/count_tokens` gets, replayed through the shell's
//! exchange ([`Replays`]) over the frames the Host sent, judged as
//! Anthropic's API and SDKs read it.
//!
//! - An error is Anthropic's `{"type": "error", "error": {type, message}}`
//!   with the type its status means (Anthropic's table, written out here
//!   as its docs give it), `Retry-After` exactly on 429 and 503; a request
//!   naming another model, or a message without `max_tokens`, is never
//!   answered.
//! - `count_tokens` answers `{"input_tokens"}`, at least 1.
//! - A `message` has role `assistant`, `text` (or `thinking`, `tool_use`)
//!   blocks, a `stop_reason` Anthropic knows, and at most `max_tokens`
//!   output tokens.
//! - A stream (only when asked) is, in order: `message_start`; blocks, each
//!   `content_block_start`, its deltas and `content_block_stop` with the
//!   same index, from 0 up, one open at a time; one `message_delta` with
//!   the stop reason and usage; `message_stop`, the last. An `error` event
//!   may end it at any point; `ping` may come after the start. Every
//!   event is named by its data's `type`.

use std::collections::BTreeMap;

use serde_json::Value;
use tokenwire_core::http::{HttpReply, HttpStep, SseEvent};
use tokenwire_core::{ConnId, Dialect, Input, Output};

use crate::invariants::http::{Replays, Step};
use crate::invariants::{clip, Check, Checker, Cx, Frame};

/// Where a stream stands.
#[derive(Debug, Default)]
struct Stream {
    started: bool,
    /// The open block's index.
    open: Option<u64>,
    /// The index the next block takes.
    next: u64,
    /// `message_delta` went out.
    delta: bool,
    /// `message_stop` or `error` went out.
    over: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct AnthropicHttp {
    replays: Replays,
    streams: BTreeMap<ConnId, Stream>,
}

impl Default for AnthropicHttp {
    fn default() -> AnthropicHttp {
        AnthropicHttp {
            replays: Replays::new(Dialect::Anthropic),
            streams: BTreeMap::new(),
        }
    }
}

/// The error type Anthropic gives `status`.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

const STOP_REASONS: &[&str] = &[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "refusal",
    "model_context_window_exceeded",
];

/// An error body of `status`.
fn judge_error(status: u16, body: &Value) -> Check {
    let e = &body["error"];
    if body["type"] != "error"
        || e["type"] != error_type(status)
        || e["message"].as_str().is_none_or(str::is_empty)
    {
        return Err(format!("a {status} error {}", clip(&body.to_string())));
    }
    Ok(())
}

/// Why a request must be refused, if it must.
fn refused_for(req: &Value, cx: &Cx<'_>) -> Option<&'static str> {
    let body = &req["body"];
    if body["model"].as_str().is_some_and(|m| m != cx.model.name) {
        return Some("names another model");
    }
    let messages = req["route"] == "messages";
    if messages && body["max_tokens"].is_null() {
        return Some("gives no max_tokens");
    }
    None
}

fn judge_reply(req: &Value, r: &HttpReply, cx: &Cx<'_>) -> Check {
    let body: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    if r.retry_after.is_some() != matches!(r.status, 429 | 503) {
        return Err(format!(
            "a {} reply with Retry-After {:?}",
            r.status, r.retry_after
        ));
    }
    if r.status != 200 {
        return judge_error(r.status, &body);
    }
    if let Some(why) = refused_for(req, cx) {
        return Err(format!("answered a request that {why}"));
    }
    if req["route"] == "count_tokens" {
        if body["input_tokens"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("count_tokens answered {}", clip(&r.body)));
        }
        return Ok(());
    }
    let blocks_known = body["content"].as_array().is_some_and(|c| {
        c.iter()
            .all(|b| matches!(b["type"].as_str(), Some("text" | "thinking" | "tool_use")))
    });
    let stop = body["stop_reason"].as_str().unwrap_or("");
    let output = body["usage"]["output_tokens"].as_u64();
    let max = req["body"]["max_tokens"].as_u64().unwrap_or(u64::MAX);
    if body["type"] != "message"
        || body["role"] != "assistant"
        || !blocks_known
        || !STOP_REASONS.contains(&stop)
        || output.is_none_or(|o| o > max)
    {
        return Err(format!("a message {}", clip(&r.body)));
    }
    Ok(())
}

impl Stream {
    /// Takes in one event (`last`: the exchange's last).
    fn on_event(&mut self, e: &SseEvent, last: bool, req: &Value) -> Check {
        let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
        let kind = v["type"].as_str().unwrap_or("");
        if e.event.as_deref() != Some(kind) {
            return Err(format!("an event named {:?} carries {kind:?}", e.event));
        }
        if self.over {
            return Err(format!("{kind} after the stream ended"));
        }
        let index = v["index"].as_u64();
        let ok = match kind {
            "message_start" => !self.started && v["message"]["role"] == "assistant",
            "ping" => self.started,
            "content_block_start" => {
                let ok =
                    self.started && !self.delta && self.open.is_none() && index == Some(self.next);
                self.open = index;
                self.next += 1;
                ok
            }
            "content_block_delta" => self.open.is_some() && index == self.open,
            "content_block_stop" => {
                let ok = self.open.is_some() && index == self.open;
                self.open = None;
                ok
            }
            "message_delta" => {
                let stop = v["delta"]["stop_reason"].as_str().unwrap_or("");
                let max = req["body"]["max_tokens"].as_u64().unwrap_or(u64::MAX);
                let output = v["usage"]["output_tokens"].as_u64();
                let ok = self.started
                    && !self.delta
                    && self.open.is_none()
                    && STOP_REASONS.contains(&stop)
                    && output.is_some_and(|o| o <= max);
                self.delta = true;
                ok
            }
            "message_stop" => {
                self.over = true;
                self.delta && last
            }
            "error" => {
                self.over = true;
                last && v["error"]["message"].is_string()
            }
            _ => false,
        };
        self.started = true;
        if !ok || (last && !self.over) {
            return Err(format!(
                "{kind} out of order (last: {last}): {}",
                clip(&e.data)
            ));
        }
        Ok(())
    }
}

impl Checker for AnthropicHttp {
    fn name(&self) -> &'static str {
        "anthropic_http"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        if let Input::Open { conn, .. } | Input::Closed { conn } = input {
            self.streams.remove(conn);
        }
        self.replays.on_input(input, &cx.model.name);
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some(Step {
            conn,
            request,
            step,
        }) = self.replays.on_output(out)
        else {
            return Ok(());
        };
        let stream = request["body"]["stream"] == true && request["route"] == "messages";
        let r = match &step {
            HttpStep::Wait => Ok(()),
            HttpStep::Reply(r) => match self.streams.get(&conn) {
                Some(_) => Err("a reply after the stream began".into()),
                None if stream && r.status == 200 => Err("a reply to a stream".into()),
                None => judge_reply(request, r, cx),
            },
            HttpStep::Event(_) | HttpStep::LastEvent(_) | HttpStep::Events { .. }
                if refused_for(request, cx).is_some() =>
            {
                Err(format!(
                    "streamed a request that {}",
                    refused_for(request, cx).unwrap_or_default()
                ))
            }
            HttpStep::Event(e) | HttpStep::LastEvent(e) if stream => {
                let last = matches!(step, HttpStep::LastEvent(_));
                let s = self.streams.entry(conn).or_default();
                s.on_event(e, last, request)
            }
            HttpStep::Events { events, last } if stream => {
                let s = self.streams.entry(conn).or_default();
                let n = events.len();
                events
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, e)| s.on_event(e, *last && i + 1 == n, request))
            }
            _ => Err(format!(
                "events for a request that did not stream: {step:?}"
            )),
        };
        r.map_err(|e| format!("{} request on {conn:?}: {e}", request["route"]))
    }

    fn on_crash(&mut self) {
        self.replays.clear();
        self.streams.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: &str, data: Value) -> SseEvent {
        let mut data = data;
        data["type"] = json!(kind);
        SseEvent {
            event: Some(kind.into()),
            data: data.to_string(),
        }
    }

    fn run(events: &[SseEvent]) -> Check {
        let req = json!({"route": "messages", "body": {"max_tokens": 4, "stream": true}});
        let mut s = Stream::default();
        let n = events.len();
        events
            .iter()
            .enumerate()
            .try_for_each(|(i, e)| s.on_event(e, i + 1 == n, &req))
    }

    fn start() -> SseEvent {
        ev("message_start", json!({"message": {"role": "assistant"}}))
    }

    fn block(kind: &str, i: u64) -> SseEvent {
        ev(kind, json!({"index": i}))
    }

    fn delta(stop: &str, out: u64) -> SseEvent {
        ev(
            "message_delta",
            json!({"delta": {"stop_reason": stop}, "usage": {"output_tokens": out}}),
        )
    }

    #[test]
    fn a_stream_in_anthropics_order_passes() {
        run(&[
            start(),
            block("content_block_start", 0),
            block("content_block_delta", 0),
            block("content_block_stop", 0),
            block("content_block_start", 1),
            block("content_block_stop", 1),
            delta("max_tokens", 4),
            ev("message_stop", json!({})),
        ])
        .expect("in order");
        run(&[
            start(),
            block("content_block_start", 0),
            ev(
                "error",
                json!({"error": {"type": "api_error", "message": "m"}}),
            ),
        ])
        .expect("an error ends it anywhere");
    }

    /// Fabricated violations.
    #[test]
    fn events_out_of_order_are_caught() {
        let unclosed = run(&[
            start(),
            block("content_block_start", 0),
            delta("end_turn", 1),
            ev("message_stop", json!({})),
        ]);
        assert!(unclosed.is_err(), "a delta with a block open");
        let skipped = run(&[
            start(),
            block("content_block_start", 1),
            block("content_block_stop", 1),
            delta("end_turn", 1),
            ev("message_stop", json!({})),
        ]);
        assert!(skipped.is_err(), "a block index skipped");
        let over = run(&[
            start(),
            delta("max_tokens", 5),
            ev("message_stop", json!({})),
        ]);
        assert!(over.is_err(), "more output tokens than max_tokens");
        let unended = run(&[start(), delta("end_turn", 1)]);
        assert!(unended.is_err(), "no message_stop last");
        let misnamed = run(&[SseEvent {
            event: Some("ping".into()),
            data: json!({"type": "message_start"}).to_string(),
        }]);
        assert!(misnamed.is_err(), "an event named for another type");
    }

    #[test]
    fn errors_carry_the_type_their_status_means() {
        let body = |t: &str| json!({"type": "error", "error": {"type": t, "message": "m"}});
        judge_error(404, &body("not_found_error")).expect("a 404");
        judge_error(503, &body("overloaded_error")).expect("a 503");
        assert!(judge_error(400, &body("api_error")).is_err());
    }
}
