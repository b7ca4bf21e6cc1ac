//! The `cai` dialect end to end: a real server on a loopback port with a
//! real keys file, real WebSocket clients and the stories260K model, for every
//! flow and error of PROTOCOLS.md's `cai` section, including a text-to-speech
//! style client whose generation gets no compute while its window is full.

use std::path::PathBuf;

use serde_json::{json, Value};
use tokenwire_core::keys::{hash_key, to_hex};
use tokenwire_tests::{
    http, metric, start, stories260k, stories_reference, Client, ModelSource, Received,
    RunningServer,
};

const KEY: &str = "sk-test-0123456789";
const PATH: &str = "/?authorization=Bearer%20sk-test-0123456789&orgId=org_a";

/// A keys file for this test: one key for `org_a` and `org_b`, with `extra`
/// lines (rate limits) appended to its table.
fn keys_file(name: &str, extra: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("tokenwire-cai-{name}-{}.toml", std::process::id()));
    let text = format!(
        "[[key]]\nname = \"test\"\nsha256 = \"{}\"\norgs = [\"org_a\", \"org_b\"]\n{extra}\n",
        to_hex(&hash_key(KEY))
    );
    std::fs::write(&path, text).expect("write the keys file");
    path
}

async fn serve(name: &str, extra: &str) -> Option<(RunningServer, PathBuf)> {
    let dir = stories260k();
    let keys = keys_file(name, extra);
    let k = keys.clone();
    let server = start(ModelSource::Dir(dir), move |c| c.keys = Some(k)).await;
    Some((server, keys))
}

fn completion(rid: &str, prompt: &str, options: Value) -> Value {
    json!({"type":"COMPLETION","requestId":rid,"payload":{"prompt":prompt,"options":options}})
}

async fn error_code(c: &mut Client) -> String {
    let e = c.recv().await;
    assert_eq!(e["type"], "ERROR", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{e}"
    );
    assert!(e["error"]["details"].is_object(), "{e}");
    e["error"]["code"].as_str().unwrap_or("").to_string()
}

fn of<'a>(frames: &'a [Value], kind: &str) -> Vec<&'a Value> {
    frames.iter().filter(|f| f["type"] == kind).collect()
}

fn chunks_text(frames: &[Value]) -> String {
    of(frames, "CONTENT_CHUNK")
        .iter()
        .filter_map(|f| f["payload"]["content"].as_str())
        .collect()
}

fn sentences(frames: &[Value]) -> Vec<String> {
    of(frames, "SENTENCE_BOUNDARY")
        .iter()
        .filter_map(|f| f["payload"]["sentence"].as_str().map(str::to_string))
        .collect()
}

