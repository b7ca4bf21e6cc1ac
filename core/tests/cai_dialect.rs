//! The `cai` dialect against PROTOCOLS.md, driven through a Host with a
//! scripted engine and virtual time (no sockets): authentication and its close
//! codes, the stream and its sentence boundaries, every error code,
//! interruption, flow-control windows that stop the engine computing, kept
//! conversations and per-organisation rate limits.

use serde_json::{json, Value};
use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
use tokenwire_core::testing::Harness;
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig, Input, Output};

/// Sentences with a number and an abbreviation in them, so the splitter
/// has work to do.
const SCRIPT: &str = "It is 3.14 now. Take e.g. this one! Is it? Yes. ";
const QUERY: &str = "authorization=Bearer%20secret-1&orgId=org_a";

fn keys(rpm: Option<u64>, tpm: Option<u64>) -> KeyRing {
    KeyRing::new(vec![ApiKey {
        name: "test".into(),
        sha256: hash_key("secret-1"),
        orgs: vec!["org_a".into(), "org_b".into()],
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
    }])
    .expect("ring")
}

fn config() -> HostConfig {
    HostConfig {
        keys: Some(keys(None, None)),
        ..HostConfig::default()
    }
}

fn harness_with(config: HostConfig) -> (Harness, ConnId) {
    let mut h = Harness::new(config, SCRIPT, 1);
    let c = h.open_with(1, Dialect::Cai, QUERY);
    assert!(h.closes.is_empty(), "authenticated: {:?}", h.closes);
    (h, c)
}

fn harness() -> (Harness, ConnId) {
    harness_with(config())
}

fn completion(rid: &str, prompt: &str, options: Value) -> Value {
    json!({"type":"COMPLETION","requestId":rid,"payload":{"prompt":prompt,"options":options}})
}

fn of(h: &Harness, c: ConnId, kind: &str, rid: &str) -> Vec<Value> {
    h.of_type(c, kind)
        .into_iter()
        .filter(|v| v["requestId"] == rid)
        .collect()
}

fn error_codes(h: &Harness, c: ConnId) -> Vec<String> {
    h.of_type(c, "ERROR")
        .iter()
        .map(|e| e["error"]["code"].as_str().unwrap_or("").to_string())
        .collect()
}

fn chunks_text(h: &Harness, c: ConnId, rid: &str) -> String {
    of(h, c, "CONTENT_CHUNK", rid)
        .iter()
        .filter_map(|v| v["payload"]["content"].as_str().map(str::to_string))
        .collect()
}

/// Runs steps one at a time, returning how many of them computed anything
/// for any sequence.
fn run_counting(h: &mut Harness, max: usize) -> usize {
    let mut computing = 0;
    for _ in 0..max {
        if h.pending_step.as_ref().is_some_and(|p| !p.seqs.is_empty()) {
            computing += 1;
        }
        if !h.step() {
            break;
        }
    }
    computing
}

#[test]
fn every_upgrade_is_refused_without_a_keys_file_and_bad_credentials_get_their_codes() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let c = h.open_with(1, Dialect::Cai, QUERY);
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1008));
    let mut h = Harness::new(config(), SCRIPT, 1);
    let cases = [
        ("", 4001),
        ("orgId=org_a", 4001),
        ("authorization=Bearer%20wrong&orgId=org_a", 4001),
        ("authorization=secret-1", 4002),
        ("authorization=secret-1&orgId=org_zzz", 4003),
    ];
    for (i, (q, code)) in cases.iter().enumerate() {
        let c = h.open_with(10 + i as u64, Dialect::Cai, q);
        assert_eq!(h.closes.get(&c).map(|c| c.0), Some(*code), "query {q:?}");
        h.send(c, completion("r", "hi", json!({})));
        assert!(
            h.received(c).is_empty(),
            "nothing reaches a refused connection"
        );
    }
    let c = h.open_with(99, Dialect::Cai, "authorization=secret-1&orgId=org_b");
    assert!(!h.closes.contains_key(&c));
    assert!(h.received(c).is_empty(), "no acknowledgment on success");
}

