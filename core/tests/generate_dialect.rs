//! The `generate` dialect driven through the Host with virtual time and a
//! scripted engine: every behaviour of PROTOCOLS.md's `generate` section.

use serde_json::{json, Value};
use tokenwire_core::testing::{script_text, tiny_model_info, Harness};
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig, Input, Output};

const SCRIPT: &str = "the quick brown fox jumps over the lazy dog. ";

fn harness() -> Harness {
    Harness::new(HostConfig::default(), SCRIPT, 7)
}

fn config(prompt: &str, params: Value) -> Value {
    json!({"type": "config", "prompt": prompt, "parameters": params})
}

/// Prompt tokens of `prompt` under the byte codec (BOS + one per byte).
fn ptoks(prompt: &str) -> usize {
    prompt.len() + 1
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

fn kv_used(h: &Harness) -> u32 {
    h.host.stats().kv_blocks_used
}

#[test]
fn basic_flow_streams_tokens_then_completion_with_real_usage() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hello", json!({"max_tokens": 12})));
    let init = h.received(c)[0].clone();
    assert_eq!(init["type"], "init");
    assert!(init["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("gen_")));
    assert_eq!(init["model"], "tiny");
    assert_eq!(init["model_info"]["max_tokens"], 512);
    assert_eq!(init["model_info"]["quantization"], "f32");
    h.run(100);
    let expected = script_text(SCRIPT, ptoks("Hello"), 12);
    assert_eq!(h.streamed_text(c), expected);
    let tokens = h.of_type(c, "token");
    assert_eq!(tokens.len(), 12);
    assert!(tokens[..11]
        .iter()
        .all(|t| t["finished"] == false && t["finish_reason"].is_null()));
    assert_eq!(tokens[11]["finished"], true);
    assert_eq!(tokens[11]["finish_reason"], "length");
    assert!(tokens
        .iter()
        .all(|t| t.get("token_id").is_none() && t.get("generated_text").is_none()));
    let done = last(&h, c);
    assert_eq!(done["type"], "completion");
    assert_eq!(done["generated_text"], expected);
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["usage"]["prompt_tokens"], 6);
    assert_eq!(done["usage"]["completion_tokens"], 12);
    assert_eq!(done["usage"]["total_tokens"], 18);
    assert_eq!(done["request_id"], init["request_id"]);
    assert_eq!(kv_used(&h), 0);
    // The connection takes another config afterwards.
    h.send(c, config("Hello", json!({"max_tokens": 3})));
    h.run(100);
    assert_eq!(last(&h, c)["type"], "completion");
    assert_eq!(h.of_type(c, "init").len(), 2);
    assert_ne!(
        h.of_type(c, "init")[0]["request_id"],
        h.of_type(c, "init")[1]["request_id"]
    );
}

#[test]
fn first_message_not_config_is_fatal_with_1008() {
    for first in [
        json!({"type": "control", "action": "stop"}).to_string(),
        "not json".to_string(),
        "[1,2]".to_string(),
        json!({"prompt": "x"}).to_string(),
    ] {
        let mut h = harness();
        let c = h.open(1, Dialect::Generate);
        h.send_raw(c, &first);
        let err = &h.received(c)[0];
        assert_eq!(err["type"], "error", "for {first}");
        assert_eq!(err["error"], "invalid_request");
        assert_eq!(err["recoverable"], false);
        assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1008));
    }
}

#[test]
fn bad_frames_after_the_first_get_errors_and_the_connection_stays() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.input(Input::Binary { conn: c, len: 3 });
    assert_eq!(last(&h, c)["error"], "invalid_request");
    assert!(last(&h, c)["message"]
        .as_str()
        .is_some_and(|m| m.contains("binary")));
    h.send(c, config("Hi", json!({"max_tokens": 2})));
    h.run(10);
    for bad in [
        "{not json",
        &("[".repeat(100) + &"]".repeat(100)),
        r#"{"type":"bogus"}"#,
        r#"{"type":"config","prompt":5}"#,
        r#"{"type":"config","prompt":"x","parameters":{"temperature":"hot"}}"#,
        r#"{"type":"config","prompt":"x","options":{"echo_prompt":"yes"}}"#,
        r#"{"type":"config","prompt":"x","model":"gpt-9"}"#,
        r#"{"type":"control"}"#,
        r#"{"type":"control","action":"dance"}"#,
        r#"{"type":"control","action":"stop"}"#,
        r#"{"type":"feedback"}"#,
    ] {
        let before = h.received(c).len();
        h.send_raw(c, bad);
        let got = &h.received(c)[before..];
        assert_eq!(got.len(), 1, "one reply to {bad}");
        assert_eq!(got[0]["type"], "error", "for {bad}");
        assert_eq!(got[0]["error"], "invalid_request", "for {bad}");
        assert_eq!(got[0]["recoverable"], true);
        assert!(got[0]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let msg = |i: usize| {
        h.received(c)[h.received(c).len() - i]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(msg(7).contains("parameters.temperature"), "{}", msg(7));
    assert!(msg(6).contains("options.echo_prompt"));
    assert!(msg(5).contains("gpt-9"));
    assert!(msg(3).contains("dance"));
    assert!(!h.closes.contains_key(&c));
}

#[test]
fn config_while_generating_is_rejected_and_the_running_one_continues() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 6})));
    h.step();
    h.send(c, config("Other", json!({"max_tokens": 6})));
    let err = last(&h, c);
    assert_eq!(err["error"], "invalid_request");
    assert_eq!(err["request_id"], h.received(c)[0]["request_id"]);
    h.run(50);
    assert_eq!(h.streamed_text(c), script_text(SCRIPT, ptoks("Hi"), 6));
    assert_eq!(h.of_type(c, "init").len(), 1);
}

