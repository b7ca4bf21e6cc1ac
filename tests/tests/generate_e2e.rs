//! The `generate` dialect end to end: a real server on a loopback port, a real
//! WebSocket client, the real tiny model and the real stories260K model.

use serde_json::{json, Value};
use tokenwire_tests::{
    http, metric, start, stories260k, stories_reference, token_text, Client, ModelSource, Received,
};

fn config(prompt: &str, params: Value) -> Value {
    json!({"type": "config", "prompt": prompt, "parameters": params})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stories260k_greedy_streams_the_golden_text() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Once upon a time",
                  "parameters": {"max_tokens": 64, "temperature": 0},
                  "options": {"include_token_ids": true}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let init = &frames[0];
    assert_eq!(init["type"], "init");
    assert_eq!(init["model"], "stories260K");
    assert_eq!(init["model_info"]["max_tokens"], 512);
    assert_eq!(init["model_info"]["quantization"], "f32");
    let ids: Vec<u64> = frames
        .iter()
        .filter_map(|f| f["token_id"].as_u64())
        .collect();
    // `greedy_ids` holds the prompt's ids then the 64 generated ones.
    let golden_ids: Vec<u64> = reference["greedy_ids"]
        .as_array()
        .expect("golden ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(ids, golden_ids[golden_ids.len() - 64..].to_vec());
    let streamed = token_text(&frames);
    let full = reference["full_text"].as_str().expect("full_text");
    assert_eq!(format!("Once upon a time{streamed}"), full);
    let done = frames.last().expect("completion");
    assert_eq!(done["type"], "completion");
    assert_eq!(done["generated_text"], streamed);
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["usage"]["prompt_tokens"], 5);
    assert_eq!(done["usage"]["completion_tokens"], 64);
    // The request is in the operators' series: end-to-end latency (at
    // least its time to first token), token totals, and the KV usage
    // fraction back to zero once it is done.
    let mut scraped = String::new();
    for _ in 0..2000 {
        scraped = http(&server, "GET", "/metrics", None).await.body;
        if metric(&scraped, "tokenwire_e2e_request_latency_seconds_count") == Some(1.0) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        metric(&scraped, "tokenwire_e2e_request_latency_seconds_count"),
        Some(1.0),
        "{scraped}"
    );
    let e2e = metric(&scraped, "tokenwire_e2e_request_latency_seconds_sum").expect("sum");
    let ttft = metric(&scraped, "tokenwire_time_to_first_token_seconds_sum").expect("ttft");
    assert!(e2e >= ttft && e2e > 0.0, "e2e {e2e} s, ttft {ttft} s");
    assert_eq!(metric(&scraped, "tokenwire_prompt_tokens_total"), Some(5.0));
    assert_eq!(
        metric(&scraped, "tokenwire_completion_tokens_total"),
        Some(64.0)
    );
    assert!(
        metric(&scraped, "tokenwire_kv_cache_usage_ratio").is_some(),
        "{scraped}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stories260k_from_bos_stops_at_the_end_of_the_story() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let golden = reference["bos_only_greedy_text"]
        .as_str()
        .expect("golden text");
    let steps = reference["bos_only_greedy_ids"]
        .as_array()
        .expect("ids")
        .len();
    let mut c = Client::connect(&server, "/generate").await;
    // run.c's 256 steps from BOS: the golden text exactly.
    c.send(config("", json!({"max_tokens": steps, "temperature": 0})))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["generated_text"], golden);
    assert_eq!(token_text(&frames), golden);
    // Left to run, the model ends its story by predicting BOS: finish_reason stop.
    c.send(config("", json!({"max_tokens": 500, "temperature": 0})))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(
        done["finish_reason"], "stop",
        "the model ends its story with BOS"
    );
    let text = done["generated_text"].as_str().expect("text");
    assert!(text.starts_with(golden) && text.len() > golden.len());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clients_at_once_each_get_their_exact_greedy_text() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let prompts = [
        "Once upon a time",
        "The little dog",
        "Lily and Ben",
        "One day, a bird",
        "Tom had a red",
    ];
    // Each prompt alone first.
    let mut alone = Vec::new();
    for p in prompts {
        let mut c = Client::connect(&server, "/generate").await;
        c.send(config(p, json!({"max_tokens": 40, "temperature": 0})))
            .await;
        alone.push(token_text(&c.recv_until(&["completion"]).await));
        c.close().await;
    }
    // Then all at once: they share steps, and each must get exactly the same text.
    let mut clients = Vec::new();
    for p in prompts {
        let mut c = Client::connect(&server, "/generate").await;
        c.send(config(p, json!({"max_tokens": 40, "temperature": 0})))
            .await;
        clients.push(c);
    }
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| tokio::spawn(async move { token_text(&c.recv_until(&["completion"]).await) }))
        .collect();
    for (task, expected) in tasks.into_iter().zip(alone) {
        assert_eq!(task.await.expect("task"), expected);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_flow_error_and_recovery_and_midstream_control() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    // Basic text generation.
    c.send(json!({"type": "config", "prompt": "Write a short story about a robot learning to paint.",
                  "parameters": {"max_tokens": 20, "temperature": 0.7}, "options": {"stream": true}}))
        .await;
    let frames = c.recv_until(&["completion"]).await;
    assert_eq!(frames[0]["type"], "init");
    assert!(frames[0]["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("gen_")));
    let done = frames.last().expect("completion");
    assert_eq!(done["usage"]["completion_tokens"], 20);
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["generated_text"], token_text(&frames));
    // Error and recovery: too much, then reduced.
    c.send(config(
        "Write a story.",
        json!({"max_tokens": 1024, "temperature": 0.7}),
    ))
    .await;
    let err = c.recv().await;
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"], "context_length_exceeded");
    assert_eq!(err["recoverable"], true);
    assert_eq!(err["recovery_action"], "reduce_max_tokens");
    c.send(config(
        "Write a story.",
        json!({"max_tokens": 10, "temperature": 0.7}),
    ))
    .await;
    let frames = c.recv_until(&["completion"]).await;
    assert_eq!(frames[0]["type"], "init");
    // Midstream control: modify, then stop.
    c.send(config(
        "Write a story.",
        json!({"max_tokens": 1000, "temperature": 0.7}),
    ))
    .await;
    assert_eq!(c.recv().await["type"], "init");
    assert_eq!(c.recv().await["type"], "token");
    c.send(json!({"type": "control", "action": "modify", "parameters": {"temperature": 0.9}}))
        .await;
    let ack = c.recv_until(&["status"]).await.pop().expect("status");
    assert_eq!(ack["operation"], "modified");
    assert!((ack["parameters"]["temperature"].as_f64().unwrap_or(0.0) - 0.9).abs() < 1e-6);
    c.send(json!({"type": "control", "action": "stop"})).await;
    let rest = c.recv_until(&["completion"]).await;
    let done = rest.last().expect("completion");
    assert_eq!(done["finish_reason"], "cancelled");
    assert!(done["usage"]["completion_tokens"]
        .as_u64()
        .is_some_and(|n| n < 1000));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_regenerate_over_the_socket() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    // Reference: the same seeded request without pausing.
    let params = json!({"max_tokens": 60, "temperature": 0.8, "seed": 42});
    let mut r = Client::connect(&server, "/generate").await;
    r.send(config("abc", params.clone())).await;
    let reference = token_text(&r.recv_until(&["completion"]).await);

    let mut c = Client::connect(&server, "/generate").await;
    c.send(config("abc", params.clone())).await;
    let mut frames = vec![c.recv().await, c.recv().await];
    c.send(json!({"type": "control", "action": "pause"})).await;
    frames.extend(c.recv_until(&["status"]).await);
    assert_eq!(
        frames.last().map(|f| f["operation"].clone()),
        Some(json!("paused"))
    );
    c.send(json!({"type": "control", "action": "resume"})).await;
    let after = c.recv_until(&["completion"]).await;
    assert!(after.iter().any(|f| f["operation"] == "resumed"));
    frames.extend(after);
    assert_eq!(
        token_text(&frames),
        reference,
        "same seed, same text, pause or not"
    );

    // Regenerate: a new init, and only the new generation completes.
    c.send(config("abc", json!({"max_tokens": 500}))).await;
    let first_init = c.recv().await;
    c.send(json!({"type": "control", "action": "regenerate"}))
        .await;
    let frames = c.recv_until(&["init"]).await;
    assert!(frames.iter().all(|f| f["type"] != "completion"));
    let second_init = frames.last().expect("init").clone();
    assert_ne!(first_init["request_id"], second_init["request_id"]);
    c.send(json!({"type": "control", "action": "stop"})).await;
    let done = c
        .recv_until(&["completion"])
        .await
        .pop()
        .expect("completion");
    assert_eq!(done["request_id"], second_init["request_id"]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_stop_strings_and_feedback_with_the_feedback_log() {
    let dir = std::env::temp_dir().join(format!("tokenwire-fb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let log = dir.join("feedback.jsonl");
    let _ = std::fs::remove_file(&log);
    let log2 = log.clone();
    let server = start(ModelSource::Tiny, move |c| c.feedback_log = Some(log2)).await;
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Hi", "parameters": {"max_tokens": 8, "temperature": 0, "top_logprobs": 2},
                  "options": {"echo_prompt": true, "include_token_ids": true, "include_logprobs": true,
                              "include_timing": true, "include_generated_text": true}}))
        .await;
    let frames = c.recv_until(&["completion"]).await;
    let tokens: Vec<&Value> = frames.iter().filter(|f| f["type"] == "token").collect();
    assert_eq!(tokens.len(), 8);
    let mut cumulative = String::new();
    for t in &tokens {
        cumulative.push_str(t["token"].as_str().expect("token"));
        assert!(t["token_id"].is_u64());
        assert_eq!(t["logprobs"].as_array().map(Vec::len), Some(3));
        assert!(t["timing"]["token_ms"].is_f64());
        assert_eq!(t["generated_text"], cumulative);
    }
    let done = frames.last().expect("completion");
    assert_eq!(done["generated_text"], format!("Hi{cumulative}"));
    assert!(done["timing"]["first_token_ms"].is_f64());

    // Greedy is deterministic: find a substring of the greedy text and stop on it.
    c.send(config("Hi", json!({"max_tokens": 30, "temperature": 0})))
        .await;
    let full = token_text(&c.recv_until(&["completion"]).await);
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    c.send(config(
        "Hi",
        json!({"max_tokens": 30, "temperature": 0, "stop": [stop.clone()]}),
    ))
    .await;
    let frames = c.recv_until(&["completion"]).await;
    let streamed = token_text(&frames);
    let done = frames.last().expect("completion");
    assert_eq!(done["finish_reason"], "stop");
    assert!(
        !streamed.contains(&stop),
        "stop string {stop:?} leaked into {streamed:?}"
    );
    assert_eq!(streamed, full[..full.find(&stop).expect("stop in text")]);

    c.send(json!({"type": "feedback", "rating": -1, "text": "too short", "position": 3}))
        .await;
    let ack = c.recv().await;
    assert_eq!(ack["operation"], "feedback_received");
    c.send(json!({"type": "feedback", "rating": 5})).await;
    assert_eq!(c.recv().await["error"], "invalid_request");
    server.shutdown().await;
    let lines = std::fs::read_to_string(&log).expect("feedback log written");
    let rec: Value =
        serde_json::from_str(lines.lines().next().expect("one line")).expect("JSON line");
    assert_eq!(rec["rating"], -1.0);
    assert_eq!(rec["text"], "too short");
    assert_eq!(rec["position"], 3);
    assert!(rec["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("gen_")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_specific_errors_and_the_connection_stays() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    c.send_binary(vec![1, 2, 3]).await;
    let e = c.recv().await;
    assert_eq!(e["error"], "invalid_request");
    assert!(e["message"].as_str().is_some_and(|m| m.contains("binary")));
    c.send(config("Hi", json!({"max_tokens": 2}))).await;
    c.recv_until(&["completion"]).await;
    let cases = [
        ("{oops", "invalid JSON"),
        (
            r#"{"type":"config","prompt":"x","parameters":{"max_tokens":"ten"}}"#,
            "parameters.max_tokens",
        ),
        (
            r#"{"type":"config","prompt":"x","parameters":{"temperature":true}}"#,
            "parameters.temperature",
        ),
        (r#"{"type":"config","prompt":["x"]}"#, "prompt"),
        (
            r#"{"type":"config","prompt":"x","parameters":{"top_p":1.5}}"#,
            "parameters.top_p",
        ),
        (r#"{"type":"control","action":"pause"}"#, "running"),
    ];
    for (frame, needle) in cases {
        c.send_text(frame).await;
        let e = c.recv().await;
        assert_eq!(e["type"], "error", "{frame}");
        assert_eq!(e["error"], "invalid_request", "{frame}");
        assert_eq!(e["recoverable"], true);
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(needle)),
            "{frame}: {e}"
        );
    }
    c.send(config(&"word ".repeat(300), json!({"max_tokens": 10})))
        .await;
    let e = c.recv().await;
    assert_eq!(e["error"], "context_length_exceeded");
    // Still usable.
    c.send(config("Hi", json!({"max_tokens": 2}))).await;
    assert_eq!(
        c.recv_until(&["completion"])
            .await
            .last()
            .map(|f| f["type"].clone()),
        Some(json!("completion"))
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_that_is_not_config_closes_with_1008() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "control", "action": "stop"})).await;
    let e = c.recv().await;
    assert_eq!(e["error"], "invalid_request");
    assert_eq!(e["recoverable"], false);
    match c.next().await {
        Received::Close(code, _) => assert_eq!(code, 1008),
        other => panic!("expected close 1008, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_closes_with_1009() {
    let server = start(ModelSource::Tiny, |c| c.host.max_frame_bytes = 64 * 1024).await;
    let mut c = Client::connect(&server, "/generate").await;
    let big = format!(
        r#"{{"type":"config","prompt":"{}"}}"#,
        "a".repeat(100 * 1024)
    );
    c.send_text(&big).await;
    match c.next().await {
        Received::Close(code, _) => assert_eq!(code, 1009),
        other => panic!("expected close 1009, got {other:?}"),
    }
    server.shutdown().await;
}

async fn kv_blocks_used(server: &tokenwire_tests::RunningServer) -> f64 {
    let m = http(server, "GET", "/metrics", None).await;
    metric(&m.body, "tokenwire_kv_blocks_used").expect("kv blocks gauge")
}

/// Waits (bounded, on real requests) until the KV gauge reads zero.
async fn kv_blocks_return_to_zero(server: &tokenwire_tests::RunningServer) -> bool {
    for _ in 0..2000 {
        if kv_blocks_used(server).await == 0.0 {
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_mid_generation_frees_every_kv_block() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    c.send(config(
        &"long prompt ".repeat(40),
        json!({"max_tokens": 500}),
    ))
    .await;
    assert_eq!(c.recv().await["type"], "init");
    assert_eq!(c.recv().await["type"], "token");
    assert!(kv_blocks_used(&server).await > 0.0);
    c.abort();
    assert!(
        kv_blocks_return_to_zero(&server).await,
        "KV blocks not freed after disconnect"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_during_prefill_frees_every_kv_block() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let mut c = Client::connect(&server, "/generate").await;
    // ~1000 prompt tokens take two prefill chunks; `init` comes before either runs.
    c.send(config(&"x".repeat(1000), json!({"max_tokens": 20})))
        .await;
    assert_eq!(c.recv().await["type"], "init");
    c.abort();
    assert!(
        kv_blocks_return_to_zero(&server).await,
        "KV blocks not freed after disconnect"
    );
    // The server is still healthy and serves the next client.
    let mut c = Client::connect(&server, "/generate").await;
    c.send(config("Hi", json!({"max_tokens": 3}))).await;
    assert_eq!(
        c.recv_until(&["completion"])
            .await
            .last()
            .map(|f| f["type"].clone()),
        Some(json!("completion"))
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_health_models_generate_and_sse() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let h = http(&server, "GET", "/health", None).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let m = http(&server, "GET", "/v1/models", None).await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tokenwire-tiny");

    let body = json!({"prompt": "Hello", "max_tokens": 7, "temperature": 0}).to_string();
    let r = http(&server, "POST", "/v1/generate", Some(&body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("gen_")));
    assert_eq!(v["usage"]["completion_tokens"], 7);
    let text = v["generated_text"].as_str().expect("text").to_string();

    // The same request over the socket gives the same greedy text.
    let mut c = Client::connect(&server, "/generate").await;
    c.send(config("Hello", json!({"max_tokens": 7, "temperature": 0})))
        .await;
    assert_eq!(token_text(&c.recv_until(&["completion"]).await), text);

    let body =
        json!({"prompt": "Hello", "max_tokens": 7, "temperature": 0, "stream": true}).to_string();
    let r = http(&server, "POST", "/v1/generate", Some(&body)).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    let events = r.sse_events();
    assert_eq!(events[0]["type"], "init");
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(json!("completion"))
    );
    assert_eq!(token_text(&events), text);

    let r = http(&server, "POST", "/v1/generate", Some(r#"{"prompt": 3}"#)).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "invalid_request");
    let r = http(&server, "POST", "/v1/generate", Some("not json")).await;
    assert_eq!(r.status, 400);
    assert_eq!(http(&server, "GET", "/nope", None).await.status, 404);
    server.shutdown().await;
}