#[test]
fn a_completion_streams_chunks_and_sentences_that_add_up_to_the_full_content() {
    let (mut h, c) = harness();
    h.send(
        c,
        completion("r1", "hi", json!({"maxTokens": 40, "temperature": 0})),
    );
    h.run(100);
    let start = of(&h, c, "STREAM_START", "r1");
    assert_eq!(start.len(), 1);
    let ts = start[0]["timestamp"].as_str().expect("timestamp");
    assert!(
        ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
        "ISO 8601 with milliseconds: {ts}"
    );
    let chunks = of(&h, c, "CONTENT_CHUNK", "r1");
    for (i, k) in chunks.iter().enumerate() {
        assert_eq!(k["payload"]["index"], i as u64);
    }
    let done = of(&h, c, "STREAM_COMPLETE", "r1");
    assert_eq!(done.len(), 1);
    let p = &done[0]["payload"];
    let full = p["fullContent"].as_str().expect("fullContent");
    assert_eq!(full.len(), 40);
    assert_eq!(chunks_text(&h, c, "r1"), full);
    assert_eq!(p["finishReason"], "length");
    assert_eq!(p["model"], "tiny");
    assert_eq!(p["usage"]["completionTokens"], 40);
    assert_eq!(
        p["usage"]["totalTokens"],
        p["usage"]["promptTokens"].as_u64().unwrap_or(0) + 40
    );
    let sentences: Vec<String> = of(&h, c, "SENTENCE_BOUNDARY", "r1")
        .iter()
        .enumerate()
        .map(|(i, s)| {
            assert_eq!(s["payload"]["sentenceIndex"], i as u64);
            s["payload"]["sentence"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert!(sentences.len() >= 3, "{sentences:?}");
    assert_eq!(sentences.concat(), full.trim_end());
    assert!(
        sentences
            .iter()
            .all(|s| !s.ends_with("3.") && !s.ends_with("e.g.")),
        "never inside a number or after an abbreviation: {sentences:?}"
    );
    let last = h.received(c).last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["type"], "STREAM_COMPLETE", "nothing after the end");
}

#[test]
fn stream_false_sends_only_the_completion() {
    let (mut h, c) = harness();
    h.send(
        c,
        completion("r1", "hi", json!({"maxTokens": 20, "stream": false})),
    );
    h.run(100);
    let kinds: Vec<&str> = h
        .received(c)
        .iter()
        .filter_map(|v| v["type"].as_str())
        .collect();
    assert_eq!(kinds, vec!["STREAM_COMPLETE"]);
}

#[test]
fn every_error_names_what_was_wrong_and_the_connection_stays_open() {
    let (mut h, c) = harness();
    let cases: Vec<(Value, &str, Option<&str>, &str)> = vec![
        (json!("not an object"), "INVALID_REQUEST", None, "object"),
        (
            json!({"type":"HELLO","requestId":"r"}),
            "INVALID_REQUEST",
            Some("r"),
            "HELLO",
        ),
        (
            json!({"type":"COMPLETION"}),
            "INVALID_REQUEST",
            None,
            "requestId",
        ),
        (
            json!({"type":"COMPLETION","requestId":"r"}),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload",
        ),
        (
            json!({"type":"COMPLETION","requestId":"r","payload":{}}),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload.prompt",
        ),
        (
            completion("r", "x", json!({"temperature": 3})),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload.options.temperature",
        ),
        (
            completion("r", "x", json!({"stream": "yes"})),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload.options.stream",
        ),
        (
            completion("r", "x", json!({"window": 0})),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload.options.window",
        ),
        (
            json!({"type":"COMPLETION","requestId":"r","payload":{"prompt":"x","context":[{"role":"robot","content":"x"}]}}),
            "INVALID_PAYLOAD",
            Some("r"),
            "payload.context[0].role",
        ),
        (
            json!({"type":"COMPLETION","requestId":"r","payload":{"prompt":"x","model":"gpt-4"}}),
            "MODEL_NOT_FOUND",
            Some("r"),
            "gpt-4",
        ),
        (
            completion("r", &"x".repeat(600), json!({})),
            "CONTEXT_TOO_LONG",
            Some("r"),
            "context",
        ),
        (
            json!({"type":"INTERRUPTED","requestId":"nope"}),
            "INVALID_REQUEST",
            Some("nope"),
            "in flight",
        ),
        (
            json!({"type":"SENTENCE_COMPLETED","requestId":"nope","payload":{}}),
            "INVALID_PAYLOAD",
            Some("nope"),
            "sentenceIndex",
        ),
    ];
    for (frame, code, rid, needle) in cases {
        let before = h.received(c).len();
        h.send(c, frame.clone());
        let got = &h.received(c)[before..];
        assert_eq!(got.len(), 1, "{frame}: {got:?}");
        let e = &got[0];
        assert_eq!(e["type"], "ERROR", "{frame}");
        assert_eq!(e["error"]["code"], code, "{frame}: {e}");
        assert_eq!(e["requestId"].as_str(), rid, "{frame}");
        let message = e["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(needle), "{frame}: {message}");
        assert!(e["error"]["details"].is_object());
    }
    h.input(Input::Binary { conn: c, len: 3 });
    assert_eq!(
        error_codes(&h, c).last().map(String::as_str),
        Some("INVALID_REQUEST")
    );
    assert!(h.closes.is_empty(), "still open");
    h.send(c, completion("ok", "hi", json!({"maxTokens": 3})));
    h.run(20);
    assert_eq!(
        of(&h, c, "STREAM_COMPLETE", "ok").len(),
        1,
        "and still serving"
    );
}

#[test]
fn in_flight_requests_are_bounded_and_ids_unique_among_them() {
    let (mut h, c) = harness_with(HostConfig {
        cai_max_inflight: 2,
        ..config()
    });
    h.send(c, completion("a", "hi", json!({"maxTokens": 30})));
    h.send(c, completion("a", "hi", json!({"maxTokens": 30})));
    assert_eq!(error_codes(&h, c), vec!["INVALID_REQUEST"]);
    h.send(c, completion("b", "hi", json!({"maxTokens": 30})));
    h.send(c, completion("c", "hi", json!({"maxTokens": 30})));
    assert_eq!(error_codes(&h, c), vec!["INVALID_REQUEST", "RATE_LIMITED"]);
    let e = h.of_type(c, "ERROR").pop().unwrap_or(Value::Null);
    assert_eq!(e["requestId"], "c");
    assert_eq!(e["error"]["details"]["maxInflight"], 2);
    h.run(200);
    assert_eq!(of(&h, c, "STREAM_COMPLETE", "a").len(), 1);
    assert_eq!(of(&h, c, "STREAM_COMPLETE", "b").len(), 1);
    h.send(c, completion("a", "hi", json!({"maxTokens": 2})));
    h.run(20);
    assert_eq!(
        of(&h, c, "STREAM_COMPLETE", "a").len(),
        2,
        "a finished id may be used again"
    );
}

#[test]
fn an_interrupt_stops_the_generation_and_is_acknowledged_instead_of_a_completion() {
    let (mut h, c) = harness();
    h.send(c, completion("r1", "hi", json!({"maxTokens": 200})));
    h.run(10);
    let sent = chunks_text(&h, c, "r1");
    h.send(c, json!({"type":"INTERRUPTED","requestId":"r1"}));
    let ack = of(&h, c, "INTERRUPTED_ACK", "r1");
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0]["payload"]["partialContent"], sent.as_str());
    assert_eq!(
        ack[0]["payload"]["tokensGenerated"].as_u64(),
        Some(sent.len() as u64)
    );
    let computing = run_counting(&mut h, 20);
    assert!(
        computing <= 1,
        "the generation stopped ({computing} steps computed)"
    );
    assert!(of(&h, c, "STREAM_COMPLETE", "r1").is_empty());
    assert!(of(&h, c, "CONTENT_CHUNK", "r1").len() <= sent.len() + 1);
    h.send(c, json!({"type":"INTERRUPTED","requestId":"r1"}));
    assert_eq!(
        error_codes(&h, c),
        vec!["INVALID_REQUEST"],
        "no longer in flight"
    );
    h.send(
        c,
        json!({"type":"SENTENCE_COMPLETED","requestId":"r1","payload":{"sentenceIndex":0}}),
    );
    assert_eq!(
        error_codes(&h, c).len(),
        1,
        "a late acknowledgement is quietly accepted"
    );
}

#[test]
fn a_full_chunk_window_stops_compute_until_await_more() {
    let (mut h, c) = harness();
    h.send(
        c,
        completion("r1", "hi", json!({"maxTokens": 30, "window": 4})),
    );
    let computing = run_counting(&mut h, 50);
    let n = of(&h, c, "CONTENT_CHUNK", "r1").len();
    assert_eq!(n, 4, "exactly the window");
    assert!(
        computing <= 6,
        "prefill, the window's tokens and at most one in flight: {computing}"
    );
    h.advance(Duration::from_secs(10));
    assert_eq!(
        run_counting(&mut h, 50),
        0,
        "no engine work while the window is full"
    );
    h.send(
        c,
        json!({"type":"AWAIT_MORE","requestId":"r1","payload":{"lastReceivedIndex":1}}),
    );
    h.run(50);
    assert_eq!(of(&h, c, "CONTENT_CHUNK", "r1").len(), 6, "two more");
    h.send(
        c,
        json!({"type":"AWAIT_MORE","requestId":"r1","payload":{"lastReceivedIndex":99}}),
    );
    assert_eq!(error_codes(&h, c), vec!["INVALID_PAYLOAD"]);
    for _ in 0..30 {
        h.send(c, json!({"type":"AWAIT_MORE","requestId":"r1"}));
        h.run(50);
        if !of(&h, c, "STREAM_COMPLETE", "r1").is_empty() {
            break;
        }
    }
    let done = of(&h, c, "STREAM_COMPLETE", "r1");
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0]["payload"]["fullContent"],
        chunks_text(&h, c, "r1").as_str()
    );
    assert_eq!(done[0]["payload"]["usage"]["completionTokens"], 30);
}

