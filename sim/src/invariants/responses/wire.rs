//! `responses_wire`: every event to a `responses` connection has a known
//! type and the shape of the official SDKs' types. An error event is
//! `{type: "error", status, error: {type, code, message, param}}` with the
//! type its status calls for and the status its code calls for; every other
//! event has a `sequence_number`; a Response object has every required field
//! (`resp_` id, `object: "response"`, `parallel_tool_calls: false`, ...),
//! usage only once it ended (with `total_tokens` the sum), and the status
//! its terminal event names; text events name a `msg_` item; every output
//! item, in an event or a Response, is an assistant message whose content
//! parts are `output_text` with their text, `annotations` and `logprobs`.

use serde_json::Value;
use tokenwire_core::{Dialect, Output};

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesWire;

const EVENTS: [&str; 11] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// The status PROTOCOLS.md gives an error code.
fn status_of(code: &str) -> Option<u64> {
    Some(match code {
        "concurrent_request" => 409,
        "previous_response_not_found" | "model_not_found" => 404,
        "unknown_event_type"
        | "invalid_json"
        | "invalid_request"
        | "context_length_exceeded"
        | "connection_expiring" => 400,
        "rate_limit_exceeded" => 429,
        _ => return None,
    })
}

fn check_error(v: &Value) -> Result<(), String> {
    let status = v["status"].as_u64().ok_or("error event without a status")?;
    let e = &v["error"];
    let want_type = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    if e["type"] != want_type {
        return Err(format!("status {status} with error.type {}", e["type"]));
    }
    let code = e["code"].as_str().unwrap_or("");
    if code.is_empty() || e["message"].as_str().is_none_or(str::is_empty) {
        return Err("error without a code or a message".into());
    }
    if !(e["param"].is_null() || e["param"].is_string()) {
        return Err(format!("error.param {}", e["param"]));
    }
    match status_of(code) {
        Some(s) if s != status => Err(format!("{code} with status {status}, expected {s}")),
        _ => Ok(()),
    }
}

/// An output text part as the SDKs type it: `output_text`, its text, and
/// the (here always empty) `annotations` and `logprobs` lists.
fn check_part(p: &Value) -> Result<(), String> {
    let ok = p["type"] == "output_text"
        && p["text"].is_string()
        && p["annotations"] == Value::Array(Vec::new())
        && p["logprobs"] == Value::Array(Vec::new());
    if ok {
        Ok(())
    } else {
        Err(format!("a content part {p}"))
    }
}

/// An assistant message item: a `msg_` id, a status, and output text
/// parts.
fn check_item(item: &Value) -> Result<(), String> {
    let ok = item["type"] == "message"
        && item["role"] == "assistant"
        && item["id"].as_str().is_some_and(|i| i.starts_with("msg_"))
        && item["status"].is_string();
    let Some(parts) = item["content"].as_array().filter(|_| ok) else {
        return Err(format!("an output item {item}"));
    };
    parts.iter().try_for_each(check_part)
}

fn check_response(kind: &str, r: &Value, filters: bool) -> Result<(), String> {
    if !r["id"].as_str().is_some_and(|i| i.starts_with("resp_")) || r["object"] != "response" {
        return Err("a Response without a resp_ id or object: response".into());
    }
    let fixed = r["created_at"].is_u64()
        && r["model"].is_string()
        && r["output"].is_array()
        && r["parallel_tool_calls"] == false
        && r["tool_choice"] == "auto"
        && r["tools"] == Value::Array(Vec::new())
        && (r["previous_response_id"].is_null() || r["previous_response_id"].is_string())
        && r.get("temperature").is_some()
        && r.get("top_p").is_some()
        && r.get("max_output_tokens").is_some()
        && r["metadata"].is_object();
    if !fixed {
        return Err("a Response without one of its required fields".into());
    }
    if let Some(items) = r["output"].as_array() {
        items.iter().try_for_each(check_item)?;
    }
    let status = r["status"].as_str().unwrap_or("");
    let terminal = matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    );
    if !terminal {
        return if status == "in_progress" && r["usage"].is_null() {
            Ok(())
        } else {
            Err(format!("{kind} with status {status:?} or usage"))
        };
    }
    let ok_status = match kind {
        "response.completed" => status == "completed",
        "response.incomplete" => {
            (status == "incomplete" && r["incomplete_details"]["reason"] == "max_output_tokens")
                || (status == "incomplete"
                    && r["incomplete_details"]["reason"] == "content_filter"
                    && filters)
                || (status == "cancelled" && r["incomplete_details"].is_null())
        }
        _ => status == "failed" && r["error"]["code"] == "server_error",
    };
    if !ok_status {
        return Err(format!(
            "{kind} with status {status:?}, incomplete_details {}, error {}",
            r["incomplete_details"], r["error"]
        ));
    }
    let u = &r["usage"];
    let (i, o, t) = (
        u["input_tokens"].as_u64(),
        u["output_tokens"].as_u64(),
        u["total_tokens"].as_u64(),
    );
    match (i, o, t) {
        (Some(i), Some(o), Some(t))
            if t == i + o
                && u["input_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .is_some_and(|c| c < i.max(1))
                && u["output_tokens_details"]["reasoning_tokens"] == 0 =>
        {
            Ok(())
        }
        _ => Err(format!("{kind} with usage {u}")),
    }
}

