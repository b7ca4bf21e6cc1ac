//! The `responses` dialect against PROTOCOLS.md through a Host with a
//! scripted engine and virtual time: event order and numbering, terminal
//! events, continuations, cancel, concurrency, warm-up, limits, lifetime,
//! failures, and the HTTP store.

use serde_json::{json, Value};
use tokenwire_core::testing::{script_text, ByteCodec, Harness};
use tokenwire_core::{
    ChatMessage, ConnId, Dialect, Duration, EngineFault, EngineFaultKind, Event, HostConfig, Input,
    Output, Role, TextCodec, Transport,
};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness() -> Harness {
    Harness::new(HostConfig::default(), SCRIPT, 1)
}

fn create(input: Value, max: u32) -> Value {
    json!({"type":"response.create","model":"tiny","input":input,"max_output_tokens":max,"temperature":0})
}

fn events(h: &Harness, c: ConnId) -> Vec<Value> {
    h.received(c).to_vec()
}

fn kinds(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["type"].as_str().unwrap_or("").to_string())
        .collect()
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

/// An error event's status, code and param.
fn error_parts(e: &Value) -> (Option<u64>, Option<&str>, Option<&str>) {
    (
        e["status"].as_u64(),
        e["error"]["code"].as_str(),
        e["error"]["param"].as_str(),
    )
}

fn prompt_len(messages: &[(Role, &str)]) -> usize {
    let m: Vec<ChatMessage> = messages
        .iter()
        .map(|(role, c)| ChatMessage::new(*role, c.to_string()))
        .collect();
    ByteCodec.encode_chat(&m).expect("enc").len()
}

/// Checks one response's events: numbering from 0, one terminal event last,
/// every added item done before it. Returns the terminal event.
fn check_response(evs: &[Value]) -> Value {
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    let terminal: Vec<&Value> = evs
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("response.completed" | "response.incomplete" | "response.failed")
            )
        })
        .collect();
    assert_eq!(terminal.len(), 1, "{:?}", kinds(evs));
    let last = evs.last().expect("events");
    assert_eq!(last, terminal[0]);
    let added = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .count();
    let done = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .count();
    assert_eq!(added, done);
    last.clone()
}

#[test]
fn a_response_streams_in_order_and_ends_incomplete_at_max_output_tokens() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(c, create(json!("hi"), 5));
    h.run(50);
    let evs = events(&h, c);
    assert_eq!(
        kinds(&evs)[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.incomplete");
    let r = &end["response"];
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    let p = prompt_len(&[(Role::User, "hi")]);
    let text = script_text(SCRIPT, p, 5);
    let deltas: String = evs
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, text);
    assert_eq!(r["output"][0]["content"][0]["text"], text.as_str());
    assert_eq!(r["usage"]["input_tokens"], p as u64);
    assert_eq!(r["usage"]["output_tokens"], 5);
    assert_eq!(r["usage"]["total_tokens"], p as u64 + 5);
    assert!(r["id"].as_str().is_some_and(|i| i.starts_with("resp_")));
    assert!(r["output"][0]["id"]
        .as_str()
        .is_some_and(|i| i.starts_with("msg_")));
    assert_eq!(r["temperature"], json!(0), "echoed as sent");
    assert_eq!(r["max_output_tokens"], 5);
    assert_eq!(evs[0]["response"]["output"], json!([]));
}