#[test]
fn a_speaking_client_paces_generation_by_sentences() {
    let (mut h, c) = harness();
    h.send(
        c,
        completion("r1", "hi", json!({"maxTokens": 48, "sentenceWindow": 1})),
    );
    h.run(100);
    let first = of(&h, c, "SENTENCE_BOUNDARY", "r1");
    assert_eq!(first.len(), 1, "one sentence beyond none completed");
    assert_eq!(run_counting(&mut h, 20), 0, "paused while it speaks");
    let mut spoken = 0u64;
    loop {
        let said = of(&h, c, "SENTENCE_BOUNDARY", "r1").len() as u64;
        if !of(&h, c, "STREAM_COMPLETE", "r1").is_empty() {
            break;
        }
        assert!(
            said <= spoken + 1,
            "never more than the window beyond the spoken"
        );
        assert!(spoken < 50, "the stream never finished");
        h.send(c, json!({"type":"SENTENCE_COMPLETED","requestId":"r1","payload":{"sentenceIndex": spoken}}));
        spoken += 1;
        h.run(100);
    }
    let full = of(&h, c, "STREAM_COMPLETE", "r1")[0]["payload"]["fullContent"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let sentences: String = of(&h, c, "SENTENCE_BOUNDARY", "r1")
        .iter()
        .filter_map(|s| s["payload"]["sentence"].as_str().map(str::to_string))
        .collect();
    assert_eq!(sentences, full.trim_end());
}

#[test]
fn a_window_left_full_past_the_pause_timeout_ends_the_request() {
    let (mut h, c) = harness_with(HostConfig {
        pause_timeout: Duration::from_secs(5),
        ..config()
    });
    h.send(
        c,
        completion("r1", "hi", json!({"maxTokens": 30, "window": 2})),
    );
    h.run(50);
    h.advance(Duration::from_secs(6));
    h.run(5);
    assert_eq!(error_codes(&h, c), vec!["GENERATION_FAILED"]);
    assert!(h.of_type(c, "ERROR")[0]["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("window"));
    assert!(of(&h, c, "STREAM_COMPLETE", "r1").is_empty());
}

#[test]
fn conversations_are_kept_per_organisation_until_their_ttl_and_context_replaces_them() {
    let (mut h, c) = harness_with(HostConfig {
        conversation_ttl: Duration::from_secs(60),
        ..config()
    });
    let prompt_tokens = |h: &Harness, rid: &str| -> u64 {
        of(h, c, "STREAM_COMPLETE", rid)[0]["payload"]["usage"]["promptTokens"]
            .as_u64()
            .unwrap_or(0)
    };
    let conv = |rid: &str, prompt: &str| json!({"type":"COMPLETION","requestId":rid,"payload":{"prompt":prompt,"conversationId":"conv1","options":{"maxTokens":5}}});
    h.send(c, conv("r1", "hello"));
    h.run(20);
    let p1 = prompt_tokens(&h, "r1");
    h.send(c, conv("r2", "again"));
    h.run(20);
    let reply1 = of(&h, c, "STREAM_COMPLETE", "r1")[0]["payload"]["fullContent"]
        .as_str()
        .unwrap_or("")
        .len() as u64;
    // The byte codec joins messages with newlines: hello, the reply, again.
    assert_eq!(prompt_tokens(&h, "r2"), p1 + 1 + reply1 + 1 + 5);
    // Another organisation's connection does not see it.
    let other = h.open_with(2, Dialect::Cai, "authorization=secret-1&orgId=org_b");
    h.send(other, conv("r3", "hello"));
    h.run(20);
    assert_eq!(
        of(&h, other, "STREAM_COMPLETE", "r3")[0]["payload"]["usage"]["promptTokens"],
        p1
    );
    // A context replaces the kept conversation.
    h.send(c, json!({"type":"COMPLETION","requestId":"r4","payload":{"prompt":"hello","conversationId":"conv1","context":[],"options":{"maxTokens":5}}}));
    h.run(20);
    assert_eq!(prompt_tokens(&h, "r4"), p1);
    // Past the TTL it is gone.
    h.advance(Duration::from_secs(61));
    h.send(c, conv("r5", "hello"));
    h.run(20);
    assert_eq!(prompt_tokens(&h, "r5"), p1);
}

#[test]
fn each_organisation_is_held_to_its_requests_and_tokens_per_minute() {
    let (mut h, c) = harness_with(HostConfig {
        keys: Some(keys(Some(2), None)),
        ..config()
    });
    for rid in ["a", "b", "c"] {
        h.send(c, completion(rid, "hi", json!({"maxTokens": 2})));
        h.run(10);
    }
    assert_eq!(error_codes(&h, c), vec!["RATE_LIMITED"]);
    let e = &h.of_type(c, "ERROR")[0];
    assert_eq!(e["requestId"], "c");
    let wait = e["error"]["details"]["retryAfterMs"]
        .as_u64()
        .expect("retryAfterMs");
    assert!(wait > 0 && wait <= 30_000, "{wait}");
    h.advance(Duration::from_millis(wait));
    h.send(c, completion("c", "hi", json!({"maxTokens": 2})));
    h.run(10);
    assert_eq!(
        of(&h, c, "STREAM_COMPLETE", "c").len(),
        1,
        "admitted after the wait"
    );

    // Tokens: the first request spends more than the minute's allowance.
    let (mut h, c) = harness_with(HostConfig {
        keys: Some(keys(None, Some(20))),
        ..config()
    });
    h.send(c, completion("big", "hi", json!({"maxTokens": 30})));
    h.run(50);
    assert_eq!(of(&h, c, "STREAM_COMPLETE", "big").len(), 1);
    h.send(c, completion("next", "hi", json!({"maxTokens": 2})));
    assert_eq!(error_codes(&h, c), vec!["RATE_LIMITED"]);
    let wait = h.of_type(c, "ERROR")[0]["error"]["details"]["retryAfterMs"]
        .as_u64()
        .expect("retryAfterMs");
    // 3 prompt and 30 generated tokens against 20: 13 in debt, 14 to
    // refill at 20 a minute (42 s), less the time the request took.
    assert!((40_000..=42_000).contains(&wait), "{wait}");
    h.advance(Duration::from_millis(wait));
    h.send(c, completion("next", "hi", json!({"maxTokens": 2})));
    h.run(10);
    assert_eq!(of(&h, c, "STREAM_COMPLETE", "next").len(), 1);
}

#[test]
fn shutdown_ends_requests_with_a_recoverable_error() {
    let (mut h, c) = harness_with(HostConfig {
        shutdown_grace: Duration::from_secs(1),
        ..config()
    });
    h.send(c, completion("r1", "hi", json!({"maxTokens": 400})));
    h.run(3);
    h.input(Input::Shutdown);
    for _ in 0..400 {
        if !h.step() {
            break;
        }
    }
    h.advance(Duration::from_secs(2));
    let errors = h.of_type(c, "ERROR");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["error"]["code"], "INTERNAL_ERROR");
    assert_eq!(errors[0]["error"]["details"]["recoverable"], true);
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1001));
    assert!(h
        .others
        .iter()
        .any(|o| matches!(o, Output::ShutdownComplete)));
}

