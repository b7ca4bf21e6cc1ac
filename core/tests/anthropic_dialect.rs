//! The `anthropic` dialect (Anthropic's Messages API on the chat machine)
//! through a Host with a scripted engine and virtual time: the frames its
//! HTTP mapping turns into a `message` or Anthropic's events, stop
//! sequences named, `count_tokens` counting what `/v1/messages` computes,
//! structured output, and errors.

use serde_json::{json, Value};
use tokenwire_core::dialect::anthropic::{message, MessageStream};
use tokenwire_core::testing::{tiny_model_info, DigitsCodec, Harness};
use tokenwire_core::{ConnId, Dialect, HostConfig};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn request(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "max_tokens": 6, "temperature": 0,
                       "system": "Be brief.",
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    json!({"route": "messages", "body": b})
}

/// The machine's last frame for one request on a fresh connection.
fn answer(h: &mut Harness, id: u64, frame: Value) -> Value {
    let c = h.open_http(id, Dialect::Anthropic);
    h.send(c, frame);
    h.run(100);
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

fn text_of(m: &Value) -> String {
    m["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_message_names_the_stop_sequence_that_ended_it() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let r = answer(&mut h, 1, request(json!({})));
    assert_eq!(r["kind"], "reply", "{r}");
    let m = message(&r["data"]);
    let full = text_of(&m);
    assert_eq!(full.len(), 6, "{m}");
    assert_eq!(m["stop_reason"], "max_tokens");
    assert!(
        m["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{m}"
    );
    let input = m["usage"]["input_tokens"].as_u64().expect("input tokens");
    assert!(input > 0, "{m}");
    assert_eq!(m["usage"]["output_tokens"], 6);
    // The same prompt again, stopped inside the answer it gave.
    let stop = &full[2..4];
    let r = answer(&mut h, 2, request(json!({"stop_sequences": ["zz", stop]})));
    let m = message(&r["data"]);
    assert_eq!(text_of(&m), &full[..2], "{m}");
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop))
    );
    // The prompt's blocks came from the prefix cache the second time, as
    // Anthropic counts cache reads.
    let cached = m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        m["usage"]["input_tokens"].as_u64().unwrap_or(0) + cached,
        input
    );
}

#[test]
fn a_stream_is_message_start_one_text_block_and_the_closing_events() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let c = h.open_http(1, Dialect::Anthropic);
    h.send(c, request(json!({"stream": true})));
    h.run(100);
    let mut stream = MessageStream::default();
    let mut events = Vec::new();
    for f in h.received(c) {
        match f["kind"].as_str() {
            Some("chunk") => events.extend(stream.on_chunk(&f["data"])),
            Some("done") => events.extend(stream.on_done()),
            other => panic!("unexpected frame {other:?}: {f}"),
        }
    }
    let data: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(&e.data).expect("json"))
        .collect();
    let kinds: Vec<&str> = data.iter().filter_map(|d| d["type"].as_str()).collect();
    assert_eq!(kinds[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(data[0]["message"]["usage"]["input_tokens"].as_u64() > Some(0));
    let text: String = data
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .map(|d| d["delta"]["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text.len(), 6);
    let end = &data[data.len() - 2];
    assert_eq!(end["delta"]["stop_reason"], "max_tokens");
    assert_eq!(end["usage"]["output_tokens"], 6);
}

#[test]
fn count_tokens_counts_the_prompt_that_messages_computes() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let r = answer(&mut h, 1, request(json!({})));
    let computed = r["data"]["usage"]["prompt_tokens"].clone();
    let body = request(json!({}))["body"].clone();
    let r = answer(&mut h, 2, json!({"route": "count_tokens", "body": body}));
    assert_eq!(r["kind"], "reply", "{r}");
    assert_eq!(r["data"], json!({"input_tokens": computed}));
    let r = answer(
        &mut h,
        3,
        json!({"route": "count_tokens", "body": {"model": "tiny", "messages": []}}),
    );
    assert_eq!(
        (r["kind"].as_str(), r["status"].as_u64()),
        (Some("error"), Some(400))
    );
}

#[test]
fn output_config_format_holds_the_answer_to_its_schema() {
    let mut h = Harness::with_codec(
        HostConfig::default(),
        tiny_model_info(),
        DigitsCodec::shared(4),
        SCRIPT,
        1,
    );
    let format = json!({"format": {"type": "json_schema", "schema": {"type": "object"}}});
    let r = answer(
        &mut h,
        1,
        request(json!({"output_config": format, "max_tokens": 10})),
    );
    let m = message(&r["data"]);
    let text = text_of(&m);
    assert!(
        text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()),
        "{m}"
    );
    assert_eq!(m["stop_reason"], "end_turn", "the grammar ended it");
}

#[test]
fn errors_keep_their_status_and_the_connection_answers_the_next_request() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let other_model = request(json!({"model": "other"}));
    let r = answer(&mut h, 1, other_model);
    assert_eq!(
        (r["kind"].as_str(), r["status"].as_u64()),
        (Some("error"), Some(404))
    );
    let mut no_max = request(json!({}));
    no_max["body"]
        .as_object_mut()
        .map(|b| b.remove("max_tokens"));
    let c = ConnId(2);
    let r = answer(&mut h, c.0, no_max);
    assert_eq!(r["status"], 400);
    assert!(r["data"]["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("max_tokens")));
    h.send(c, request(json!({})));
    h.run(100);
    assert_eq!(
        h.received(c).last().map(|f| f["kind"].clone()),
        Some(json!("reply"))
    );
}

#[test]
fn max_tokens_is_a_ceiling_the_context_may_lower() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let context = u64::from(tiny_model_info().context_len);
    let c = h.open_http(1, Dialect::Anthropic);
    h.send(c, request(json!({"max_tokens": 1_000_000})));
    h.run(context as usize * 2);
    let r = h.received(c).last().cloned().unwrap_or(Value::Null);
    let m = message(&r["data"]);
    assert_eq!(m["stop_reason"], "model_context_window_exceeded", "{m}");
    let u = &m["usage"];
    let used = ["input_tokens", "cache_read_input_tokens", "output_tokens"]
        .iter()
        .map(|k| u[k].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(used, context, "the answer took what the prompt left: {u}");
    // A ceiling the context does not lower is reached as max_tokens.
    let r = answer(&mut h, 2, request(json!({"max_tokens": 3})));
    assert_eq!(message(&r["data"])["stop_reason"], "max_tokens");
}