fn check(f: &Frame, filters: bool) -> Result<(), String> {
    let v = &f.v;
    let kind = f.kind();
    if kind == "error" {
        return check_error(v);
    }
    if !EVENTS.contains(&kind) {
        return Err(format!("unknown event type {kind:?}"));
    }
    if !v["sequence_number"].is_u64() {
        return Err(format!("{kind} without a sequence_number"));
    }
    if let Some(r) = v.get("response") {
        return check_response(kind, r, filters);
    }
    if kind.contains("output_item") {
        if v["output_index"] != 0 {
            return Err(format!("{kind} at output_index {}", v["output_index"]));
        }
        return check_item(&v["item"]);
    }
    let named = v["item_id"].as_str().is_some_and(|i| i.starts_with("msg_"))
        && v["output_index"] == 0
        && v["content_index"] == 0;
    if !named {
        return Err(format!("{kind} without its msg_ item and indexes"));
    }
    if kind == "response.output_text.delta" && v["delta"].as_str().is_none_or(str::is_empty) {
        return Err("an empty delta".into());
    }
    if kind == "response.output_text.done" && !v["text"].is_string() {
        return Err("output_text.done without its text".into());
    }
    if kind.starts_with("response.content_part") {
        return check_part(&v["part"]);
    }
    Ok(())
}

impl Checker for ResponsesWire {
    fn name(&self) -> &'static str {
        "responses_wire"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, text }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if cx.view.dialect_of(*conn) != Some(Dialect::Responses) {
            return Ok(());
        }
        let http = cx
            .view
            .conns
            .get(conn)
            .is_some_and(|c| c.transport == tokenwire_core::Transport::Http);
        if http && f.kind() == "response.retrieved" {
            // Only an HTTP request may retrieve: the stored Response.
            let r = &f.v["response"];
            let items = r["output"]
                .as_array()
                .map_or(Ok(()), |items| items.iter().try_for_each(check_item));
            return match (r["object"].as_str(), r["id"].as_str(), items) {
                (Some("response"), Some(_), Ok(())) => Ok(()),
                _ => Err(format!(
                    "a retrieved response that is not one, to {conn:?}: {}",
                    clip(text)
                )),
            };
        }
        let filters = crate::invariants::generate::wire::filters(cx);
        check(f, filters).map_err(|e| format!("{e} in event to {conn:?}: {}", clip(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Input;

    #[test]
    fn malformed_events_are_caught() {
        let mut k = kit(Box::new(ResponsesWire));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        let err = |status: u64, t: &str, code: &str| {
            json!({"type": "error", "status": status,
                   "error": {"type": t, "code": code, "message": "m", "param": null}})
        };
        k.send(1, err(409, "invalid_request_error", "concurrent_request"))
            .expect("well formed");
        for bad in [
            err(400, "invalid_request_error", "concurrent_request"),
            err(503, "invalid_request_error", "server_error"),
            json!({"type": "response.output_text.delta", "item_id": "msg_1",
                   "output_index": 0, "content_index": 0, "delta": "a"}),
            json!({"type": "response.steer", "sequence_number": 0}),
            json!({"type": "response.created", "sequence_number": 0,
                   "response": {"id": "resp_1", "object": "response", "status": "in_progress"}}),
        ] {
            let e = k.send(1, bad.clone()).expect_err("malformed");
            assert_eq!(e.invariant, "responses_wire", "{bad}");
        }
        let done = |cached: u64| {
            json!({"type": "response.completed", "sequence_number": 9, "response": {
                "id": "resp_1", "object": "response", "created_at": 1, "model": "m",
                "status": "completed", "output": [], "parallel_tool_calls": false,
                "tool_choice": "auto", "tools": [], "previous_response_id": null,
                "temperature": 1.0, "top_p": 1.0, "max_output_tokens": null,
                "metadata": {}, "error": null, "incomplete_details": null,
                "usage": {"input_tokens": 32, "input_tokens_details": {"cached_tokens": cached},
                          "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 34}}})
        };
        k.send(1, done(16)).expect("16 of 32 input tokens cached");
        let e = k.send(1, done(32)).expect_err("the whole input cached");
        assert_eq!(e.invariant, "responses_wire");
    }

    /// A fabricated violation: output text parts without the fields the
    /// SDKs' types require, in each place a part travels.
    #[test]
    fn malformed_content_parts_are_caught() {
        let mut k = kit(Box::new(ResponsesWire));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        let part = json!({"type": "output_text", "text": "hi", "annotations": [], "logprobs": []});
        let item = |part: &Value| {
            json!({"type": "message", "id": "msg_1", "role": "assistant",
                   "status": "completed", "content": [part]})
        };
        let events = |part: &Value| {
            [
                json!({"type": "response.content_part.done", "sequence_number": 4,
                       "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part}),
                json!({"type": "response.output_item.done", "sequence_number": 5,
                       "output_index": 0, "item": item(part)}),
            ]
        };
        for ok in events(&part) {
            k.send(1, ok).expect("well formed");
        }
        for bad_part in [
            json!({"type": "output_text", "text": "hi", "annotations": []}),
            json!({"type": "output_text", "annotations": [], "logprobs": []}),
            json!({"type": "text", "text": "hi", "annotations": [], "logprobs": []}),
            Value::Null,
        ] {
            for bad in events(&bad_part) {
                let e = k.send(1, bad.clone()).expect_err("malformed part");
                assert_eq!(e.invariant, "responses_wire", "{bad}");
            }
        }
        let e = k
            .send(
                1,
                json!({"type": "response.output_text.done", "sequence_number": 3,
                       "item_id": "msg_1", "output_index": 0, "content_index": 0}),
            )
            .expect_err("no text");
        assert!(e.detail.contains("without its text"), "{}", e.detail);
    }
}