#[test]
fn tokens_of_a_request_cut_off_by_a_disconnect_still_count() {
    let (mut h, c) = harness_with(HostConfig {
        keys: Some(keys(None, Some(10))),
        ..config()
    });
    h.send(c, completion("r1", "hi", json!({"maxTokens": 100})));
    h.run(12);
    assert!(of(&h, c, "CONTENT_CHUNK", "r1").len() >= 10);
    h.input(Input::Closed { conn: c });
    let d = h.open_with(2, Dialect::Cai, QUERY);
    h.send(d, completion("r2", "hi", json!({"maxTokens": 2})));
    assert_eq!(
        error_codes(&h, d),
        vec!["RATE_LIMITED"],
        "3 prompt and 10 or more generated tokens spent a limit of 10"
    );
}

/// A request whose generation is over while its last sentence and
/// completion still wait for the client's sentence window (a stop string's
/// held-back text, released at the end, carries two sentence boundaries).
fn stalled(config: HostConfig) -> (Harness, ConnId) {
    let mut h = Harness::new(config, "ab. c", 1);
    let c = h.open_with(1, Dialect::Cai, QUERY);
    h.send(
        c,
        completion(
            "r1",
            "pppp",
            json!({"maxTokens": 5, "stop": ["ab. cQ"], "sentenceWindow": 1}),
        ),
    );
    h.run(50);
    assert_eq!(of(&h, c, "SENTENCE_BOUNDARY", "r1").len(), 1);
    assert!(
        of(&h, c, "STREAM_COMPLETE", "r1").is_empty(),
        "waiting for the window"
    );
    assert_eq!(
        h.host.stats().running + h.host.stats().queued,
        0,
        "no generation is left"
    );
    (h, c)
}