#[test]
fn an_end_of_sequence_completes_and_a_continuation_sees_the_whole_conversation() {
    // A 0 byte in the script is the end-of-sequence token.
    let mut h = Harness::new(HostConfig::default(), "abc\0", 1);
    let c = h.open(1, Dialect::Responses);
    h.send(
        c,
        json!({"type":"response.create","input":"hey","instructions":"be nice","temperature":0}),
    );
    h.run(50);
    let end = check_response(&events(&h, c));
    assert_eq!(end["type"], "response.completed", "{end}");
    assert_eq!(end["response"]["incomplete_details"], Value::Null);
    let id = end["response"]["id"].as_str().expect("id").to_string();
    let out1 = end["response"]["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    h.frames.clear();
    h.send(c, json!({"type":"response.create","input":[{"role":"user","content":[{"type":"input_text","text":"more"}]}],
                     "previous_response_id":id,"max_output_tokens":2,"temperature":0}));
    h.run(50);
    let end2 = check_response(&events(&h, c));
    // Instructions do not carry over; the old input and output do.
    let p = prompt_len(&[
        (Role::User, "hey"),
        (Role::Assistant, &out1),
        (Role::User, "more"),
    ]);
    assert_eq!(end2["response"]["usage"]["input_tokens"], p as u64);
    assert_eq!(end2["response"]["previous_response_id"], id.as_str());
}

#[test]
fn an_unknown_previous_id_is_404_and_the_connection_goes_on() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(
        c,
        json!({"type":"response.create","input":"x","previous_response_id":"resp_nope"}),
    );
    let e = last(&h, c);
    assert_eq!(e["type"], "error");
    assert_eq!(e["status"], 404);
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["param"], "previous_response_id");
    h.frames.clear();
    h.send(c, create(json!("x"), 2));
    h.run(20);
    check_response(&events(&h, c));
    // A response id from another connection never resolves here.
    let id = last(&h, c)["response"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let d = h.open(2, Dialect::Responses);
    h.send(
        d,
        json!({"type":"response.create","input":"x","previous_response_id":id}),
    );
    assert_eq!(last(&h, d)["error"]["code"], "previous_response_not_found");
}

#[test]
fn cancel_ends_the_response_cancelled_and_concurrent_creates_are_refused() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(c, create(json!("x"), 300));
    h.run(3);
    h.send(c, create(json!("y"), 3));
    let e = last(&h, c);
    assert_eq!(
        (e["status"].as_u64(), e["error"]["code"].as_str()),
        (Some(409), Some("concurrent_request"))
    );
    h.send(
        c,
        json!({"type":"response.cancel","response_id":"resp_other"}),
    );
    assert_eq!(last(&h, c)["error"]["param"], "response_id");
    h.send(c, json!({"type":"response.cancel"}));
    h.run(10);
    let evs: Vec<Value> = events(&h, c)
        .into_iter()
        .filter(|e| e["type"] != "error")
        .collect();
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.incomplete");
    assert_eq!(end["response"]["status"], "cancelled");
    assert_eq!(end["response"]["incomplete_details"], Value::Null);
    assert_eq!(h.host.stats().generations, 0);
    assert_eq!(h.host.stats().kv_blocks_used, 0);
    // A cancelled response is not one to continue from.
    let id = end["response"]["id"].as_str().expect("id").to_string();
    h.send(
        c,
        json!({"type":"response.create","input":"z","previous_response_id":id}),
    );
    assert_eq!(last(&h, c)["error"]["code"], "previous_response_not_found");
    h.send(c, json!({"type":"response.cancel"}));
    assert_eq!(
        last(&h, c)["error"]["code"],
        "invalid_request",
        "nothing to cancel"
    );
}

#[test]
fn a_warm_up_caches_the_input_and_a_continuation_uses_it() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(
        c,
        json!({"type":"response.create","input":"warm","generate":false,"stream_id":"s-1"}),
    );
    let evs = events(&h, c);
    assert_eq!(kinds(&evs), ["response.created", "response.completed"]);
    assert!(evs.iter().all(|e| e["stream_id"] == "s-1"));
    let r = &evs[1]["response"];
    assert_eq!(r["output"], json!([]));
    let p = prompt_len(&[(Role::User, "warm")]);
    assert_eq!(r["usage"]["input_tokens"], p as u64);
    assert_eq!(r["usage"]["output_tokens"], 0);
    assert_eq!(h.steps_run, 0, "nothing ran");
    let id = r["id"].as_str().expect("id").to_string();
    h.frames.clear();
    h.send(c, json!({"type":"response.create","input":"go","previous_response_id":id,"max_output_tokens":2,"temperature":0}));
    h.run(20);
    let end = check_response(&events(&h, c));
    let p2 = prompt_len(&[(Role::User, "warm"), (Role::User, "go")]);
    assert_eq!(end["response"]["usage"]["input_tokens"], p2 as u64);
}

