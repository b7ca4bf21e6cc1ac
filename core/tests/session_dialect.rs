//! The `session` dialect against PROTOCOLS.md, driven through a Host with a
//! scripted engine and virtual time (no sockets): every message, every error
//! code, context building, job verification and budgets, and that nothing of
//! a session is left once it ends.

use serde_json::{json, Value};
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::testing::{script_text, Harness};
use tokenwire_core::{ChatMessage, Role};
use tokenwire_core::{ConnId, Dialect, HostConfig, Input, JobGrant, Output, TextCodec, Transport};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness() -> Harness {
    Harness::new(HostConfig::default(), SCRIPT, 1)
}

fn init(sid: &str, context: Value) -> Value {
    json!({"type":"session_init","session_id":sid,"job_id":12345,"conversation_context":context})
}

fn prompt(sid: &str, content: &str, index: u64, max_tokens: u32) -> Value {
    json!({"type":"prompt","session_id":sid,"content":content,"message_index":index,"max_tokens":max_tokens,"temperature":0})
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

fn errors(h: &Harness, c: ConnId) -> Vec<String> {
    h.of_type(c, "error")
        .iter()
        .map(|e| e["code"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Prompt ids of a conversation as the byte codec renders it (no template:
/// contents joined by newlines, BOS first).
fn rendered_len(messages: &[(&str, &str)]) -> usize {
    let msgs: Vec<ChatMessage> = messages
        .iter()
        .map(|(r, c)| ChatMessage::new(Role::parse(r).expect("role"), c.to_string()))
        .collect();
    ByteCodec.encode_chat(&msgs).expect("encode").len()
}

#[test]
fn init_prompt_stream_and_response_then_the_next_turn_sees_the_whole_conversation() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.send(c, init("s1", json!([])));
    let ready = last(&h, c);
    assert_eq!(ready["type"], "session_ready");
    assert_eq!(ready["session_id"], "s1");
    assert_eq!(ready["message_count"], 0);
    assert_eq!(ready["context_tokens"], 0);
    assert_eq!(ready["truncated_messages"], 0);
    assert!(ready["timestamp"].as_u64().is_some());
    assert_eq!(h.job_checks.len(), 1);
    assert_eq!(
        h.job_checks[0].job_id, "12345",
        "a numeric job id is kept as its digits"
    );

    h.send(c, prompt("s1", "hi", 0, 5));
    h.run(50);
    let chunks = h.of_type(c, "stream_chunk");
    assert!(!chunks.is_empty());
    assert!(chunks
        .iter()
        .all(|k| k["message_index"] == 1 && k["session_id"] == "s1"));
    let streamed: String = chunks
        .iter()
        .filter_map(|k| k["content"].as_str())
        .collect();
    let resp = last(&h, c);
    assert_eq!(resp["type"], "response");
    assert_eq!(resp["message_index"], 1);
    assert_eq!(resp["content"], streamed.as_str());
    assert_eq!(resp["finish_reason"], "length");
    let p1 = rendered_len(&[("user", "hi")]);
    assert_eq!(streamed, script_text(SCRIPT, p1, 5));
    assert_eq!(resp["tokens_used"], (p1 + 5) as u64);

    // The second prompt is built from the whole conversation so far.
    h.send(c, prompt("s1", "more", 2, 3));
    h.run(50);
    let resp2 = last(&h, c);
    assert_eq!(resp2["message_index"], 3);
    let p2 = rendered_len(&[("user", "hi"), ("assistant", &streamed), ("user", "more")]);
    assert_eq!(resp2["content"], script_text(SCRIPT, p2, 3).as_str());
    assert_eq!(resp2["tokens_used"], (p2 + 3) as u64);
    assert!(errors(&h, c).is_empty(), "{:?}", h.received(c));
}

#[test]
fn a_wrong_message_index_names_the_expected_one_and_changes_nothing() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.send(
        c,
        init(
            "s",
            json!([{"role":"user","content":"a"},{"role":"assistant","content":"b"}]),
        ),
    );
    assert_eq!(last(&h, c)["message_count"], 2);
    h.send(c, prompt("s", "x", 5, 2));
    let e = last(&h, c);
    assert_eq!(e["code"], "message_index_mismatch");
    assert_eq!(e["expected"], 2);
    assert_eq!(e["session_id"], "s");
    h.send(c, prompt("s", "x", 2, 2));
    h.run(50);
    assert_eq!(
        last(&h, c)["message_index"],
        3,
        "the failed prompt added no message"
    );
}

/// A host whose keys file holds one key, `key-a`.
fn keyed_harness() -> Harness {
    use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
    let cfg = HostConfig {
        keys: Some(
            KeyRing::new(vec![ApiKey {
                name: "a".into(),
                sha256: hash_key("key-a"),
                orgs: vec!["org".into()],
                requests_per_minute: None,
                tokens_per_minute: None,
            }])
            .expect("ring"),
        ),
        ..HostConfig::default()
    };
    Harness::new(cfg, SCRIPT, 1)
}

#[test]
fn unknown_and_duplicate_sessions_are_errors_across_one_principals_connections() {
    let mut h = keyed_harness();
    let a = h.open_with(1, Dialect::Session, "authorization=key-a");
    let b = h.open_with(2, Dialect::Session, "authorization=key-a");
    h.send(a, prompt("nope", "x", 0, 2));
    assert_eq!(last(&h, a)["code"], "unknown_session");
    h.send(a, init("s", json!([])));
    h.send(a, init("s", json!([])));
    assert_eq!(last(&h, a)["code"], "session_exists");
    h.send(b, init("s", json!([])));
    assert_eq!(last(&h, b)["code"], "session_exists", "live on this host");
    h.send(b, prompt("s", "x", 0, 2));
    assert_eq!(
        last(&h, b)["code"],
        "unknown_session",
        "held by the other connection"
    );
    h.send(b, json!({"type":"session_end","session_id":"s"}));
    assert_eq!(last(&h, b)["code"], "unknown_session");
    assert_eq!(h.host.stats().sessions, 1);
}

#[test]
fn another_principals_session_ids_are_invisible() {
    let mut h = keyed_harness();
    // Without a key each connection is its own principal.
    let a = h.open(1, Dialect::Session);
    let b = h.open(2, Dialect::Session);
    let keyed = h.open_with(3, Dialect::Session, "authorization=key-a");
    h.send(
        a,
        init("s", json!([{"role":"user","content":"a's secret"}])),
    );
    assert_eq!(last(&h, a)["type"], "session_ready");
    for c in [b, keyed] {
        h.send(c, prompt("s", "x", 1, 2));
        assert_eq!(
            last(&h, c)["code"],
            "unknown_session",
            "answered exactly as an id never used"
        );
        h.send(c, init("s", json!([])));
        assert_eq!(
            last(&h, c)["type"],
            "session_ready",
            "its own `s`, unrelated to a's"
        );
        assert_eq!(last(&h, c)["message_count"], 0);
    }
    assert_eq!(h.host.stats().sessions, 3);
}

#[test]
fn session_end_and_disconnect_leave_nothing_and_free_the_id() {
    let mut h = harness();
    let a = h.open(1, Dialect::Session);
    h.send(a, init("s", json!([{"role":"user","content":"secret"}])));
    h.send(a, prompt("s", "x", 1, 200));
    h.run(2);
    assert_eq!(h.host.stats().generations, 1);
    h.send(a, json!({"type":"session_end","session_id":"s"}));
    let ended = last(&h, a);
    assert_eq!(ended["type"], "session_ended");
    assert_eq!(ended["session_id"], "s");
    h.run(50);
    assert!(
        h.of_type(a, "response").is_empty(),
        "an ended session gets no response"
    );
    assert_eq!(h.host.stats().generations, 0);
    assert_eq!(h.host.stats().kv_blocks_used, 0);
    assert_eq!(h.host.stats().sessions, 0);
    h.send(a, prompt("s", "x", 1, 2));
    assert_eq!(last(&h, a)["code"], "unknown_session");

    h.send(a, init("s", json!([])));
    h.send(a, init("t", json!([])));
    assert_eq!(h.host.stats().sessions, 2);
    h.input(Input::Closed { conn: a });
    assert_eq!(h.host.stats().sessions, 0);
    let b = h.open(2, Dialect::Session);
    h.send(b, init("s", json!([])));
    assert_eq!(last(&h, b)["type"], "session_ready", "the id is free again");
}

#[test]
fn resume_checks_the_last_index_and_continues_from_the_given_history() {
    let history = json!([
        {"role":"system","content":"be brief"},
        {"role":"user","content":"q1"},
        {"role":"assistant","content":"a1"}
    ]);
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.send(c, json!({"type":"session_resume","session_id":"r","job_id":"j","conversation_context":history,"last_message_index":5}));
    let e = last(&h, c);
    assert_eq!(e["code"], "message_index_mismatch");
    assert_eq!(e["expected"], 2);
    assert_eq!(h.host.stats().sessions, 0);
    h.send(c, json!({"type":"session_resume","session_id":"r","job_id":"j","conversation_context":history,"last_message_index":2}));
    let ready = last(&h, c);
    assert_eq!(ready["type"], "session_ready");
    assert_eq!(ready["message_count"], 2, "user and assistant messages");
    let full = [("system", "be brief"), ("user", "q1"), ("assistant", "a1")];
    assert_eq!(ready["context_tokens"], rendered_len(&full) as u64);
    h.send(c, prompt("r", "q2", 2, 4));
    h.run(50);
    let p = rendered_len(&[
        ("system", "be brief"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
    ]);
    assert_eq!(last(&h, c)["content"], script_text(SCRIPT, p, 4).as_str());
}

#[test]
fn envelopes_and_arrays_run_in_order_behind_the_job_check() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    let frame = json!([
        {"type":"session_init","session_id":"e","timestamp":1,"payload":{"job_id":"j","conversation_context":[]}},
        {"type":"prompt","session_id":"e","timestamp":2,"payload":{"content":"hey","message_index":0,"max_tokens":2,"stream":false}},
        {"type":"bogus"}
    ]);
    h.send(c, frame);
    h.run(50);
    let kinds: Vec<&str> = h
        .received(c)
        .iter()
        .filter_map(|v| v["type"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["session_ready", "error", "response"],
        "{:?}",
        h.received(c)
    );
    assert_eq!(h.of_type(c, "error")[0]["code"], "invalid_request");
    assert!(h.of_type(c, "stream_chunk").is_empty(), "stream: false");
}

#[test]
fn the_prompt_keeps_system_messages_and_the_newest_that_fit() {
    let config = HostConfig {
        session_max_messages: 3,
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, SCRIPT, 1);
    let c = h.open(1, Dialect::Session);
    let mut ctx = vec![json!({"role":"system","content":"sys"})];
    for i in 0..6 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        ctx.push(json!({"role":role,"content":format!("m{i}")}));
    }
    h.send(c, init("w", Value::Array(ctx)));
    let ready = last(&h, c);
    assert_eq!(ready["message_count"], 6);
    assert_eq!(
        ready["truncated_messages"], 3,
        "3 of 6 non-system messages kept"
    );
    assert_eq!(
        ready["context_tokens"],
        rendered_len(&[
            ("system", "sys"),
            ("assistant", "m3"),
            ("user", "m4"),
            ("assistant", "m5")
        ]) as u64
    );
    h.send(c, prompt("w", "q", 6, 2));
    h.run(50);
    let p = rendered_len(&[
        ("system", "sys"),
        ("user", "m4"),
        ("assistant", "m5"),
        ("user", "q"),
    ]);
    assert_eq!(last(&h, c)["content"], script_text(SCRIPT, p, 2).as_str());
}

#[test]
fn a_prompt_that_cannot_fit_even_alone_is_context_length_exceeded() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.send(
        c,
        init(
            "l",
            json!([{"role":"user","content":"old"},{"role":"assistant","content":"reply"}]),
        ),
    );
    let long = "x".repeat(500);
    h.send(c, prompt("l", &long, 2, 100));
    assert_eq!(last(&h, c)["code"], "context_length_exceeded");
    assert_eq!(h.host.stats().generations, 0);
    // Old messages are dropped instead when the new one fits alone.
    let medium = "y".repeat(408);
    h.send(c, prompt("l", &medium, 2, 100));
    h.run(200);
    let r = last(&h, c);
    assert_eq!(r["type"], "response", "{r}");
    let p = rendered_len(&[("user", &medium)]);
    assert_eq!(r["tokens_used"], (p + 100) as u64);
}

#[test]
fn the_job_budget_caps_replies_then_refuses_prompts() {
    let mut h = harness();
    h.verdict = Ok(JobGrant {
        token_budget: Some(12),
    });
    let c = h.open(1, Dialect::Session);
    h.send(c, init("b", json!([])));
    h.send(c, prompt("b", "hi", 0, 50));
    h.run(100);
    let r = last(&h, c);
    assert_eq!(r["type"], "response");
    assert_eq!(
        r["tokens_used"], 12,
        "max_tokens clamped to the budget left"
    );
    assert_eq!(r["finish_reason"], "length");
    h.send(c, prompt("b", "again", 2, 5));
    let e = last(&h, c);
    assert_eq!(e["code"], "token_budget_exhausted");
    assert_eq!(e["recoverable"], false);
    // The budget is the job's: another session of the same job is refused too.
    h.send(c, init("b2", json!([])));
    h.send(c, prompt("b2", "x", 0, 1));
    assert_eq!(last(&h, c)["code"], "token_budget_exhausted");
}

/// Sessions `a` and `b` of one job granted 40 tokens, and `a`'s prompt
/// of 100 `max_tokens` started (nothing generated yet).
fn a_reply_of_a_job_of_40_running() -> (Harness, ConnId) {
    let mut h = harness();
    h.verdict = Ok(JobGrant {
        token_budget: Some(40),
    });
    let c = h.open(1, Dialect::Session);
    h.send(c, init("a", json!([])));
    h.send(c, init("b", json!([])));
    h.send(c, prompt("a", "hi", 0, 100));
    (h, c)
}

#[test]
fn replies_of_one_job_side_by_side_cannot_pass_its_budget_together() {
    // Charged only as they ended, two replies each capped to what the job
    // had left at their start went past the budget together.
    let (mut h, c) = a_reply_of_a_job_of_40_running();
    h.send(c, prompt("b", "hi", 0, 100));
    let e = last(&h, c);
    assert_eq!(e["code"], "token_budget_exhausted", "a holds all 40: {e}");
    h.run(200);
    let r = last(&h, c);
    assert_eq!(
        (r["session_id"].as_str(), r["tokens_used"].as_u64()),
        (Some("a"), Some(40))
    );
}

#[test]
fn a_reply_cut_short_gives_back_what_it_did_not_use() {
    let (mut h, c) = a_reply_of_a_job_of_40_running();
    // Ended before it generated anything: only its prompt is charged.
    h.send(c, json!({"type": "session_end", "session_id": "a"}));
    assert_eq!(last(&h, c)["type"], "session_ended");
    h.send(c, prompt("b", "hi", 0, 100));
    h.run(200);
    let r = last(&h, c);
    let p = rendered_len(&[("user", "hi")]) as u64;
    assert_eq!(r["type"], "response", "{r}");
    assert_eq!(
        r["tokens_used"].as_u64(),
        Some(40 - p),
        "all but a's prompt"
    );
}

#[test]
fn a_refused_job_creates_no_session() {
    let mut h = harness();
    h.verdict = Err("unpaid".into());
    let c = h.open(1, Dialect::Session);
    h.send(c, init("n", json!([])));
    let e = last(&h, c);
    assert_eq!(e["code"], "invalid_request");
    assert!(
        e["message"].as_str().unwrap_or("").contains("unpaid"),
        "{e}"
    );
    assert_eq!(h.host.stats().sessions, 0);
    h.send(c, prompt("n", "x", 0, 1));
    assert_eq!(last(&h, c)["code"], "unknown_session");
}

#[test]
fn bad_input_gets_invalid_request_and_the_connection_stays() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.input(Input::Binary { conn: c, len: 3 });
    h.send_raw(c, "{not json");
    h.send(c, json!({"type":"session_init","session_id":"s"}));
    h.send(c, json!({"type":"session_init","session_id":"s","job_id":1,"conversation_context":[{"role":"robot","content":"x"}]}));
    h.send(c, init("s", json!([])));
    h.send(
        c,
        json!({"type":"prompt","session_id":"s","content":"x","message_index":0,"temperature":5}),
    );
    h.send(c, json!({"type":"inference","prompt":"x"}));
    let errs = h.of_type(c, "error");
    assert_eq!(errs.len(), 6, "{:?}", h.received(c));
    assert!(errs.iter().all(|e| e["code"] == "invalid_request"));
    let messages: Vec<&str> = errs.iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(messages[2].contains("job_id"), "{}", messages[2]);
    assert!(
        messages[3].contains("conversation_context[0].role"),
        "{}",
        messages[3]
    );
    assert!(messages[4].contains("temperature"), "{}", messages[4]);
    assert!(h.closes.is_empty());
    h.send(c, prompt("s", "x", 0, 1));
    h.run(10);
    assert_eq!(
        last(&h, c)["type"],
        "response",
        "the bad prompt added nothing"
    );
}

#[test]
fn one_reply_in_flight_per_session_and_shutdown_fails_it_recoverably() {
    let mut h = harness();
    let c = h.open(1, Dialect::Session);
    h.send(c, init("s", json!([])));
    h.send(c, prompt("s", "x", 0, 100));
    h.run(1);
    h.send(c, prompt("s", "y", 2, 1));
    assert_eq!(last(&h, c)["code"], "invalid_request");
    h.input(Input::Shutdown);
    h.advance(tokenwire_core::Duration::from_secs(11));
    let e = h.of_type(c, "error");
    let last_err = e.last().expect("an error");
    assert_eq!(last_err["code"], "internal_error");
    assert_eq!(last_err["recoverable"], true);
    assert_eq!(h.closes.get(&c).map(|x| x.0), Some(1001));
}

#[test]
fn http_inference_runs_one_stateless_turn() {
    let mut h = harness();
    let c = ConnId(9);
    h.input(Input::Open {
        conn: c,
        dialect: Dialect::Session,
        transport: Transport::Http,
        query: String::new(),
        authorization: None,
        peer: "p".into(),
    });
    h.send(c, json!({"type":"inference","prompt":"q","conversation_context":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"max_tokens":3,"stream":true}));
    h.run(20);
    let r = last(&h, c);
    assert_eq!(r["type"], "response");
    let p = rendered_len(&[("user", "a"), ("assistant", "b"), ("user", "q")]);
    assert_eq!(r["content"], script_text(SCRIPT, p, 3).as_str());
    assert_eq!(r["message_index"], 3);
    assert!(!h.of_type(c, "stream_chunk").is_empty());
    assert!(h.job_checks.is_empty(), "no job on the stateless route");
    assert_eq!(h.host.stats().sessions, 0, "never registered");
    assert!(h.others.iter().all(|o| !matches!(o, Output::VerifyJob(_))));
}

#[test]
fn a_full_host_or_queue_is_rate_limited() {
    let config = HostConfig {
        max_sessions: 1,
        max_queued_requests: 0,
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, SCRIPT, 1);
    let c = h.open(1, Dialect::Session);
    h.send(c, init("one", json!([])));
    h.send(c, init("two", json!([])));
    let e = last(&h, c);
    assert_eq!(e["code"], "rate_limited");
    assert_eq!(e["recoverable"], true);
    h.send(c, prompt("one", "x", 0, 2));
    assert_eq!(
        last(&h, c)["code"],
        "rate_limited",
        "the queue takes nothing"
    );
    h.send(c, prompt("one", "x", 0, 2));
    assert_eq!(
        last(&h, c)["code"],
        "rate_limited",
        "the refused prompt added no message"
    );
}

#[test]
fn a_connection_gone_while_its_job_is_checked_leaves_no_session_behind() {
    let mut h = harness();
    h.hold_verdicts = true;
    let a = h.open(1, Dialect::Session);
    h.send(a, init("pending", json!([])));
    h.send(a, prompt("pending", "x", 0, 2));
    assert_eq!(h.job_checks.len(), 1);
    assert_eq!(
        h.host.stats().sessions,
        1,
        "the id is taken while its job is checked"
    );
    h.input(Input::Closed { conn: a });
    assert_eq!(h.host.stats().sessions, 0);
    // The late verdict finds nobody; the id is free for another connection.
    h.input(Input::JobVerified {
        check: h.job_checks[0].id,
        verdict: Ok(JobGrant::default()),
    });
    h.hold_verdicts = false;
    let b = h.open(2, Dialect::Session);
    h.send(b, init("pending", json!([])));
    assert_eq!(last(&h, b)["type"], "session_ready");
    assert_eq!(h.host.stats().sessions, 1);
}

#[test]
fn a_context_starts_even_when_the_default_reply_fills_the_window() {
    let config = HostConfig {
        default_max_tokens: 512,
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, SCRIPT, 1);
    let c = h.open(1, Dialect::Session);
    h.send(c, init("w", json!([{"role":"user","content":"hi"}])));
    let ready = last(&h, c);
    assert_eq!(ready["type"], "session_ready", "{ready}");
    assert_eq!(
        ready["context_tokens"],
        rendered_len(&[("user", "hi")]) as u64
    );
}

#[test]
fn sessions_per_connection_and_bytes_per_session_are_bounded_and_the_connection_stays() {
    let mut h = Harness::new(
        HostConfig {
            max_sessions_per_conn: 2,
            session_max_context_bytes: 20,
            ..HostConfig::default()
        },
        SCRIPT,
        1,
    );
    let c = h.open(1, Dialect::Session);
    h.send(c, init("a", json!([])));
    h.send(c, init("b", json!([])));
    h.send(c, init("c", json!([])));
    let e = last(&h, c);
    assert_eq!(e["code"], "rate_limited", "{e}");
    assert!(e["message"]
        .as_str()
        .is_some_and(|m| m.contains("2 sessions")));
    h.send(c, json!({"type":"session_end","session_id":"b"}));
    h.send(
        c,
        init(
            "c",
            json!([{"role":"user","content":"twenty-one bytes long"}]),
        ),
    );
    let e = last(&h, c);
    assert_eq!(e["code"], "invalid_request");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("21 bytes")),
        "{e}"
    );
    h.send(
        c,
        init("c", json!([{"role":"user","content":"ten bytes!"}])),
    );
    assert_eq!(last(&h, c)["type"], "session_ready");
    // A prompt that would grow the kept conversation past the bound.
    h.send(c, prompt("c", "eleven byte", 1, 2));
    let e = last(&h, c);
    assert_eq!(e["code"], "invalid_request");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("keeps 10 bytes")),
        "{e}"
    );
    h.send(c, prompt("c", "short", 1, 2));
    h.run(20);
    assert_eq!(last(&h, c)["type"], "response", "nothing was lost");
    assert!(h.closes.is_empty());
}