#[test]
fn control_stop_cancels_with_text_so_far_and_frees_kv() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 100})));
    h.run(4);
    h.send(c, json!({"type": "control", "action": "stop"}));
    let tokens = h.of_type(c, "token");
    let fin = tokens.last().cloned().unwrap_or_default();
    assert_eq!(fin["finished"], true);
    assert_eq!(fin["finish_reason"], "cancelled");
    let done = last(&h, c);
    assert_eq!(done["type"], "completion");
    assert_eq!(done["finish_reason"], "cancelled");
    assert_eq!(done["generated_text"], h.streamed_text(c));
    assert_eq!(done["usage"]["completion_tokens"], 4);
    h.run(10);
    assert_eq!(kv_used(&h), 0);
    assert_eq!(h.of_type(c, "completion").len(), 1);
}

#[test]
fn pause_stops_compute_and_resume_continues_the_same_text() {
    let mut reference = harness();
    let r = reference.open(1, Dialect::Generate);
    reference.send(r, config("Hi", json!({"max_tokens": 20, "temperature": 0})));
    reference.run(100);

    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 20, "temperature": 0})));
    h.run(5);
    h.send(c, json!({"type": "control", "action": "pause"}));
    assert_eq!(last(&h, c)["operation"], "paused");
    assert_eq!(h.host.stats().generations, 1);
    let tokens_at_pause = h.of_type(c, "token").len();
    // A step already handed out may still finish; no further steps are planned.
    h.run(10);
    assert!(h.pending_step.is_none());
    h.advance(Duration::from_secs(60));
    assert_eq!(
        h.of_type(c, "token").len(),
        tokens_at_pause,
        "no tokens while paused"
    );
    h.send(c, json!({"type": "control", "action": "resume"}));
    assert!(h
        .of_type(c, "status")
        .iter()
        .any(|s| s["operation"] == "resumed"));
    h.run(100);
    assert_eq!(h.streamed_text(c), reference.streamed_text(r));
    assert_eq!(last(&h, c)["finish_reason"], "length");
    // resume when not paused is an error
    h.send(c, config("Hi", json!({"max_tokens": 50})));
    h.send(c, json!({"type": "control", "action": "resume"}));
    assert_eq!(last(&h, c)["error"], "invalid_request");
}

#[test]
fn a_pause_longer_than_the_pause_timeout_completes_with_timeout() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 100})));
    h.run(3);
    h.send(c, json!({"type": "control", "action": "pause"}));
    h.run(5);
    h.advance(Duration::from_secs(5 * 60 - 1));
    assert!(h.of_type(c, "completion").is_empty());
    h.advance(Duration::from_secs(2));
    let done = last(&h, c);
    assert_eq!(done["type"], "completion");
    assert_eq!(done["finish_reason"], "timeout");
    assert_eq!(kv_used(&h), 0);
}

#[test]
fn regenerate_restarts_with_a_new_request_id_and_no_completion_for_the_old() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 5, "seed": 3})));
    h.run(2);
    h.send(c, json!({"type": "control", "action": "regenerate"}));
    let inits = h.of_type(c, "init");
    assert_eq!(inits.len(), 2);
    assert_ne!(inits[0]["request_id"], inits[1]["request_id"]);
    h.run(50);
    let completions = h.of_type(c, "completion");
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0]["request_id"], inits[1]["request_id"]);
    assert_eq!(completions[0]["usage"]["completion_tokens"], 5);
    assert_eq!(kv_used(&h), 0);
}

#[test]
fn modify_changes_parameters_and_acks_the_effective_values() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(
        c,
        config("Hi", json!({"max_tokens": 30, "temperature": 0.7})),
    );
    h.run(2);
    h.send(c, json!({"type": "control", "action": "modify", "parameters": {"temperature": 0.9, "top_p": 0.95}}));
    let ack = last(&h, c);
    assert_eq!(ack["operation"], "modified");
    // Echoed exactly as sent: the shortest decimal of the stored f32.
    assert_eq!(ack["parameters"]["temperature"], json!(0.9));
    assert_eq!(ack["parameters"]["top_p"], json!(0.95));
    assert_eq!(ack["parameters"]["repetition_penalty"], json!(1.0));
    assert_eq!(ack["parameters"]["max_tokens"], 30);
    // The step planned after the modify carries the new sampling parameters.
    h.step();
    let s = &h.pending_step.clone().expect("a step").seqs[0].sampling;
    assert!((s.temperature - 0.9).abs() < 1e-6);
    // Invalid: error, nothing changes.
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"temperature": 9}}),
    );
    assert_eq!(last(&h, c)["error"], "invalid_request");
    assert!(last(&h, c)["message"]
        .as_str()
        .unwrap_or("")
        .contains("parameters.temperature"));
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"max_tokens": 1}}),
    );
    assert_eq!(last(&h, c)["error"], "invalid_request");
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"max_tokens": 8}}),
    );
    assert_eq!(last(&h, c)["operation"], "modified");
    // A value that passes in f64 but not as the f32 it is kept as is refused.
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"repetition_penalty": 1e-40}}),
    );
    assert_eq!(last(&h, c)["error"], "invalid_request");
    assert!(last(&h, c)["message"]
        .as_str()
        .unwrap_or("")
        .contains("parameters.repetition_penalty"));
    h.run(50);
    assert_eq!(last(&h, c)["usage"]["completion_tokens"], 8);
}

