//! The `responses` dialect end to end with a real WebSocket client and HTTP
//! client against a real server serving stories260K: every flow and error
//! code of PROTOCOLS.md's `responses` section. (The official OpenAI SDK runs
//! the same flows in `sdk_responses.rs`.)

use std::time::Duration;

use serde_json::{json, Value};
use tokenwire_tests::{http, start, stories260k, stories_reference, Client, ModelSource, Received};

fn create(input: Value, max: u32) -> Value {
    json!({"type":"response.create","model":"stories260K","input":input,"max_output_tokens":max,"temperature":0})
}

/// One response's events up to its terminal event, checked: numbered from 0,
/// exactly one terminal event, last.
async fn response(c: &mut Client) -> Vec<Value> {
    let mut evs: Vec<Value> = Vec::new();
    loop {
        let e = c.recv().await;
        assert_ne!(e["type"], "error", "{e}");
        assert_eq!(e["sequence_number"], evs.len() as u64, "{e}");
        let kind = e["type"].as_str().unwrap_or("").to_string();
        evs.push(e);
        if matches!(
            kind.as_str(),
            "response.completed" | "response.incomplete" | "response.failed"
        ) {
            return evs;
        }
    }
}

fn deltas(evs: &[Value]) -> String {
    evs.iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect()
}