mod signed_prompts {
    use super::*;
    use k256::ecdsa::signature::Signer;
    use k256::ecdsa::{Signature, SigningKey};
    use tokenwire_core::dialect::session::signature::signed_text;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn key() -> SigningKey {
        SigningKey::from_slice(&[42u8; 32]).expect("key")
    }

    fn signed(sid: &str, content: &str, index: u64, sk: &SigningKey) -> Value {
        let sig: Signature = sk.sign(signed_text(sid, index, content).as_bytes());
        let mut p = prompt(sid, content, index, 4);
        p["signature"] = hex(&sig.to_bytes()).into();
        p
    }

    fn keyed_session(h: &mut Harness) -> ConnId {
        let c = h.open(1, Dialect::Session);
        let mut i = init("s", json!([]));
        let pk = hex(&key().verifying_key().to_sec1_bytes());
        i["public_key"] = pk.clone().into();
        h.send(c, i);
        h.run(10);
        assert_eq!(last(h, c)["type"], "session_ready");
        // The job verifier saw the key, to bind it to the job.
        assert_eq!(
            h.job_checks.last().and_then(|j| j.public_key.clone()),
            Some(pk)
        );
        c
    }

    #[test]
    fn a_keyed_session_takes_only_prompts_signed_for_their_place() {
        let mut h = harness();
        let c = keyed_session(&mut h);
        h.send(c, signed("s", "hi", 0, &key()));
        h.run(50);
        assert_eq!(last(&h, c)["type"], "response", "{:?}", h.received(c));
        let steps = h.steps_run;
        // Missing, wrong (another key), and replayed at another index.
        h.send(c, prompt("s", "again", 2, 4));
        let other = SigningKey::from_slice(&[9u8; 32]).expect("key");
        h.send(c, signed("s", "again", 2, &other));
        h.send(c, signed("s", "hi", 2, &key()).tap_replay("hi", 0, &key()));
        h.run(50);
        let codes = errors(&h, c);
        assert_eq!(codes, ["invalid_request"; 3], "{:?}", h.received(c));
        assert_eq!(h.steps_run, steps, "nothing was generated");
        let msgs: Vec<String> = h
            .of_type(c, "error")
            .iter()
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect();
        assert!(msgs[0].contains("required"), "{msgs:?}");
        assert!(msgs[1].contains("does not verify"), "{msgs:?}");
        assert!(msgs[2].contains("does not verify"), "{msgs:?}");
        // The right one still goes through.
        h.send(c, signed("s", "again", 2, &key()));
        h.run(50);
        assert_eq!(last(&h, c)["type"], "response");
    }