#[test]
fn feedback_is_acked_counted_and_handed_out() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 2})));
    h.run(10);
    h.send(
        c,
        json!({"type": "feedback", "rating": 1, "text": "Great response!", "position": 1}),
    );
    let ack = last(&h, c);
    assert_eq!(ack["operation"], "feedback_received");
    assert_eq!(ack["request_id"], h.received(c)[0]["request_id"]);
    let fb = h.others.iter().find_map(|o| match o {
        Output::Feedback(f) => Some(f.clone()),
        _ => None,
    });
    let fb = fb.expect("feedback output");
    assert_eq!(fb.rating, 1.0);
    assert_eq!(fb.position, Some(1));
    assert_eq!(fb.text.as_deref(), Some("Great response!"));
    for bad in [
        json!({"type": "feedback", "rating": 2}),
        json!({"type": "feedback", "rating": 1, "text": "x".repeat(5000)}),
        json!({"type": "feedback", "rating": "good"}),
    ] {
        h.send(c, bad);
        assert_eq!(last(&h, c)["error"], "invalid_request");
    }
}

#[test]
fn stop_strings_end_the_generation_and_never_appear() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    // The scripted text after "Hi" contains "fox"; stop there.
    h.send(
        c,
        config(
            "Hi",
            json!({"max_tokens": 200, "stop": ["fox", "never-there"]}),
        ),
    );
    h.run(300);
    let text = h.streamed_text(c);
    assert!(!text.contains("fox"), "{text}");
    let full = script_text(SCRIPT, ptoks("Hi"), 200);
    let cut = full.find("fox").expect("script has fox");
    assert_eq!(text, &full[..cut]);
    let done = last(&h, c);
    assert_eq!(done["finish_reason"], "stop");
    assert_eq!(done["generated_text"], text);
}

#[test]
fn end_of_sequence_token_finishes_with_stop() {
    let mut h = Harness::new(HostConfig::default(), "abc\0", 1);
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("", json!({"max_tokens": 100})));
    h.run(100);
    let done = last(&h, c);
    assert_eq!(done["finish_reason"], "stop");
    // prompt = BOS only (1 token): positions 1.. give "abc" then EOS at position 4... script index 1 = 'b'
    assert_eq!(done["generated_text"], "bc");
    assert_eq!(done["usage"]["completion_tokens"], 3);
}

#[test]
fn every_option_adds_its_fields() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(
        c,
        json!({"type": "config", "prompt": "Hi", "parameters": {"max_tokens": 4, "top_logprobs": 3},
               "options": {"echo_prompt": true, "include_token_ids": true, "include_logprobs": true,
                           "include_timing": true, "include_generated_text": true, "stream": true}}),
    );
    h.run(10);
    let tokens = h.of_type(c, "token");
    let mut cumulative = String::new();
    for t in &tokens {
        cumulative.push_str(t["token"].as_str().unwrap_or(""));
        assert!(t["token_id"].as_u64().is_some());
        let lp = t["logprobs"].as_array().expect("logprobs");
        assert_eq!(lp.len(), 1 + 3);
        assert_eq!(lp[0]["token"], t["token"]);
        assert!(lp[0]["logprob"].as_f64().is_some());
        assert!(t["timing"]["token_ms"].as_f64().is_some_and(|v| v >= 0.0));
        assert!(t["timing"]["total_ms"].as_f64().is_some());
        assert_eq!(t["generated_text"], cumulative);
    }
    let done = last(&h, c);
    assert_eq!(done["generated_text"], format!("Hi{cumulative}"));
    assert!(done["timing"]["first_token_ms"]
        .as_f64()
        .is_some_and(|v| v > 0.0));
    assert!(done["timing"]["total_ms"].as_f64().is_some());
}

#[test]
fn too_long_prompts_get_context_length_exceeded_and_nothing_runs() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config(&"x".repeat(600), json!({})));
    let err = last(&h, c);
    assert_eq!(err["error"], "context_length_exceeded");
    assert_eq!(err["recovery_action"], "shorten_prompt");
    assert_eq!(err["recoverable"], true);
    h.send(c, config(&"x".repeat(400), json!({"max_tokens": 200})));
    assert_eq!(last(&h, c)["recovery_action"], "reduce_max_tokens");
    assert!(h.pending_step.is_none());
    assert!(!h.closes.contains_key(&c));
}

#[test]
fn a_request_that_can_never_fit_the_kv_cache_gets_memory_pressure() {
    let mut info = tiny_model_info();
    info.num_blocks = 4; // 64 tokens
    let mut h = Harness::with_info(HostConfig::default(), info, SCRIPT, 1);
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 100})));
    let err = last(&h, c);
    assert_eq!(err["error"], "memory_pressure");
    assert_eq!(err["recoverable"], true);
}

#[test]
fn disconnect_during_prefill_frees_every_block() {
    let mut h = Harness::new(
        HostConfig {
            max_step_tokens: 32,
            ..HostConfig::default()
        },
        SCRIPT,
        1,
    );
    let c = h.open(1, Dialect::Generate);
    h.send(c, config(&"y".repeat(300), json!({"max_tokens": 10})));
    h.step();
    assert!(kv_used(&h) > 0);
    assert!(h.of_type(c, "token").is_empty(), "still prefilling");
    h.input(Input::Closed { conn: c });
    h.run(5);
    assert_eq!(kv_used(&h), 0);
    assert_eq!(h.host.stats().generations, 0);
}