async fn error(c: &mut Client) -> (u64, String) {
    let e = c.recv().await;
    assert_eq!(e["type"], "error", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    (
        e["status"].as_u64().unwrap_or(0),
        e["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_streams_the_golden_text_and_continues() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/v1/responses").await;
    c.send(create(json!("Once upon a time"), 64)).await;
    let evs = response(&mut c).await;
    let end = evs.last().expect("terminal");
    assert_eq!(end["type"], "response.incomplete");
    let full = reference["full_text"].as_str().expect("full_text");
    assert_eq!(format!("Once upon a time{}", deltas(&evs)), full);
    let r = &end["response"];
    assert_eq!(r["output"][0]["content"][0]["text"], deltas(&evs).as_str());
    assert_eq!(r["usage"]["input_tokens"], 5);
    assert_eq!(r["usage"]["output_tokens"], 64);
    let id = r["id"].as_str().expect("id").to_string();
    // A continuation: the old conversation plus the new input.
    c.send(json!({"type":"response.create","input":"The end.","previous_response_id":id,"max_output_tokens":8,"temperature":0,"stream_id":"s7"})).await;
    let evs2 = response(&mut c).await;
    assert!(evs2.iter().all(|e| e["stream_id"] == "s7"));
    let r2 = &evs2.last().expect("terminal")["response"];
    assert_eq!(r2["previous_response_id"], id.as_str());
    assert!(r2["usage"]["input_tokens"]
        .as_u64()
        .is_some_and(|n| n > 5 + 64));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_cancel_concurrency_and_warm_up_over_the_socket() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/v1/responses").await;
    c.send_text("{nope").await;
    assert_eq!(error(&mut c).await, (400, "invalid_json".into()));
    c.send(json!({"type":"response.steer","input":"x"})).await;
    assert_eq!(error(&mut c).await, (400, "unknown_event_type".into()));
    c.send(json!({"type":"response.create","input":"x","top_p":0}))
        .await;
    assert_eq!(error(&mut c).await, (400, "invalid_request".into()));
    c.send(json!({"type":"response.create","input":"x","previous_response_id":"resp_missing"}))
        .await;
    assert_eq!(
        error(&mut c).await,
        (404, "previous_response_not_found".into())
    );
    c.send(json!({"type":"response.create","input":"x","model":"gpt-9"}))
        .await;
    assert_eq!(error(&mut c).await, (404, "model_not_found".into()));
    c.send(create(json!("word ".repeat(600)), 16)).await;
    assert_eq!(error(&mut c).await, (400, "context_length_exceeded".into()));

    // A long response; a second create meanwhile is refused, then a cancel.
    c.send(create(json!("Once upon a time"), 400)).await;
    let mut evs = Vec::new();
    for _ in 0..6 {
        evs.push(c.recv().await);
    }
    c.send(create(json!("Another"), 4)).await;
    c.send(json!({"type":"response.cancel"})).await;
    let mut refused = false;
    loop {
        let e = c.recv().await;
        if e["type"] == "error" {
            assert_eq!(e["error"]["code"], "concurrent_request");
            assert_eq!(e["status"], 409);
            refused = true;
            continue;
        }
        let done = e["type"] == "response.incomplete";
        evs.push(e);
        if done {
            break;
        }
    }
    assert!(refused);
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let end = evs.last().expect("terminal");
    assert_eq!(end["response"]["status"], "cancelled");
    assert_eq!(end["response"]["incomplete_details"], Value::Null);
    assert!(evs.iter().any(|e| e["type"] == "response.output_item.done"));

    // Warm-up, then a continuation from it.
    c.send(json!({"type":"response.create","input":"Once upon a time","generate":false}))
        .await;
    let warm = response(&mut c).await;
    let kinds: Vec<&str> = warm.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["response.created", "response.completed"]);
    let w = &warm[1]["response"];
    assert_eq!(
        (
            w["usage"]["input_tokens"].as_u64(),
            w["usage"]["output_tokens"].as_u64()
        ),
        (Some(5), Some(0))
    );
    let id = w["id"].as_str().expect("id").to_string();
    c.send(json!({"type":"response.create","input":[],"previous_response_id":id,"max_output_tokens":8,"temperature":0})).await;
    let next = response(&mut c).await;
    let text = deltas(&next);
    assert!(text.starts_with(", there was"), "{text:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_is_1013_and_the_lifetime_ends_with_1000() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |c| {
        c.host.max_websocket_connections = 2;
        c.host.responses_expiring_after = Duration::from_secs(1);
        c.host.responses_lifetime = Duration::from_secs(2);
    })
    .await;
    let mut a = Client::connect(&server, "/v1/responses").await;
    let _b = Client::connect(&server, "/v1/responses").await;
    let mut over = Client::connect(&server, "/v1/responses").await;
    assert_eq!(
        error(&mut over).await,
        (503, "websocket_connection_limit_reached".into())
    );
    assert!(matches!(over.next().await, Received::Close(1013, _)));
    // Other dialects are not counted against it.
    let mut g = Client::connect(&server, "/ws/session").await;
    g.send(json!({"type":"session_end","session_id":"x"})).await;
    assert_eq!(g.recv().await["code"], "unknown_session");
    let (status, code) = error(&mut a).await;
    assert_eq!((status, code.as_str()), (400, "connection_expiring"));
    assert!(matches!(a.next().await, Received::Close(1000, _)));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_create_stream_store_retrieve_and_continue() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let body = json!({"model":"stories260K","input":"Once upon a time","max_output_tokens":8,"temperature":0});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let resp = r.json();
    assert_eq!(resp["object"], "response");
    assert_eq!(resp["status"], "incomplete");
    let id = resp["id"].as_str().expect("id").to_string();
    let got = http(&server, "GET", &format!("/v1/responses/{id}"), None).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), resp);
    let body = json!({"input":"Then","previous_response_id":id,"max_output_tokens":4,"temperature":0,"stream":true});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("x-accel-buffering"), Some("no"));
    assert!(
        r.body.starts_with("event: response.created\ndata: "),
        "{}",
        r.body
    );
    let events = r.sse_events();
    assert_eq!(
        events.first().map(|e| e["type"].clone()),
        Some(json!("response.created"))
    );
    assert!(matches!(
        events.last().and_then(|e| e["type"].as_str()),
        Some("response.incomplete" | "response.completed")
    ));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let body = json!({"input":"x","previous_response_id":"resp_gone","stream":true});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 404, "an error before the stream is an HTTP error");
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    assert_eq!(
        http(&server, "GET", "/v1/responses/resp_gone", None)
            .await
            .status,
        404
    );
    assert_eq!(
        http(&server, "PUT", "/v1/responses", Some("{}"))
            .await
            .status,
        405
    );
    assert_eq!(
        http(&server, "POST", "/v1/responses", Some("{"))
            .await
            .json()["error"]["code"],
        "invalid_json"
    );
    server.shutdown().await;
}