#[test]
fn a_shutdown_waits_for_a_reply_held_by_its_window_then_answers_it() {
    let (mut h, c) = stalled(HostConfig {
        shutdown_grace: Duration::from_secs(5),
        ..config()
    });
    h.input(Input::Shutdown);
    assert!(h.closes.is_empty(), "the grace is given to the held reply");
    h.send(
        c,
        json!({"type":"SENTENCE_COMPLETED","requestId":"r1","payload":{"sentenceIndex":0}}),
    );
    assert_eq!(
        of(&h, c, "STREAM_COMPLETE", "r1").len(),
        1,
        "delivered within the grace"
    );
    assert_eq!(
        h.closes.get(&c).map(|x| x.0),
        Some(1001),
        "then the shutdown completes"
    );

    let (mut h, c) = stalled(HostConfig {
        shutdown_grace: Duration::from_secs(5),
        ..config()
    });
    h.input(Input::Shutdown);
    h.advance(Duration::from_secs(6));
    let e = h.of_type(c, "ERROR");
    assert_eq!(e.len(), 1, "answered at the end of the grace");
    assert_eq!(e[0]["error"]["code"], "INTERNAL_ERROR");
    assert_eq!(e[0]["error"]["details"]["recoverable"], true);
    assert_eq!(h.closes.get(&c).map(|x| x.0), Some(1001));
}