#[test]
fn many_clients_are_batched_into_the_same_steps_and_each_gets_its_text() {
    let mut h = harness();
    let conns: Vec<ConnId> = (1..=5).map(|i| h.open(i, Dialect::Generate)).collect();
    let prompts = ["a", "bb", "ccc", "dddd", "eeeee"];
    for (c, p) in conns.iter().zip(prompts) {
        h.send(*c, config(p, json!({"max_tokens": 10})));
    }
    // The first config started a step at once; the other four join the next one.
    assert_eq!(h.pending_step.as_ref().map(|p| p.seqs.len()), Some(1));
    h.step();
    let plan = h.pending_step.clone().expect("step");
    assert_eq!(
        plan.seqs.len(),
        5,
        "one decode and four prefills in one step"
    );
    h.step();
    let plan = h.pending_step.clone().expect("step");
    assert_eq!(plan.seqs.len(), 5, "all five decoded in one step");
    assert!(plan.seqs.iter().all(|s| s.tokens.len() == 1));
    h.run(100);
    for (c, p) in conns.iter().zip(prompts) {
        assert_eq!(h.streamed_text(*c), script_text(SCRIPT, ptoks(p), 10));
    }
}

#[test]
fn requests_beyond_capacity_wait_in_order_and_hear_their_position() {
    let mut info = tiny_model_info();
    info.num_blocks = 6;
    let mut h = Harness::with_info(HostConfig::default(), info, SCRIPT, 1);
    let conns: Vec<ConnId> = (1..=4).map(|i| h.open(i, Dialect::Generate)).collect();
    for c in &conns {
        h.send(*c, config(&"p".repeat(40), json!({"max_tokens": 8})));
    }
    let queued: Vec<Value> = conns.iter().flat_map(|c| h.of_type(*c, "status")).collect();
    assert!(
        queued
            .iter()
            .any(|s| s["operation"] == "queued" && s["position"] == 1),
        "{queued:?}"
    );
    h.run(500);
    for c in &conns {
        assert_eq!(h.streamed_text(*c), script_text(SCRIPT, 41, 8));
    }
    assert_eq!(kv_used(&h), 0);
}

#[test]
fn slow_reader_pauses_compute_and_resumes_on_drain_or_is_closed() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 50})));
    h.run(3);
    h.input(Input::QueueFull { conn: c });
    h.run(5);
    assert!(h.pending_step.is_none(), "no compute for a full queue");
    let n = h.of_type(c, "token").len();
    h.input(Input::QueueDrained { conn: c });
    h.run(100);
    assert!(h.of_type(c, "token").len() > n);
    assert_eq!(h.streamed_text(c), script_text(SCRIPT, ptoks("Hi"), 50));

    let c2 = h.open(2, Dialect::Generate);
    h.send(c2, config("Hi", json!({"max_tokens": 50})));
    h.run(2);
    h.input(Input::QueueFull { conn: c2 });
    h.advance(Duration::from_secs(31));
    assert_eq!(h.closes.get(&c2).map(|c| c.0), Some(1008));
    h.run(5);
    assert_eq!(kv_used(&h), 0);
}

#[test]
fn idle_connections_close_with_1000_and_silent_peers_fail_keepalive() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 2})));
    h.run(10);
    // The harness answers pings, so only the idle timeout applies.
    for _ in 0..19 {
        h.advance(Duration::from_secs(30));
    }
    assert!(!h.closes.contains_key(&c));
    h.advance(Duration::from_secs(31));
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1000));
    let pings = h
        .others
        .iter()
        .filter(|o| matches!(o, Output::Ping { .. }))
        .count();
    assert!(pings >= 19);

    h.auto_pong = false;
    let c2 = h.open(2, Dialect::Generate);
    h.advance(Duration::from_secs(30));
    assert!(!h.closes.contains_key(&c2));
    h.advance(Duration::from_secs(61));
    assert_eq!(
        h.closes.get(&c2).map(|c| c.1.as_str()),
        Some("keepalive timeout")
    );
}

#[test]
fn graceful_shutdown_lets_work_finish_then_errors_and_closes_1001() {
    let mut h = harness();
    let a = h.open(1, Dialect::Generate);
    let b = h.open(2, Dialect::Generate);
    h.send(a, config("Hi", json!({"max_tokens": 3})));
    h.send(b, config("Hi", json!({"max_tokens": 500})));
    h.input(Input::Shutdown);
    h.send(a, config("late", json!({})));
    h.run(3);
    assert_eq!(
        h.of_type(a, "completion").len(),
        1,
        "short one finished in the grace period"
    );
    h.send(a, config("late", json!({})));
    assert_eq!(last(&h, a)["recoverable"], true);
    h.advance(Duration::from_secs(11));
    let err = last(&h, b);
    assert_eq!(err["type"], "error");
    assert_eq!(err["recoverable"], true);
    assert_eq!(err["recovery_action"], "retry");
    assert!(err["generated_text"].as_str().is_some());
    assert_eq!(h.closes.get(&a).map(|c| c.0), Some(1001));
    assert_eq!(h.closes.get(&b).map(|c| c.0), Some(1001));
    assert!(h
        .others
        .iter()
        .any(|o| matches!(o, Output::ShutdownComplete)));
}