async fn tokens_generated(server: &RunningServer) -> f64 {
    let m = http(server, "GET", "/metrics", None).await;
    metric(&m.body, "tokenwire_tokens_generated_total").unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_closes_with_the_contracts_codes_and_a_plain_get_is_not_the_dialect() {
    let dir = stories260k();
    let without = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&without, PATH).await;
    assert!(
        matches!(c.next().await, Received::Close(1008, _)),
        "no keys file: no anonymous mode"
    );
    without.shutdown().await;

    let Some((server, keys)) = serve("auth", "").await else {
        return;
    };
    for (path, code) in [
        ("/", 4001),
        ("/?orgId=org_a", 4001),
        ("/?authorization=Bearer%20wrong&orgId=org_a", 4001),
        ("/?authorization=sk-test-0123456789", 4002),
        ("/?authorization=sk-test-0123456789&orgId=org_zzz", 4003),
    ] {
        let mut c = Client::connect(&server, path).await;
        c.send(completion("r", "hi", json!({}))).await;
        match c.next().await {
            Received::Close(got, _) => assert_eq!(got, code, "{path}"),
            other => panic!("{path}: expected close {code}, got {other:?}"),
        }
    }
    // The bare key (no Bearer) works, and nothing is sent on success.
    let mut ok = Client::connect(&server, "/?authorization=sk-test-0123456789&orgId=org_b").await;
    ok.send(completion("r", "Once upon a time", json!({"maxTokens": 4})))
        .await;
    assert_eq!(
        ok.recv().await["type"],
        "STREAM_START",
        "the first frame answers the request"
    );
    // A plain GET / is not an upgrade: it never reaches the dialect.
    let page = http(&server, "GET", "/", None).await;
    assert_ne!(page.status, 101);
    assert!(!page.body.contains("RATE_LIMITED"));
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_streams_the_golden_greedy_text_with_its_sentences() {
    let Some((server, keys)) = serve("golden", "").await else {
        return;
    };
    let reference = stories_reference(&stories260k());
    let mut c = Client::connect(&server, PATH).await;
    // No chat template in stories260K: a lone user message is the prompt as given.
    c.send(completion(
        "g",
        "Once upon a time",
        json!({"maxTokens": 64, "temperature": 0}),
    ))
    .await;
    let frames = c.recv_until(&["STREAM_COMPLETE", "ERROR"]).await;
    let start_ts = frames[0]["timestamp"].as_str().unwrap_or("");
    assert_eq!(frames[0]["type"], "STREAM_START");
    assert!(
        start_ts.ends_with('Z') && start_ts.len() == 24,
        "{start_ts}"
    );
    let done = frames.last().expect("complete");
    assert_eq!(done["type"], "STREAM_COMPLETE", "{done}");
    let full = done["payload"]["fullContent"].as_str().unwrap_or("");
    assert_eq!(
        format!("Once upon a time{full}"),
        reference["full_text"].as_str().expect("full_text")
    );
    assert_eq!(chunks_text(&frames), full);
    for (i, k) in of(&frames, "CONTENT_CHUNK").iter().enumerate() {
        assert_eq!(k["payload"]["index"], i as u64);
    }
    let said = sentences(&frames);
    assert!(said.len() >= 2, "{said:?}");
    assert_eq!(said.concat(), full.trim_end());
    assert_eq!(done["payload"]["usage"]["promptTokens"], 5);
    assert_eq!(done["payload"]["usage"]["completionTokens"], 64);
    assert_eq!(done["payload"]["usage"]["totalTokens"], 69);
    assert_eq!(done["payload"]["finishReason"], "length");
    assert_eq!(done["payload"]["model"], "stories260K");

    c.send(completion(
        "quiet",
        "Once upon a time",
        json!({"maxTokens": 8, "stream": false}),
    ))
    .await;
    let only = c.recv().await;
    assert_eq!(
        only["type"], "STREAM_COMPLETE",
        "stream false: only the completion"
    );
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

/// The next frame for `request_id` whose type is one of `types`, skipping
/// any other request's frames.
async fn recv_for(c: &mut Client, request_id: &str, types: &[&str]) -> Value {
    loop {
        let v = c.recv().await;
        if v["requestId"] == request_id && types.contains(&v["type"].as_str().unwrap_or("")) {
            return v;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_over_the_socket_and_the_connection_stays() {
    let Some((server, keys)) = serve("errors", "requests_per_minute = 8").await else {
        return;
    };
    let mut c = Client::connect(&server, PATH).await;
    c.send_binary(vec![1, 2]).await;
    assert_eq!(error_code(&mut c).await, "INVALID_REQUEST");
    c.send_text("{nope").await;
    assert_eq!(error_code(&mut c).await, "INVALID_REQUEST");
    c.send(json!({"type":"COMPLETION","requestId":"r","payload":{"prompt": 7}}))
        .await;
    assert_eq!(error_code(&mut c).await, "INVALID_PAYLOAD");
    c.send(json!({"type":"COMPLETION","requestId":"r","payload":{"prompt":"x","model":"gpt-4"}}))
        .await;
    assert_eq!(error_code(&mut c).await, "MODEL_NOT_FOUND");
    c.send(completion("r", &"word ".repeat(600), json!({})))
        .await;
    assert_eq!(error_code(&mut c).await, "CONTEXT_TOO_LONG");
    c.send(json!({"type":"INTERRUPTED","requestId":"nobody"}))
        .await;
    assert_eq!(error_code(&mut c).await, "INVALID_REQUEST");
    // Five in flight against a limit of four; a duplicate id among them.
    for i in 0..4 {
        c.send(completion(
            &format!("f{i}"),
            "Once",
            json!({"maxTokens": 40, "window": 1}),
        ))
        .await;
    }
    c.send(completion("f0", "Once", json!({}))).await;
    c.send(completion("f4", "Once", json!({}))).await;
    let mut codes = Vec::new();
    while codes.len() < 2 {
        let v = c.recv().await;
        if v["type"] == "ERROR" {
            codes.push((
                v["requestId"].as_str().unwrap_or("").to_string(),
                v["error"]["code"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    assert_eq!(
        codes,
        vec![
            ("f0".to_string(), "INVALID_REQUEST".to_string()),
            ("f4".to_string(), "RATE_LIMITED".to_string())
        ]
    );
    // The organisation's eight requests a minute are spent (the refused
    // ones counted too, except those refused before the meter): next is
    // limited with the wait.
    let mut limited = None;
    // Frames are matched by request id: an interrupted stream's last frames
    // may still arrive after its acknowledgement.
    for i in 0..8 {
        let f = format!("f{}", i % 4);
        c.send(json!({"type":"INTERRUPTED","requestId": f})).await;
        let _ = recv_for(&mut c, &f, &["INTERRUPTED_ACK", "ERROR"]).await;
        let m = format!("m{i}");
        c.send(completion(
            &m,
            "Once",
            json!({"maxTokens": 1, "stream": false}),
        ))
        .await;
        let v = recv_for(&mut c, &m, &["STREAM_COMPLETE", "ERROR"]).await;
        if v["type"] == "ERROR" {
            assert_eq!(v["error"]["code"], "RATE_LIMITED", "{v}");
            limited = v["error"]["details"]["retryAfterMs"].as_u64();
            break;
        }
    }
    let wait = limited.expect("the per-minute limit was reached");
    assert!(wait > 0 && wait <= 60_000 / 8, "{wait}");
    // Every error left the connection open.
    c.send(json!({"type":"AWAIT_MORE","requestId":"nobody"}))
        .await;
    let e = recv_for(&mut c, "nobody", &["ERROR"]).await;
    assert_eq!(e["error"]["code"], "INVALID_REQUEST", "{e}");
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_is_acknowledged_with_the_partial_content_and_nothing_follows() {
    let Some((server, keys)) = serve("interrupt", "").await else {
        return;
    };
    let mut c = Client::connect(&server, PATH).await;
    c.send(completion(
        "r",
        "Once upon a time",
        json!({"maxTokens": 200, "window": 3}),
    ))
    .await;
    let mut frames = Vec::new();
    while of(&frames, "CONTENT_CHUNK").len() < 3 {
        frames.push(c.recv().await);
    }
    c.send(json!({"type":"INTERRUPTED","requestId":"r"})).await;
    let rest = c.recv_until(&["INTERRUPTED_ACK"]).await;
    let ack = rest.last().expect("ack");
    let partial = ack["payload"]["partialContent"].as_str().unwrap_or("");
    assert!(partial.starts_with(&chunks_text(&frames)), "{ack}");
    assert!(ack["payload"]["tokensGenerated"].as_u64().unwrap_or(0) >= 3);
    // A new request on the same connection is the next thing that arrives.
    c.send(completion(
        "next",
        "Once",
        json!({"maxTokens": 2, "stream": false}),
    ))
    .await;
    let v = c.recv().await;
    assert_eq!(
        (v["type"].as_str(), v["requestId"].as_str()),
        (Some("STREAM_COMPLETE"), Some("next"))
    );
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

/// A text-to-speech client: it asks for one sentence at a time and
/// completes each as it "speaks" it. While it speaks, its generation gets no
/// compute: another request runs to the end and the server's generated-token
/// count moves by exactly that request's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speaking_clients_generation_is_paused_while_its_sentence_window_is_full() {
    let Some((server, keys)) = serve("tts", "").await else {
        return;
    };
    let mut tts = Client::connect(&server, PATH).await;
    tts.send(completion(
        "speech",
        "Once upon a time",
        json!({"maxTokens": 120, "temperature": 0, "sentenceWindow": 1}),
    ))
    .await;
    let mut frames = tts.recv_until(&["SENTENCE_BOUNDARY"]).await;

    let mut other = Client::connect(&server, PATH).await;
    for (rid, n) in [("warm", 8u64), ("measured", 24)] {
        let before = tokens_generated(&server).await;
        other
            .send(completion(
                rid,
                "Once",
                json!({"maxTokens": n, "stream": false}),
            ))
            .await;
        let done = other.recv().await;
        assert_eq!(done["payload"]["usage"]["completionTokens"], n, "{done}");
        if rid == "measured" {
            let after = tokens_generated(&server).await;
            assert_eq!(
                after - before,
                n as f64,
                "only the other request was computed while the speaker's window was full"
            );
        }
    }

    // Speak each sentence; the stream goes on one sentence at a time.
    let mut spoken = 0u64;
    loop {
        let said = of(&frames, "SENTENCE_BOUNDARY").len() as u64;
        assert!(said <= spoken + 1, "never more than one sentence ahead");
        if frames
            .last()
            .is_some_and(|f| f["type"] == "STREAM_COMPLETE")
        {
            break;
        }
        tts.send(json!({"type":"SENTENCE_COMPLETED","requestId":"speech",
                        "payload":{"sentenceIndex": said - 1}}))
            .await;
        spoken = said;
        frames.extend(
            tts.recv_until(&["SENTENCE_BOUNDARY", "STREAM_COMPLETE"])
                .await,
        );
    }
    let done = frames.last().expect("complete");
    let full = done["payload"]["fullContent"].as_str().unwrap_or("");
    assert_eq!(sentences(&frames).concat(), full.trim_end());
    assert_eq!(chunks_text(&frames), full);
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn await_more_paces_chunks_and_conversations_are_kept_per_organisation() {
    let Some((server, keys)) = serve("window", "").await else {
        return;
    };
    let mut c = Client::connect(&server, PATH).await;
    c.send(completion(
        "w",
        "Once upon a time",
        json!({"maxTokens": 20, "window": 4, "temperature": 0}),
    ))
    .await;
    let mut frames = Vec::new();
    let mut acked = 0;
    loop {
        let v = c.recv().await;
        let done = v["type"] == "STREAM_COMPLETE";
        frames.push(v);
        if done {
            break;
        }
        let sent = of(&frames, "CONTENT_CHUNK").len();
        assert!(
            sent <= acked + 4,
            "{sent} chunks sent with {acked} acknowledged"
        );
        if sent == acked + 4 {
            acked = sent - 2;
            c.send(json!({"type":"AWAIT_MORE","requestId":"w",
                          "payload":{"lastReceivedIndex": acked - 1}}))
                .await;
        }
    }
    assert_eq!(
        of(&frames, "CONTENT_CHUNK").len(),
        20,
        "one chunk per token here"
    );

    // A conversation: the second turn's prompt holds the first turn.
    let conv = |rid: &str, prompt: &str| {
        json!({"type":"COMPLETION","requestId":rid,"payload":{"prompt":prompt,
               "conversationId":"c1","options":{"maxTokens":6,"stream":false}}})
    };
    c.send(conv("t1", "Once upon a time")).await;
    let t1 = c.recv().await;
    let p1 = t1["payload"]["usage"]["promptTokens"].as_u64().unwrap_or(0);
    let mut d = Client::connect(&server, PATH).await;
    d.send(conv("t2", "The end")).await;
    let t2 = d.recv().await;
    assert!(
        t2["payload"]["usage"]["promptTokens"].as_u64().unwrap_or(0) > p1 + 6,
        "another connection of the organisation continues it: {t2}"
    );
    let mut e = Client::connect(&server, "/?authorization=sk-test-0123456789&orgId=org_b").await;
    e.send(conv("t3", "Once upon a time")).await;
    let t3 = e.recv().await;
    assert_eq!(
        t3["payload"]["usage"]["promptTokens"], p1,
        "another organisation's is its own"
    );
    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_keys_file_stops_the_server_with_a_message_naming_it() {
    let path = std::env::temp_dir().join(format!("tokenwire-cai-bad-{}.toml", std::process::id()));
    std::fs::write(&path, "[[key]]\nsha256 = \"not hex\"\norgs = [\"o\"]\n").expect("write");
    let p = path.clone();
    let cfg = tokenwire_tests::ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        keys: Some(p),
        ..tokenwire_tests::ServerConfig::default()
    };
    let e = match tokenwire_io::start(cfg).await {
        Ok(_) => panic!("a bad keys file must not start a server"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        e.contains(&path.display().to_string()) && e.contains("sha256"),
        "{e}"
    );
    let _ = std::fs::remove_file(path);
}
