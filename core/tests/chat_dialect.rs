//! The `chat` dialect (Chat Completions and Completions) through a Host
//! with a scripted engine and virtual time: the frames its HTTP mapping
//! turns into replies, `n` choices sharing the prompt, and the errors a
//! failing engine or a shutdown give.

use serde_json::{json, Value};
use tokenwire_core::testing::Harness;
use tokenwire_core::{
    ConnId, Dialect, Duration, EngineFault, EngineFaultKind, HostConfig, Input, Transport,
};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness(config: HostConfig) -> Harness {
    Harness::new(config, SCRIPT, 1)
}

/// An HTTP request's virtual connection.
fn open(h: &mut Harness, id: u64) -> ConnId {
    let conn = ConnId(id);
    h.input(Input::Open {
        conn,
        dialect: Dialect::Chat,
        transport: Transport::Http,
        query: String::new(),
        authorization: None,
        peer: "p".into(),
    });
    conn
}

fn chat(body: Value) -> Value {
    json!({"route": "chat", "body": body})
}

fn request(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4, "temperature": 0});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    chat(b)
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

#[test]
fn a_request_is_answered_with_one_reply_and_n_choices_each_their_own_text() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, request(json!({"n": 3})));
    h.run(50);
    let r = last(&h, c);
    assert_eq!(r["kind"], "reply", "{r}");
    let choices = r["data"]["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
        assert_eq!(ch["finish_reason"], "length");
        assert_eq!(ch["message"]["content"].as_str().map(str::len), Some(4));
    }
    assert_eq!(r["data"]["usage"]["completion_tokens"], 12);
    assert_eq!(h.received(c).len(), 1, "one frame: the reply");
}

#[test]
fn a_stream_is_chunks_then_done() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(
        c,
        request(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    h.run(50);
    let frames = h.received(c);
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["kind"].as_str()).collect();
    assert_eq!(kinds.last(), Some(&"done"));
    assert!(
        kinds[..kinds.len() - 1].iter().all(|k| *k == "chunk"),
        "{kinds:?}"
    );
    let usage = &frames[frames.len() - 2]["data"];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
}

#[test]
fn an_engine_failure_is_a_500_and_a_shutdown_a_503() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, request(json!({"max_tokens": 50})));
    h.run(2);
    let step = h.pending_step.take().expect("a step");
    h.input(Input::EngineFault(EngineFault {
        step_id: step.step_id,
        kind: EngineFaultKind::Internal("boom".into()),
    }));
    let e = last(&h, c);
    assert_eq!(
        (e["kind"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(500)),
        "{e}"
    );
    assert_eq!(e["data"]["error"]["type"], "server_error");

    let mut h = harness(HostConfig {
        shutdown_grace: Duration::from_millis(15),
        ..HostConfig::default()
    });
    let c = open(&mut h, 1);
    h.send(c, request(json!({"max_tokens": 200})));
    h.run(2);
    h.input(Input::Shutdown);
    h.advance(Duration::from_millis(50));
    let e = h
        .received(c)
        .iter()
        .rev()
        .find(|f| f["kind"] == "error")
        .cloned()
        .expect("an error frame");
    assert_eq!(e["status"], 503, "retry elsewhere: {e}");
}

#[test]
fn bad_frames_and_bodies_are_refused_with_their_field() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, json!({"route": "nope"}));
    assert_eq!(last(&h, c)["status"], 400);
    h.send(c, request(json!({"temperature": 9})));
    let e = last(&h, c);
    assert_eq!(e["data"]["error"]["param"], "temperature", "{e}");
    h.send(c, request(json!({"model": "other"})));
    let e = last(&h, c);
    assert_eq!(
        (e["status"].as_u64(), e["data"]["error"]["code"].as_str()),
        (Some(404), Some("model_not_found"))
    );
}