#[test]
fn clients_connecting_while_the_model_loads_get_status_then_their_init() {
    let mut host = tokenwire_core::Host::new(HostConfig::default(), 1u64);
    let now = tokenwire_core::Instant::ZERO;
    let c = ConnId(1);
    host.handle(
        now,
        Input::Open {
            conn: c,
            dialect: Dialect::Generate,
            transport: tokenwire_core::Transport::WebSocket,
            query: String::new(),
            authorization: None,
            peer: String::new(),
        },
    );
    host.handle(
        now,
        Input::ModelLoading {
            progress: 40.0,
            message: "weights".into(),
            eta: Some(Duration::from_secs(2)),
        },
    );
    host.handle(
        now,
        Input::Text {
            conn: c,
            text: config("Hi", json!({"max_tokens": 2})).to_string(),
        },
    );
    assert!(!host.stats().loaded);
    host.handle(
        now,
        Input::ModelLoaded {
            info: tiny_model_info(),
            codec: tokenwire_core::testing::ByteCodec::shared(),
        },
    );
    let mut frames = Vec::new();
    let mut jobs = Vec::new();
    while let Some(o) = host.poll_output() {
        match o {
            Output::Send { text, .. } => {
                frames.push(serde_json::from_str::<Value>(&text).unwrap_or_default())
            }
            Output::Tokenize(job) => jobs.push(job),
            _ => {}
        }
    }
    // The held config's prompt is tokenized once the model is there.
    assert_eq!(jobs.len(), 1);
    host.handle(now, Input::Tokenized(jobs[0].run()));
    while let Some(o) = host.poll_output() {
        if let Output::Send { text, .. } = o {
            frames.push(serde_json::from_str::<Value>(&text).unwrap_or_default());
        }
    }
    let statuses: Vec<&Value> = frames
        .iter()
        .filter(|f| f["operation"] == "model_loading")
        .collect();
    assert!(statuses.len() >= 2);
    assert_eq!(statuses[1]["progress"], 40.0);
    assert_eq!(statuses[1]["eta_seconds"], 2.0);
    assert_eq!(
        frames.last().map(|f| f["type"].clone()),
        Some(json!("init"))
    );
}

#[test]
fn same_seed_and_inputs_give_bit_identical_outputs() {
    let run = |seed: u64| {
        let mut h = Harness::new(HostConfig::default(), SCRIPT, seed);
        let a = h.open(1, Dialect::Generate);
        let b = h.open(2, Dialect::Generate);
        h.send(a, config("Hi", json!({"max_tokens": 9})));
        h.run(2);
        h.send(b, config("There", json!({"max_tokens": 5})));
        h.send(a, json!({"type": "control", "action": "pause"}));
        h.run(3);
        h.send(a, json!({"type": "control", "action": "resume"}));
        h.run(50);
        (h.frames.clone(), format!("{:?}", h.others))
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5).0, run(6).0, "ids depend on the seed");
}

#[test]
fn memory_pressure_shrinks_the_pool_invisibly_to_clients() {
    let mut h = harness();
    let conns: Vec<ConnId> = (1..=3).map(|i| h.open(i, Dialect::Generate)).collect();
    for c in &conns {
        h.send(*c, config(&"q".repeat(30), json!({"max_tokens": 60})));
    }
    h.run(10);
    h.input(Input::KvCapacity { num_blocks: 6 });
    h.run(10);
    h.input(Input::KvCapacity { num_blocks: 64 });
    h.run(500);
    for c in &conns {
        assert_eq!(h.streamed_text(*c), script_text(SCRIPT, 31, 60));
    }
    assert_eq!(kv_used(&h), 0);
    assert!(h.host.check_invariants().is_ok());
}

/// Regression (found by the simulator, seed 4): a generation started while the
/// connection's queue is already full must be held too, not only the ones that
/// existed when it filled.
#[test]
fn a_generation_started_on_a_full_queue_is_held_until_it_drains() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 2})));
    h.run(10);
    h.input(Input::QueueFull { conn: c });
    h.send(c, config("Hi", json!({"max_tokens": 5})));
    assert_eq!(h.of_type(c, "init").len(), 2);
    h.run(10);
    assert!(
        h.pending_step.is_none(),
        "no compute for a connection whose queue is full"
    );
    assert_eq!(h.of_type(c, "completion").len(), 1);
    // The same for a regenerate while full.
    h.input(Input::QueueDrained { conn: c });
    h.run(1);
    h.input(Input::QueueFull { conn: c });
    h.run(10);
    h.send(c, json!({"type": "control", "action": "regenerate"}));
    h.run(10);
    assert!(h.pending_step.is_none());
    h.input(Input::QueueDrained { conn: c });
    h.run(100);
    let completions = h.of_type(c, "completion");
    assert_eq!(completions.len(), 2);
    assert_eq!(completions[1]["usage"]["completion_tokens"], 5);
    assert_eq!(
        completions[1]["request_id"],
        h.of_type(c, "init")[2]["request_id"]
    );
}

