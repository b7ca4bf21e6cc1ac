//! The `session` dialect end to end: a real server on a loopback port, a
//! real WebSocket client and the stories260K model, for every flow and every
//! error code of PROTOCOLS.md's `session` section, and `POST /v1/inference`.

use serde_json::{json, Value};
use tokenwire_tests::{
    http, metric, start, stories260k, stories_reference, Client, ModelSource, Received,
};

fn init(sid: &str, context: Value) -> Value {
    json!({"type":"session_init","session_id":sid,"job_id":"job-1","conversation_context":context})
}

fn prompt(sid: &str, content: &str, index: u64, max_tokens: u32) -> Value {
    json!({"type":"prompt","session_id":sid,"content":content,"message_index":index,
           "max_tokens":max_tokens,"temperature":0})
}

fn chunks_text(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "stream_chunk")
        .filter_map(|f| f["content"].as_str())
        .collect()
}

async fn error_code(c: &mut Client) -> String {
    let e = c.recv().await;
    assert_eq!(e["type"], "error", "{e}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    assert!(e["timestamp"].as_u64().is_some(), "{e}");
    e["code"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_streams_the_golden_greedy_text_then_continues_the_conversation() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(init("golden", json!([]))).await;
    let ready = c.recv().await;
    assert_eq!(ready["type"], "session_ready");
    assert_eq!(ready["message_count"], 0);
    // No chat template: a lone user message is the prompt as given.
    c.send(prompt("golden", "Once upon a time", 0, 64)).await;
    let frames = c.recv_until(&["response", "error"]).await;
    let resp = frames.last().expect("response");
    assert_eq!(resp["type"], "response", "{resp}");
    let full = reference["full_text"].as_str().expect("full_text");
    assert_eq!(
        format!("Once upon a time{}", resp["content"].as_str().unwrap_or("")),
        full
    );
    assert_eq!(chunks_text(&frames), resp["content"].as_str().unwrap_or(""));
    assert!(frames
        .iter()
        .filter(|f| f["type"] == "stream_chunk")
        .all(|f| f["message_index"] == 1));
    assert_eq!(resp["message_index"], 1);
    assert_eq!(resp["tokens_used"], 5 + 64);
    assert_eq!(resp["finish_reason"], "length");

    // The next turn; then the same conversation sent as history in one
    // resume gives the same reply.
    c.send(prompt("golden", "The end", 2, 16)).await;
    let turn2 = c.recv_until(&["response", "error"]).await;
    let reply2 = turn2.last().expect("response")["content"].clone();
    assert_eq!(turn2.last().expect("r")["message_index"], 3);
    let mut d = Client::connect(&server, "/ws/session").await;
    let history = json!([{"role":"user","content":"Once upon a time"},
                         {"role":"assistant","content":resp["content"]}]);
    d.send(
        json!({"type":"session_resume","session_id":"golden-2","job_id":"job-1",
                  "conversation_context":history,"last_message_index":1}),
    )
    .await;
    assert_eq!(d.recv().await["type"], "session_ready");
    d.send(prompt("golden-2", "The end", 2, 16)).await;
    let again = d.recv_until(&["response", "error"]).await;
    assert_eq!(again.last().expect("response")["content"], reply2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_over_the_socket_and_the_connection_stays() {
    let dir = stories260k();
    // Both connections present one key: one principal, one set of session ids.
    let keys = tokenwire_tests::keys_file("session-errors", &[("sk-session", &["org"])]);
    let server = start(ModelSource::Dir(dir), |c| {
        c.job_token_budget = Some(40);
        c.keys = Some(keys);
    })
    .await;
    let auth = [("Authorization", "Bearer sk-session")];
    let mut c = Client::connect_with(&server, "/ws/session", &auth).await;
    let mut other = Client::connect_with(&server, "/ws/session", &auth).await;

    c.send_binary(vec![1, 2, 3]).await;
    assert_eq!(error_code(&mut c).await, "invalid_request");
    c.send_text("{nope").await;
    assert_eq!(error_code(&mut c).await, "invalid_request");
    c.send(prompt("s", "hi", 0, 4)).await;
    assert_eq!(error_code(&mut c).await, "unknown_session");
    c.send(init("s", json!([]))).await;
    assert_eq!(c.recv().await["type"], "session_ready");
    other.send(init("s", json!([]))).await;
    assert_eq!(error_code(&mut other).await, "session_exists");
    c.send(prompt("s", "hi", 3, 4)).await;
    let e = c.recv().await;
    assert_eq!(
        (e["code"].as_str(), e["expected"].as_u64()),
        (Some("message_index_mismatch"), Some(0))
    );
    c.send(prompt("s", &"word ".repeat(600), 0, 4)).await;
    assert_eq!(error_code(&mut c).await, "context_length_exceeded");
    // The job's 40 tokens: a reply clamped to what is left, then refusal.
    c.send(prompt("s", "Once upon a time", 0, 100)).await;
    let frames = c.recv_until(&["response", "error"]).await;
    let r = frames.last().expect("response");
    assert_eq!(r["type"], "response", "{r}");
    assert_eq!(r["tokens_used"], 40);
    c.send(prompt("s", "More", 2, 4)).await;
    assert_eq!(error_code(&mut c).await, "token_budget_exhausted");

    // The connections stayed open through every error.
    other
        .send(json!({"type":"session_end","session_id":"s"}))
        .await;
    assert_eq!(error_code(&mut other).await, "unknown_session");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_stream_fails_the_turn_recoverably_and_closes_1001() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |c| {
        c.host.shutdown_grace = std::time::Duration::ZERO;
    })
    .await;
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(json!([init("t", json!([])), prompt("t", "Once", 0, 500)]))
        .await;
    assert_eq!(c.recv().await["type"], "session_ready");
    assert_eq!(c.recv().await["type"], "stream_chunk");
    server.begin_shutdown();
    let e = loop {
        let v = c.recv().await;
        if v["type"] != "stream_chunk" {
            break v;
        }
    };
    assert_eq!(e["code"], "internal_error", "{e}");
    assert_eq!(e["recoverable"], true);
    assert_eq!(e["session_id"], "t");
    assert!(matches!(c.next().await, Received::Close(1001, _)));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_arrays_end_and_disconnect_over_the_socket() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(json!([
        {"type":"session_init","session_id":"env","timestamp":1,"payload":{"job_id":9,"conversation_context":[{"role":"system","content":"Stories."}]}},
        {"type":"prompt","session_id":"env","timestamp":2,"payload":{"content":"Once","message_index":0,"max_tokens":4,"stream":false}}
    ]))
    .await;
    let ready = c.recv().await;
    assert_eq!(
        (ready["type"].as_str(), ready["message_count"].as_u64()),
        (Some("session_ready"), Some(0))
    );
    assert!(ready["context_tokens"].as_u64().is_some_and(|n| n > 0));
    let r = c.recv().await;
    assert_eq!(r["type"], "response", "stream: false sends no chunks: {r}");
    c.send(json!({"type":"session_end","session_id":"env"}))
        .await;
    assert_eq!(c.recv().await["type"], "session_ended");
    c.send(prompt("env", "x", 2, 1)).await;
    assert_eq!(error_code(&mut c).await, "unknown_session");

    // A disconnect forgets the connection's sessions: the id is free at once.
    c.send(init("gone", json!([]))).await;
    assert_eq!(c.recv().await["type"], "session_ready");
    c.abort();
    assert!(server.wait_for_stats(|s| s.sessions == 0).await);
    let mut d = Client::connect(&server, "/ws/session").await;
    d.send(init("gone", json!([]))).await;
    assert_eq!(d.recv().await["type"], "session_ready");
    let m = http(&server, "GET", "/metrics", None).await.body;
    assert!(
        metric(
            &m,
            "tokenwire_errors_total{dialect=\"session\",code=\"unknown_session\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{m}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_inference_answers_json_and_sse_like_the_socket() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let body =
        json!({"prompt":"Once upon a time","max_tokens":64,"temperature":0,"session_id":"track-1"});
    let r = http(&server, "POST", "/v1/inference", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let full = reference["full_text"].as_str().expect("full_text");
    assert_eq!(
        format!("Once upon a time{}", v["content"].as_str().unwrap_or("")),
        full
    );
    assert_eq!(v["model"], "stories260K");
    assert_eq!(v["tokens_used"], 69);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["session_id"], "track-1");

    let body = json!({"prompt":"And then","max_tokens":8,"temperature":0,"stream":true,
                      "conversation_context":[{"role":"user","content":"Once upon a time"},{"role":"assistant","content":"there was"}]});
    let r = http(&server, "POST", "/v1/inference", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.sse_events();
    let last = events.last().expect("events");
    assert_eq!(last["type"], "response");
    assert_eq!(last["message_index"], 3);
    assert_eq!(chunks_text(&events), last["content"].as_str().unwrap_or(""));

    for (body, status, code) in [
        (r#"{"max_tokens":3}"#.to_string(), 400, "invalid_request"),
        (
            r#"{"prompt":"x","model":"gpt-9"}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"prompt":"word ".repeat(600)}).to_string(),
            400,
            "context_length_exceeded",
        ),
    ] {
        let r = http(&server, "POST", "/v1/inference", Some(&body)).await;
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.json()["code"], code);
    }
    assert_eq!(
        http(&server, "GET", "/v1/inference", None).await.status,
        405
    );
    assert!(
        server
            .wait_for_stats(|s| s.sessions == 0 && s.generations == 0)
            .await
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_full_of_sessions_answers_rate_limited_until_one_ends() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |c| c.host.max_sessions = 1).await;
    let mut a = Client::connect(&server, "/ws/session").await;
    let mut b = Client::connect(&server, "/ws/session").await;
    a.send(init("first", json!([]))).await;
    assert_eq!(a.recv().await["type"], "session_ready");
    b.send(init("second", json!([]))).await;
    let e = b.recv().await;
    assert_eq!(
        (e["code"].as_str(), e["recoverable"].as_bool()),
        (Some("rate_limited"), Some(true))
    );
    a.send(json!({"type":"session_end","session_id":"first"}))
        .await;
    assert_eq!(a.recv().await["type"], "session_ended");
    b.send(init("second", json!([]))).await;
    assert_eq!(b.recv().await["type"], "session_ready");
    server.shutdown().await;
}

/// Signed prompts over a real socket, the client signing with k256 as a
/// wallet would: a valid signature streams the reply; a missing one, one
/// by another key, and one replayed at another index are `invalid_request`
/// with nothing generated; `--require-signatures` refuses a keyless session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_prompts_and_require_signatures() {
    use k256::ecdsa::signature::Signer;
    use k256::ecdsa::{Signature, SigningKey};
    use tokenwire_core::dialect::session::signature::signed_text;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let sk = SigningKey::from_slice(&[5u8; 32]).expect("key");
    let sign = |sk: &SigningKey, index: u64, content: &str| {
        let sig: Signature = sk.sign(signed_text("sig", index, content).as_bytes());
        hex(&sig.to_bytes())
    };
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.tenancy.require_signatures = true
    })
    .await;
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(init("nokey", json!([]))).await;
    assert_eq!(error_code(&mut c).await, "invalid_request");

    let mut i = init("sig", json!([]));
    i["public_key"] = hex(&sk.verifying_key().to_sec1_bytes()).into();
    c.send(i).await;
    assert_eq!(c.recv().await["type"], "session_ready");
    let mut p = prompt("sig", "Once upon a time", 0, 4);
    p["signature"] = sign(&sk, 0, "Once upon a time").into();
    c.send(p).await;
    let frames = c.recv_until(&["response", "error"]).await;
    assert_eq!(
        frames.last().expect("reply")["type"],
        "response",
        "{frames:?}"
    );

    let other = SigningKey::from_slice(&[6u8; 32]).expect("key");
    for signature in [
        None,
        Some(sign(&other, 2, "More")),
        Some(sign(&sk, 0, "More")),
    ] {
        let mut p = prompt("sig", "More", 2, 4);
        if let Some(s) = signature {
            p["signature"] = s.into();
        }
        c.send(p).await;
        assert_eq!(error_code(&mut c).await, "invalid_request");
    }
    let m = http(&server, "GET", "/metrics", None).await.body;
    assert_eq!(
        metric(
            &m,
            "tokenwire_requests_total{dialect=\"session\",outcome=\"completed\"}"
        ),
        Some(1.0),
        "{m}"
    );
    server.shutdown().await;
}