    #[test]
    fn require_signatures_refuses_sessions_without_a_key_and_bad_keys_are_named() {
        let mut h = Harness::new(
            HostConfig {
                require_signatures: true,
                ..HostConfig::default()
            },
            SCRIPT,
            1,
        );
        let c = h.open(1, Dialect::Session);
        h.send(c, init("s", json!([])));
        let e = last(&h, c);
        assert_eq!(e["code"], "invalid_request");
        assert!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("--require-signatures")),
            "{e}"
        );
        let mut bad = init("t", json!([]));
        bad["public_key"] = "02abcdef".into();
        h.send(c, bad);
        let e = last(&h, c);
        assert!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("public_key")),
            "{e}"
        );
        let ok = keyed_session(&mut Harness::new(
            HostConfig {
                require_signatures: true,
                ..HostConfig::default()
            },
            SCRIPT,
            1,
        ));
        assert_eq!(ok, ConnId(1));
    }

    /// A prompt signed for index `index` with `content`, sent at another
    /// place: its own frame with the message index rewritten.
    trait Replay {
        fn tap_replay(self, content: &str, index: u64, sk: &SigningKey) -> Value;
    }

    impl Replay for Value {
        fn tap_replay(mut self, content: &str, index: u64, sk: &SigningKey) -> Value {
            let sig: Signature = sk.sign(signed_text("s", index, content).as_bytes());
            self["signature"] = hex(&sig.to_bytes()).into();
            self
        }
    }
}