#[test]
fn shutdown_of_an_idle_host_completes_at_once_and_only_once() {
    let mut h = harness();
    let idle = h.open(1, Dialect::Generate);
    let complete = |h: &Harness| {
        h.others
            .iter()
            .filter(|o| matches!(o, Output::ShutdownComplete))
            .count()
    };
    h.input(Input::Shutdown);
    assert_eq!(complete(&h), 1, "nothing in flight: no need for the grace");
    assert_eq!(h.closes.get(&idle).map(|c| c.0), Some(1001));
    // Later inputs, the grace deadline passing and a late connection do not
    // complete it again.
    h.input(Input::Closed { conn: idle });
    h.input(Input::Shutdown);
    h.advance(Duration::from_secs(30));
    h.input(Input::Timeout);
    let late = h.open(2, Dialect::Generate);
    assert_eq!(h.closes.get(&late).map(|c| c.0), Some(1001));
    assert_eq!(complete(&h), 1);
}

#[test]
fn prompts_are_tokenized_off_the_host_and_later_frames_wait_their_turn() {
    let mut h = harness();
    h.auto_text = false;
    let busy = h.open(1, Dialect::Generate);
    h.send(busy, config("streaming", json!({"max_tokens": 30})));
    h.finish_text_jobs();
    h.run(2);
    let tokens_before = h.of_type(busy, "token").len();

    let c = h.open(2, Dialect::Generate);
    h.send(c, config("Hello", json!({"max_tokens": 20})));
    h.send(c, json!({"type": "control", "action": "stop"}));
    assert_eq!(h.text_jobs.len(), 1, "the prompt went out as a text job");
    assert!(
        h.received(c).is_empty(),
        "nothing is answered before the tokens are back, not even the stop"
    );
    // Meanwhile other connections keep streaming.
    h.run(3);
    assert!(h.of_type(busy, "token").len() > tokens_before);
    assert!(h.received(c).is_empty());

    h.finish_text_jobs();
    let kinds: Vec<Value> = h.received(c).iter().map(|f| f["type"].clone()).collect();
    assert_eq!(
        kinds,
        vec![json!("init"), json!("token"), json!("completion")]
    );
    let done = last(&h, c);
    assert_eq!(done["finish_reason"], "cancelled");
    assert_eq!(done["usage"]["prompt_tokens"], ptoks("Hello"));
    assert_eq!(done["usage"]["completion_tokens"], 0);
}

#[test]
fn a_prompt_too_long_by_its_bytes_is_refused_without_tokenizing() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    // The byte codec's tokens are at most one byte: 600 bytes cannot fit 512.
    h.send(c, config(&"x".repeat(600), json!({"max_tokens": 1})));
    assert_eq!(h.text_jobs_run, 0);
    let e = last(&h, c);
    assert_eq!(e["error"], "context_length_exceeded");
    assert_eq!(e["recovery_action"], "shorten_prompt");
    assert!(e["message"].as_str().unwrap_or("").contains("600 bytes"));
    // Fits by bytes but not with max_tokens: reduce max_tokens.
    h.send(c, config(&"x".repeat(300), json!({"max_tokens": 300})));
    assert_eq!(h.text_jobs_run, 0);
    assert_eq!(last(&h, c)["recovery_action"], "reduce_max_tokens");
    // A prompt that may fit is tokenized, and the exact count decides.
    h.send(c, config(&"x".repeat(300), json!({"max_tokens": 212})));
    assert_eq!(h.text_jobs_run, 1);
    assert_eq!(last(&h, c)["error"], "context_length_exceeded");
    h.send(c, config(&"x".repeat(300), json!({"max_tokens": 211})));
    assert_eq!(last(&h, c)["type"], "init");
}

#[test]
fn a_connection_gone_while_its_prompt_is_tokenized_starts_nothing() {
    let mut h = harness();
    h.auto_text = false;
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hello", json!({"max_tokens": 5})));
    h.input(Input::Closed { conn: c });
    h.finish_text_jobs();
    assert!(h.received(c).is_empty());
    assert_eq!(h.host.stats().generations, 0);
    assert!(h.pending_step.is_none());
}

#[test]
fn frames_piling_up_while_waiting_pause_reading_until_they_are_handled() {
    let mut h = harness();
    h.auto_text = false;
    let c = h.open(1, Dialect::Generate);
    let paused = |h: &Harness| {
        h.others
            .iter()
            .filter(|o| matches!(o, Output::PauseReading { conn } if *conn == c))
            .count()
    };
    let resumed = |h: &Harness| {
        h.others
            .iter()
            .filter(|o| matches!(o, Output::ResumeReading { conn } if *conn == c))
            .count()
    };
    h.send(c, config("Hello", json!({"max_tokens": 5})));
    for _ in 0..15 {
        h.send(c, json!({"type": "feedback", "rating": 1}));
    }
    assert_eq!(paused(&h), 0, "15 frames may wait without pushing back");
    h.send(c, json!({"type": "feedback", "rating": 1}));
    assert_eq!(paused(&h), 1, "the 16th asks the shell to stop reading");
    // Frames already on their way still count and are kept, in order.
    for _ in 0..20 {
        h.send(c, json!({"type": "feedback", "rating": -1}));
    }
    assert_eq!(paused(&h), 1);
    assert!(h.received(c).is_empty());
    h.finish_text_jobs();
    assert_eq!(
        resumed(&h),
        1,
        "reading resumes once every held frame is handled"
    );
    let kinds: Vec<Value> = h.received(c).iter().map(|f| f["type"].clone()).collect();
    assert_eq!(kinds[0], "init");
    // Every held frame was answered: 30 acknowledged, and past the
    // feedback rate limit (30 a minute) the rest refused.
    assert_eq!(
        h.of_type(c, "status").len() + h.of_type(c, "error").len(),
        36,
        "every held feedback was answered"
    );
    assert_eq!(h.of_type(c, "status").len(), 30);
    assert!(!h.closes.contains_key(&c));
}