#[test]
fn a_reply_left_waiting_on_its_window_past_the_pause_timeout_is_ended() {
    let (mut h, c) = stalled(HostConfig {
        pause_timeout: Duration::from_secs(5),
        ..config()
    });
    h.advance(Duration::from_secs(4));
    assert!(h.of_type(c, "ERROR").is_empty());
    h.advance(Duration::from_secs(2));
    assert_eq!(error_codes(&h, c), vec!["GENERATION_FAILED"]);
    h.send(
        c,
        json!({"type":"SENTENCE_COMPLETED","requestId":"r1","payload":{"sentenceIndex":0}}),
    );
    assert_eq!(
        error_codes(&h, c).len(),
        1,
        "a late acknowledgement is quietly accepted"
    );
    assert!(of(&h, c, "STREAM_COMPLETE", "r1").is_empty());
}

/// Found by the simulator: a request its window left waiting, ended by the
/// pause timeout, restarts the connection's idle clock as any request's end
/// does; the connection was closed as idle counting from the generation's
/// end, before the request's.
#[test]
fn a_reply_ended_by_the_pause_timeout_restarts_the_idle_clock() {
    let (mut h, c) = stalled(HostConfig {
        pause_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(8),
        ..config()
    });
    h.advance(Duration::from_secs(6));
    assert_eq!(
        error_codes(&h, c),
        vec!["GENERATION_FAILED"],
        "ended at 5 s"
    );
    h.advance(Duration::from_secs(6));
    assert!(h.closes.is_empty(), "idle for 7 s of 8: {:?}", h.closes);
    h.advance(Duration::from_secs(2));
    assert_eq!(
        h.closes.get(&c).map(|x| x.1.as_str()),
        Some("idle timeout"),
        "closed 8 s after the request ended"
    );
}