/// `include: ["message.output_text.logprobs"]` with `top_logprobs`: every
/// output token's entry, the same as Chat Completions gives for the same
/// conversation, in the message's content part (with `bytes`) and, over
/// the socket, in the text deltas and the text's `done` event (without,
/// as the API's event types have them); none without `include`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_text_logprobs_match_chat_completions() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let body = json!({"model":"stories260K","input":"Once upon a time","max_output_tokens":8,
        "temperature":0,"top_logprobs":3,"include":["message.output_text.logprobs"]});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let resp = r.json();
    assert_eq!(resp["top_logprobs"], 3);
    let part = &resp["output"][0]["content"][0];
    let entries = part["logprobs"].as_array().expect("logprobs").clone();
    assert_eq!(entries.len(), 8, "{part}");
    // The store keeps the text, not the logprobs.
    let id = resp["id"].as_str().expect("id");
    let stored = http(&server, "GET", &format!("/v1/responses/{id}"), None)
        .await
        .json();
    assert_eq!(stored["output"][0]["content"][0]["text"], part["text"]);
    assert_eq!(stored["output"][0]["content"][0]["logprobs"], json!([]));
    let joined: String = entries
        .iter()
        .map(|e| e["token"].as_str().expect("token"))
        .collect();
    assert_eq!(joined, part["text"].as_str().expect("text"));
    for e in &entries {
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 3, "{e}");
        // Greedy: the token is the most likely one.
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert!(e["bytes"].is_array() && top[0]["bytes"].is_array(), "{e}");
    }
    let chat = json!({"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"}],
        "max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":3});
    let c = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat.to_string()),
    )
    .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(
        c.json()["choices"][0]["logprobs"]["content"],
        Value::Array(entries.clone())
    );
    // Over the socket: the deltas' entries are the done event's, and the
    // part's without `bytes`.
    let mut ws = Client::connect(&server, "/v1/responses").await;
    let mut create = create(json!("Once upon a time"), 8);
    create["include"] = json!(["message.output_text.logprobs"]);
    create["top_logprobs"] = json!(2);
    ws.send(create).await;
    let evs = response(&mut ws).await;
    let streamed: Vec<Value> = evs
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .flat_map(|e| e["logprobs"].as_array().cloned().unwrap_or_default())
        .collect();
    let done = evs
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .expect("done");
    assert_eq!(Value::Array(streamed.clone()), done["logprobs"]);
    assert_eq!(streamed.len(), 8);
    for (s, e) in streamed.iter().zip(&entries) {
        assert_eq!((&s["token"], &s["logprob"]), (&e["token"], &e["logprob"]));
        assert!(s.get("bytes").is_none(), "{s}");
        assert_eq!(s["top_logprobs"].as_array().map(Vec::len), Some(2));
    }
    // Without `include` (or a `top_logprobs` above 0), none.
    let plain = json!({"model":"stories260K","input":"Once upon a time","max_output_tokens":4,"temperature":0});
    let r = http(&server, "POST", "/v1/responses", Some(&plain.to_string())).await;
    let v = r.json();
    assert_eq!(v["output"][0]["content"][0]["logprobs"], json!([]));
    assert_eq!(v["top_logprobs"], Value::Null);
    let bad = json!({"model":"stories260K","input":"x","top_logprobs":21});
    let r = http(&server, "POST", "/v1/responses", Some(&bad.to_string())).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "top_logprobs");
    server.shutdown().await;
}