#[test]
fn a_client_that_ignores_the_pause_is_closed() {
    let mut h = harness();
    h.auto_text = false;
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hello", json!({"max_tokens": 5})));
    for _ in 0..4096 {
        h.send(c, json!({"type": "control", "action": "pause"}));
    }
    assert!(!h.closes.contains_key(&c), "4096 frames may wait");
    h.send(c, json!({"type": "control", "action": "pause"}));
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1008));
}

#[test]
fn shutdown_waits_for_a_prompt_being_tokenized_then_refuses_it() {
    let mut h = harness();
    h.auto_text = false;
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hello", json!({"max_tokens": 5})));
    h.input(Input::Shutdown);
    assert!(
        !h.others
            .iter()
            .any(|o| matches!(o, Output::ShutdownComplete)),
        "a request is in flight"
    );
    h.finish_text_jobs();
    let e = last(&h, c);
    assert_eq!(e["type"], "error");
    assert_eq!(e["recovery_action"], "retry");
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1001));
    assert!(h
        .others
        .iter()
        .any(|o| matches!(o, Output::ShutdownComplete)));
}

#[test]
fn a_modify_whose_length_could_never_fit_the_cache_is_refused() {
    // 64 blocks of 16 tokens: 1024 positions, in a 2048-token context.
    let mut info = tiny_model_info();
    info.context_len = 2048;
    let mut h = Harness::with_info(HostConfig::default(), info, SCRIPT, 7);
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 10})));
    h.run(2);
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"max_tokens": 1500}}),
    );
    let e = last(&h, c);
    assert_eq!(e["error"], "invalid_request");
    assert!(
        e["message"].as_str().unwrap_or("").contains("KV cache"),
        "{e}"
    );
    // Nothing changed: it ends at its 10 tokens.
    h.run(50);
    assert_eq!(last(&h, c)["usage"]["completion_tokens"], 10);
}

#[test]
fn a_prompt_being_tokenized_keeps_its_connection_busy_and_restarts_the_idle_clock() {
    let mut h = harness();
    h.auto_text = false;
    let c = h.open(1, Dialect::Generate);
    // Fits by its bytes, not by its tokens: refused once tokenized.
    h.send(c, config(&"x".repeat(300), json!({"max_tokens": 212})));
    h.advance(Duration::from_secs(11 * 60));
    assert!(!h.closes.contains_key(&c), "a request is in flight");
    h.finish_text_jobs();
    assert_eq!(last(&h, c)["error"], "context_length_exceeded");
    h.advance(Duration::from_secs(9 * 60));
    assert!(!h.closes.contains_key(&c), "idle only since the answer");
    h.advance(Duration::from_secs(2 * 60));
    assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1000));
}

#[test]
fn a_request_held_while_the_model_loads_keeps_its_connection_from_idling_out() {
    let cfg = HostConfig::default();
    let idle = cfg.idle_timeout;
    let mut host = tokenwire_core::Host::new(cfg, 1u64);
    let mut now = tokenwire_core::Instant::ZERO;
    let c = ConnId(1);
    host.handle(
        now,
        Input::Open {
            conn: c,
            dialect: Dialect::Generate,
            transport: tokenwire_core::Transport::WebSocket,
            query: String::new(),
            authorization: None,
            peer: String::new(),
        },
    );
    host.handle(
        now,
        Input::Text {
            conn: c,
            text: config("Hi", json!({"max_tokens": 2})).to_string(),
        },
    );
    let end = now + idle + idle;
    let mut closed = false;
    while let Some(t) = host.poll_timeout() {
        if t > end {
            break;
        }
        now = t;
        host.handle(now, Input::Timeout);
        while let Some(o) = host.poll_output() {
            match o {
                Output::Close { .. } => closed = true,
                // A live client answers its pings.
                Output::Ping { conn } => host.handle(now, Input::Pong { conn }),
                _ => {}
            }
        }
    }
    assert!(
        !closed,
        "a request waiting for the model is a request in flight, not idleness"
    );
    assert_eq!(host.stats().connections, 1);
}

#[test]
fn feedback_is_rate_limited_per_connection_and_nothing_more_is_handed_out() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    h.send(c, config("Hi", json!({"max_tokens": 2})));
    h.run(10);
    let fb = json!({"type": "feedback", "rating": 1, "text": "good"});
    for _ in 0..30 {
        h.send(c, fb.clone());
        assert_eq!(last(&h, c)["operation"], "feedback_received");
    }
    h.send(c, fb.clone());
    let e = last(&h, c);
    assert_eq!(e["error"], "rate_limited", "{e}");
    let handed = h
        .others
        .iter()
        .filter(|o| matches!(o, Output::Feedback(_)))
        .count();
    assert_eq!(handed, 30, "the 31st reaches no log");
    h.advance(Duration::from_secs(2));
    h.send(c, fb);
    assert_eq!(last(&h, c)["operation"], "feedback_received", "refilled");
}