#[test]
fn bad_events_get_specific_errors_and_the_connection_stays() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send_raw(c, "{oops");
    h.send(c, json!({"type":"response.steer","input":"x"}));
    h.send(
        c,
        json!({"type":"response.create","input":"x","temperature":9}),
    );
    h.send(
        c,
        json!({"type":"response.create","input":[{"type":"input_image","image_url":"u"}]}),
    );
    h.send(
        c,
        json!({"type":"response.create","input":"x","model":"gpt-9"}),
    );
    h.input(Input::Binary { conn: c, len: 2 });
    let got: Vec<(u64, String)> = h
        .of_type(c, "error")
        .iter()
        .map(|e| {
            (
                e["status"].as_u64().unwrap_or(0),
                e["error"]["code"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want = [
        (400, "invalid_json"),
        (400, "unknown_event_type"),
        (400, "invalid_request"),
        (400, "invalid_request"),
        (404, "model_not_found"),
        (400, "invalid_request"),
    ];
    assert_eq!(got, want.map(|(s, c)| (s, c.to_string())).to_vec());
    assert_eq!(h.of_type(c, "error")[2]["error"]["param"], "temperature");
    assert!(h.closes.is_empty());
    h.frames.clear();
    h.send(c, create(json!("ok"), 1));
    h.run(10);
    check_response(&events(&h, c));
}

#[test]
fn the_connection_limit_refuses_with_1013_and_the_lifetime_closes_with_1000() {
    let config = HostConfig {
        max_websocket_connections: 1,
        responses_expiring_after: Duration::from_secs(1),
        responses_lifetime: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(60),
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, SCRIPT, 1);
    let a = h.open(1, Dialect::Responses);
    let names: Vec<String> = h
        .others
        .iter()
        .filter_map(|o| match o {
            Output::Event(Event::ConnectionNamed { conn, name, .. }) if *conn == a => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(names.len(), 1, "each socket is named once");
    let uuid = names[0].strip_prefix("ws-").expect("ws- prefix");
    assert_eq!(uuid.len(), 36);
    assert_eq!(&uuid[14..15], "7", "a UUID v7: {uuid}");
    let b = h.open(2, Dialect::Responses);
    assert_eq!(
        last(&h, b)["error"]["code"],
        "websocket_connection_limit_reached"
    );
    assert_eq!(h.closes.get(&b).map(|x| x.0), Some(1013));
    assert!(!h.closes.contains_key(&a));
    h.advance(Duration::from_millis(1500));
    assert_eq!(last(&h, a)["error"]["code"], "connection_expiring");
    assert!(!h.closes.contains_key(&a));
    h.advance(Duration::from_secs(1));
    assert_eq!(h.closes.get(&a).map(|x| x.0), Some(1000));
    let c = h.open(3, Dialect::Responses);
    assert!(!h.closes.contains_key(&c), "a slot is free again");
    // HTTP requests do not count against the socket limit.
    let web = ConnId(9);
    h.input(Input::Open {
        conn: web,
        dialect: Dialect::Responses,
        transport: Transport::Http,
        query: String::new(),
        authorization: None,
        peer: "p".into(),
    });
    assert!(!h.closes.contains_key(&web));
}

#[test]
fn a_failed_response_ends_failed_and_evicts_the_cache() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(c, create(json!("a"), 2));
    h.run(10);
    let id = last(&h, c)["response"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    h.frames.clear();
    h.send(c, json!({"type":"response.create","input":"b","previous_response_id":id,"max_output_tokens":50}));
    h.run(2);
    let step = h.pending_step.take().expect("a step");
    h.input(Input::EngineFault(EngineFault {
        step_id: step.step_id,
        kind: EngineFaultKind::Internal("boom".into()),
    }));
    let end = check_response(&events(&h, c));
    assert_eq!(end["type"], "response.failed");
    assert_eq!(end["response"]["status"], "failed");
    assert_eq!(end["response"]["error"]["code"], "server_error");
    h.send(
        c,
        json!({"type":"response.create","input":"c","previous_response_id":id}),
    );
    assert_eq!(last(&h, c)["error"]["code"], "previous_response_not_found");
}

#[test]
fn http_responses_are_stored_retrieved_and_continued() {
    let mut h = harness();
    let open = |h: &mut Harness, n: u64| {
        let c = ConnId(n);
        h.input(Input::Open {
            conn: c,
            dialect: Dialect::Responses,
            transport: Transport::Http,
            query: String::new(),
            authorization: None,
            peer: "p".into(),
        });
        c
    };
    let a = open(&mut h, 10);
    h.send(a, create(json!("hello"), 3));
    h.run(10);
    let r = last(&h, a)["response"].clone();
    let id = r["id"].as_str().expect("id").to_string();
    h.input(Input::Closed { conn: a });
    let b = open(&mut h, 11);
    h.send(b, json!({"type":"response.retrieve","response_id":id}));
    assert_eq!(last(&h, b)["response"], r);
    let c = open(&mut h, 12);
    h.send(c, json!({"type":"response.create","input":"again","previous_response_id":id,"max_output_tokens":2,"temperature":0}));
    h.run(10);
    let out = r["output"][0]["content"][0]["text"].as_str().expect("text");
    let p = prompt_len(&[
        (Role::User, "hello"),
        (Role::Assistant, out),
        (Role::User, "again"),
    ]);
    assert_eq!(last(&h, c)["response"]["usage"]["input_tokens"], p as u64);
    let d = open(&mut h, 13);
    h.send(
        d,
        json!({"type":"response.create","input":"x","store":false,"max_output_tokens":1}),
    );
    h.run(5);
    let unstored = last(&h, d)["response"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    h.send(
        d,
        json!({"type":"response.retrieve","response_id":unstored}),
    );
    assert_eq!(last(&h, d)["status"], 404);
}

#[test]
fn a_stored_response_is_found_only_by_the_key_that_made_it() {
    use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
    let key = |name: &str| ApiKey {
        name: name.into(),
        sha256: hash_key(name),
        orgs: vec![format!("org_{name}")],
        requests_per_minute: None,
        tokens_per_minute: None,
    };
    let cfg = HostConfig {
        keys: Some(KeyRing::new(vec![key("alice"), key("bob")]).expect("ring")),
        ..HostConfig::default()
    };
    let mut h = Harness::new(cfg, "0123456789", 1);
    let open = |h: &mut Harness, n: u64, who: Option<&str>| {
        let c = ConnId(n);
        h.input(Input::Open {
            conn: c,
            dialect: Dialect::Responses,
            transport: Transport::Http,
            query: String::new(),
            authorization: who.map(|k| format!("Bearer {k}")),
            peer: "p".into(),
        });
        c
    };
    let a = open(&mut h, 10, Some("alice"));
    h.send(a, create(json!("alice's secret"), 3));
    h.run(10);
    let r = last(&h, a)["response"].clone();
    let id = r["id"].as_str().expect("id").to_string();
    for (n, who) in [(11, Some("bob")), (12, None)] {
        let c = open(&mut h, n, who);
        h.send(c, json!({"type":"response.retrieve","response_id":id}));
        let miss = last(&h, c);
        assert_eq!(miss["status"], 404, "{who:?}");
        assert_eq!(
            miss["error"]["message"],
            format!("no stored response with id '{id}'"),
            "the answer of an id that never existed"
        );
        h.send(c, json!({"type":"response.create","input":"x","previous_response_id":id,"max_output_tokens":1}));
        assert_eq!(last(&h, c)["error"]["code"], "previous_response_not_found");
    }
    let again = open(&mut h, 13, Some("alice"));
    h.send(again, json!({"type":"response.retrieve","response_id":id}));
    assert_eq!(last(&h, again)["response"], r, "alice finds her own");
}

#[test]
fn input_after_a_function_call_joins_the_calls_turn_only_when_the_assistant_wrote_it() {
    use tokenwire_core::dialect::responses::codec::{decode_client, ClientEvent};
    let input = |items: Value| {
        let text = json!({"type":"response.create","model":"tiny","input":items}).to_string();
        match decode_client(&text).expect("a valid create") {
            ClientEvent::Create(c) => c
                .input
                .iter()
                .map(|m| (m.role, m.content.clone()))
                .collect::<Vec<_>>(),
            other => panic!("not a create: {other:?}"),
        }
    };
    let call = json!({"type":"function_call","call_id":"c1","name":"f","arguments":"{}"});
    // The assistant's text after its own call is the same turn.
    let same_turn = input(json!([call, {"role":"assistant","content":"then"}]));
    assert_eq!(same_turn.len(), 1, "{same_turn:?}");
    assert_eq!(same_turn[0].0, Role::Assistant);
    assert!(same_turn[0].1.ends_with("then"), "{same_turn:?}");
    // Text before and after the call: one turn, its texts on their own
    // lines, the call (with its id) beside them.
    let text = json!({"type":"response.create","model":"tiny","input":[
        {"role":"assistant","content":"Let me check."}, call, {"role":"assistant","content":"then"}]});
    let ClientEvent::Create(c) = decode_client(&text.to_string()).expect("a valid create") else {
        panic!("not a create")
    };
    assert_eq!(c.input.len(), 1, "{:?}", c.input);
    assert_eq!(c.input[0].content, "Let me check.\nthen");
    assert_eq!(c.input[0].tool_calls.len(), 1);
    assert_eq!(c.input[0].tool_calls[0].id, "c1");
    // A user message after the call is the user's own.
    let next = input(json!([call, {"role":"user","content":"next"}]));
    assert_eq!(next.len(), 2, "{next:?}");
    assert_eq!(next[1], (Role::User, "next".to_string()));
}

#[test]
fn metadata_takes_sixteen_keys_and_refuses_a_seventeenth() {
    // PROTOCOLS.md (the Responses API's limits): at most 16 keys, each a
    // string. Exactly 16 run; 17, or a value that is not a string, get a
    // 400 naming the field, and the connection goes on.
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    let keys = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
    };
    let with = |metadata: Value| {
        let mut e = create(json!("hi"), 2);
        e["metadata"] = metadata;
        e
    };
    h.send(c, with(keys(16)));
    h.run(20);
    let done = check_response(&events(&h, c));
    assert_eq!(done["response"]["metadata"], keys(16), "{done}");
    h.frames.clear();
    h.send(c, with(keys(17)));
    let e = last(&h, c);
    assert_eq!(
        error_parts(&e),
        (Some(400), Some("invalid_request"), Some("metadata")),
        "{e}"
    );
    h.send(c, with(json!({"n": 1})));
    assert_eq!(last(&h, c)["error"]["param"], "metadata.n");
    h.run(20);
    assert_eq!(kinds(&events(&h, c)), ["error", "error"], "nothing ran");
    assert!(h.closes.is_empty());
}

#[test]
fn an_input_too_long_even_alone_is_context_length_exceeded() {
    // One message that cannot fit beside max_output_tokens however much is
    // dropped: context_length_exceeded on `input`, and nothing runs.
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    h.send(c, create(json!("x".repeat(500)), 100));
    let e = last(&h, c);
    assert_eq!(
        error_parts(&e),
        (Some(400), Some("context_length_exceeded"), Some("input")),
        "{e}"
    );
    h.run(20);
    assert_eq!(kinds(&events(&h, c)), ["error"], "nothing ran");
    assert!(h.closes.is_empty());
}

/// Each Response status has its terminal event, and those events (only
/// they) end a response.
#[test]
fn each_status_has_its_terminal_event() {
    use tokenwire_core::dialect::responses::codec::{is_terminal, terminal_event_type};
    for (status, kind) in [
        ("completed", "response.completed"),
        ("failed", "response.failed"),
        ("incomplete", "response.incomplete"),
        ("cancelled", "response.incomplete"),
    ] {
        assert_eq!(terminal_event_type(status), kind, "{status}");
        assert!(is_terminal(kind), "{kind}");
    }
    assert!(!is_terminal("response.in_progress"));
}

#[test]
fn a_call_the_model_writes_streams_as_a_function_call_item() {
    // With tools offered, the model's Hermes markup is a call, not text: a
    // function_call item added, its arguments streamed and done, the item
    // done, and the same item in the completed Response's output.
    let call = r#"<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>"#;
    let tool = json!({"type":"function","name":"get_weather",
                      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}});
    let mut create = create(json!("weather in Paris?"), 200);
    create["tools"] = json!([tool]);
    // The script engine writes by position: a first run learns the
    // prompt's length (tools described in it), so that the second's answer
    // starts at the call.
    let mut probe = Harness::new(HostConfig::default(), "a\0", 1);
    let c = probe.open(1, Dialect::Responses);
    probe.send(c, create.clone());
    probe.run(50);
    let prompt = check_response(&events(&probe, c))["response"]["usage"]["input_tokens"]
        .as_u64()
        .expect("input_tokens") as usize;
    let script = format!("{}{call}\0", "x".repeat(prompt));
    let mut h = Harness::new(HostConfig::default(), &script, 1);
    let c = h.open(1, Dialect::Responses);
    h.send(c, create);
    h.run(200);
    let evs = events(&h, c);
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.completed", "{end}");
    let output = end["response"]["output"].as_array().expect("output");
    let calls: Vec<&Value> = output
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{output:?}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    let args: Value =
        serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("json");
    assert_eq!(args, json!({"city":"Paris"}));
    assert!(call["call_id"]
        .as_str()
        .is_some_and(|i| i.starts_with("call_")));
    // No message carries the markup as text.
    assert!(
        output
            .iter()
            .all(|i| i["type"] != "message" || !i.to_string().contains("tool_call")),
        "{output:?}"
    );
    let of_kind = |k: &str| -> Vec<&Value> { evs.iter().filter(|e| e["type"] == k).collect() };
    let added = of_kind("response.output_item.added");
    assert!(
        added
            .iter()
            .any(|e| e["item"]["type"] == "function_call" && e["item"]["id"] == call["id"]),
        "{:?}",
        kinds(&evs)
    );
    let done = of_kind("response.function_call_arguments.done");
    assert_eq!(done.len(), 1, "{:?}", kinds(&evs));
    assert_eq!(done[0]["arguments"], call["arguments"]);
    assert_eq!(done[0]["item_id"], call["id"]);
    let deltas: String = of_kind("response.function_call_arguments.delta")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, call["arguments"].as_str().expect("arguments"));
    assert!(of_kind("response.output_item.done")
        .iter()
        .any(|e| &e["item"] == call));
}

/// The engine's script for the reasoning tests: Qwen3-style thinking, then
/// the answer, then the end of the sequence (a `0` byte).
const THINKING: &str = "<think>\nplan it\n</think>\n\nthe answer\0";

/// A harness whose engine writes [`THINKING`], with the `<think>`
/// reasoning parser.
fn thinking_harness() -> Harness {
    let config = HostConfig {
        reasoning_tags: Some(tokenwire_core::reasoning::ReasoningTags::THINK),
        ..HostConfig::default()
    };
    Harness::new(config, THINKING, 1)
}

/// A user input that makes the engine start at [`THINKING`]'s start.
fn thinking_input() -> String {
    (0..THINKING.len())
        .map(|pad| "x".repeat(pad))
        .find(|c| {
            let p = prompt_len(&[(Role::User, c)]);
            script_text(THINKING, p, 8) == THINKING[..8]
        })
        .expect("some input starts the script at its start")
}

#[test]
fn with_a_reasoning_parser_the_thinking_is_a_reasoning_item_before_the_message() {
    let mut h = thinking_harness();
    let c = h.open(1, Dialect::Responses);
    let input = thinking_input();
    h.send(c, create(json!(input), 100));
    h.run(100);
    let evs = events(&h, c);
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.completed", "{:?}", kinds(&evs));
    let output = end["response"]["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{end}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(
        output[0]["content"],
        json!([{"type": "reasoning_text", "text": "plan it"}])
    );
    assert_eq!(output[0]["status"], "completed");
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["content"][0]["text"], "the answer");
    let usage = &end["response"]["usage"];
    let through_close = THINKING.find("</think>").expect("tag") + "</think>".len();
    assert_eq!(
        usage["output_tokens_details"]["reasoning_tokens"], through_close,
        "{usage}"
    );
    // The reasoning item is streamed and closed before the message opens.
    let k = kinds(&evs);
    let deltas: String = evs
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, "plan it");
    let reasoning_done = k
        .iter()
        .position(|t| t == "response.reasoning_text.done")
        .expect("reasoning done");
    let first_text = k
        .iter()
        .position(|t| t == "response.output_text.delta")
        .expect("text");
    assert!(reasoning_done < first_text, "{k:?}");
    // A continuation sees the answer, not the thinking; a reasoning item
    // sent back as input is left out of the prompt, as the template would.
    h.send(
        c,
        json!({"type":"response.create","model":"tiny","input":[
            output[0].clone(),
            {"role": "user", "content": "more"}],
            "previous_response_id": end["response"]["id"], "max_output_tokens": 1}),
    );
    h.run(50);
    let next = last(&h, c);
    assert_eq!(
        next["response"]["usage"]["input_tokens"],
        prompt_len(&[
            (Role::User, &input),
            (Role::Assistant, "the answer"),
            (Role::User, "more")
        ]),
        "{next}"
    );
}

#[test]
fn a_response_cut_short_while_thinking_is_one_incomplete_reasoning_item() {
    let mut h = thinking_harness();
    let c = h.open(1, Dialect::Responses);
    h.send(c, create(json!(thinking_input()), 12));
    h.run(100);
    let evs = events(&h, c);
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.incomplete", "{:?}", kinds(&evs));
    let output = &end["response"]["output"];
    assert_eq!(
        output,
        &json!([{"type": "reasoning", "id": output[0]["id"], "summary": [],
                 "content": [{"type": "reasoning_text", "text": "plan"}], "status": "incomplete"}]),
        "{end}"
    );
    let usage = &end["response"]["usage"];
    assert_eq!(
        usage["output_tokens_details"]["reasoning_tokens"], 12,
        "{usage}"
    );
    assert!(!kinds(&evs).contains(&"response.output_text.delta".to_string()));
}

#[test]
fn a_text_format_grammar_starts_where_the_reasoning_ends() {
    // The stand-in codec's tags are one token each (bytes 1 and 2), so the
    // grammar (three digits) waits for the close tag: the model thinks
    // first, as with vLLM's structured output for reasoning models.
    use tokenwire_core::testing::DigitsCodec;
    const GATED: &str = "\u{1}\nplan it\n\u{2}\n\nthe answer";
    let config = HostConfig {
        reasoning_tags: Some(tokenwire_core::reasoning::ReasoningTags::THINK),
        ..HostConfig::default()
    };
    let info = tokenwire_core::ModelInfo {
        context_len: 4096,
        ..tokenwire_core::testing::tiny_model_info()
    };
    let mut h = Harness::with_codec(config, info, DigitsCodec::shared_thinking(3), GATED, 1);
    let input = (0..GATED.len())
        .map(|pad| "x".repeat(pad))
        .find(|c| prompt_len(&[(Role::User, c)]).is_multiple_of(GATED.len()))
        .expect("some input starts the script at its start");
    let c = h.open(1, Dialect::Responses);
    let mut body = create(json!(input), 40);
    body["text"] = json!({"format": {"type": "json_object"}});
    h.send(c, body);
    h.run(200);
    let evs = events(&h, c);
    let end = check_response(&evs);
    assert_eq!(end["type"], "response.completed", "{:?}", kinds(&evs));
    let output = end["response"]["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{end}");
    assert_eq!(
        output[0]["content"],
        json!([{"type": "reasoning_text", "text": "plan it"}])
    );
    let text = output[1]["content"][0]["text"].as_str().expect("text");
    assert!(
        text.len() == 3 && text.bytes().all(|b| b.is_ascii_digit()),
        "{end}"
    );
    assert_eq!(
        end["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
        11
    );
}