#[test]
fn a_keys_organisation_limits_apply_to_generate_too() {
    use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
    let cfg = HostConfig {
        keys: Some(
            KeyRing::new(vec![ApiKey {
                name: "k".into(),
                sha256: hash_key("key-k"),
                orgs: vec!["org".into()],
                requests_per_minute: Some(2),
                tokens_per_minute: None,
            }])
            .expect("ring"),
        ),
        ..HostConfig::default()
    };
    let mut h = Harness::new(cfg, SCRIPT, 7);
    let keyed = h.open_with(1, Dialect::Generate, "authorization=key-k");
    let anonymous = h.open(2, Dialect::Generate);
    for _ in 0..2 {
        h.send(keyed, config("Hi", json!({"max_tokens": 2})));
        h.run(20);
        assert_eq!(last(&h, keyed)["type"], "completion");
    }
    h.send(keyed, config("Hi", json!({"max_tokens": 2})));
    let e = last(&h, keyed);
    assert_eq!(e["error"], "rate_limited", "{e}");
    assert!(e["message"]
        .as_str()
        .is_some_and(|m| m.contains("rate limit")));
    // Without a key nothing is metered.
    for _ in 0..3 {
        h.send(anonymous, config("Hi", json!({"max_tokens": 2})));
        h.run(20);
        assert_eq!(last(&h, anonymous)["type"], "completion");
    }
    // Half a minute refills one request.
    h.advance(Duration::from_secs(30));
    h.send(keyed, config("Hi", json!({"max_tokens": 2})));
    h.run(20);
    assert_eq!(last(&h, keyed)["type"], "completion");
}

#[test]
fn a_repeated_prompt_reuses_its_cached_blocks_and_gives_the_same_text() {
    let mut h = harness();
    let c = h.open(1, Dialect::Generate);
    let prompt = "a system prompt long enough for a few KV blocks: ".repeat(2);
    let opts = json!({"max_tokens": 6, "temperature": 0});
    let mut cfg = config(&prompt, opts.clone());
    cfg["options"] = json!({"include_timing": true});
    h.send(c, cfg.clone());
    h.run(50);
    let first = last(&h, c);
    assert_eq!(first["timing"]["cached_tokens"], 0, "nothing cached yet");
    let reused_before = h
        .others
        .iter()
        .filter(|o| matches!(o, Output::Event(tokenwire_core::Event::PrefixCacheLookup { hit, .. }) if *hit > 0))
        .count();
    assert_eq!(reused_before, 0);
    h.send(c, cfg);
    h.run(50);
    let second = last(&h, c);
    let cached = second["timing"]["cached_tokens"].as_u64().unwrap_or(0);
    let prompt_tokens = ptoks(&prompt) as u64;
    assert_eq!(
        cached,
        (prompt_tokens - 1) / 16 * 16,
        "every full block but the last token's"
    );
    assert_eq!(
        second["generated_text"], first["generated_text"],
        "the same tokens"
    );
    assert_eq!(second["usage"], first["usage"]);
    assert!(h.host.stats().kv_blocks_cached > 0);
    assert_eq!(
        h.host.stats().kv_blocks_used,
        0,
        "cached blocks are not used ones"
    );
}

#[test]
fn with_the_prefix_cache_off_nothing_is_reused() {
    let mut h = Harness::new(
        HostConfig {
            prefix_cache: false,
            ..HostConfig::default()
        },
        SCRIPT,
        7,
    );
    let c = h.open(1, Dialect::Generate);
    let prompt = "a system prompt long enough for a few KV blocks: ".repeat(2);
    let mut cfg = config(&prompt, json!({"max_tokens": 6, "temperature": 0}));
    cfg["options"] = json!({"include_timing": true});
    for _ in 0..2 {
        h.send(c, cfg.clone());
        h.run(50);
        assert_eq!(last(&h, c)["timing"]["cached_tokens"], 0);
    }
    assert_eq!(h.host.stats().kv_blocks_cached, 0);
}

/// Found by the simulator: a frame held while the model loads is answered
/// when the model is there, and the idle clock starts again then, not at
/// the frame's arrival (the connection was closed as idle before the idle
/// timeout had passed since its answer).
#[test]
fn a_frame_held_while_loading_restarts_the_idle_clock_when_it_is_answered() {
    let config_with_idle = HostConfig {
        idle_timeout: Duration::from_secs(8),
        ..HostConfig::default()
    };
    let mut host = tokenwire_core::Host::new(config_with_idle, 1u64);
    let at = |s: u64| tokenwire_core::Instant::ZERO + Duration::from_secs(s);
    let c = ConnId(1);
    host.handle(
        at(0),
        Input::Open {
            conn: c,
            dialect: Dialect::Generate,
            transport: tokenwire_core::Transport::WebSocket,
            query: String::new(),
            authorization: None,
            peer: String::new(),
        },
    );
    // Refused as soon as it is read: no generation ever runs.
    let bad = config("Hi", json!({"temperature": 9}));
    host.handle(
        at(0),
        Input::Text {
            conn: c,
            text: bad.to_string(),
        },
    );
    host.handle(
        at(5),
        Input::ModelLoaded {
            info: tiny_model_info(),
            codec: tokenwire_core::testing::ByteCodec::shared(),
        },
    );
    let mut answered = false;
    let mut closed_at = None;
    for s in 5..=14 {
        host.handle(at(s), Input::Timeout);
        while let Some(o) = host.poll_output() {
            match o {
                Output::Send { text, .. } => answered |= text.contains("\"error\""),
                Output::Close { reason, .. } if reason == "idle timeout" => {
                    closed_at.get_or_insert(s);
                }
                _ => {}
            }
        }
    }
    assert!(
        answered,
        "the held config was refused once the model loaded"
    );
    assert_eq!(closed_at, Some(13), "idle for 8 s after its answer at 5 s");
}
