//! `POST /v1/embeddings` through a Host with a scripted engine (its vectors
//! are [`script_embedding`]s of what it was fed): text and token-id inputs
//! in order, unit length, `dimensions`, base64, more inputs than the
//! window, the pooling the server was started with, and the errors.

use base64::Engine as _;
use serde_json::{json, Value};
use tokenwire_core::config::EmbedPooling;
use tokenwire_core::dialect::chat::embeddings::{finish_vector, MAX_INPUTS, WINDOW};
use tokenwire_core::testing::{script_embedding, Harness};
use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{
    ConnId, Dialect, EngineFault, EngineFaultKind, Event, HostConfig, Input, Output, Pooling,
    TextCodec,
};

fn harness(config: HostConfig) -> Harness {
    Harness::new(config, "abc", 1)
}

fn embed(h: &mut Harness, id: u64, body: Value) -> Value {
    let c = h.open_http(id, Dialect::Chat);
    h.send(c, json!({"route": "embeddings", "body": body}));
    h.run(500);
    last(h, c)
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

fn ids(text: &str) -> Vec<u32> {
    ByteCodec.encode(text, true).expect("encode")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
}

#[test]
fn each_input_gets_its_unit_vector_in_order() {
    let mut h = harness(HostConfig::default());
    let r = embed(
        &mut h,
        1,
        json!({"model": "tiny", "input": ["hello there", [7, 8, 9], "a"]}),
    );
    assert_eq!(r["kind"], "reply", "{r}");
    let d = &r["data"];
    assert_eq!(d["object"], "list");
    assert_eq!(d["model"], "tiny");
    let inputs = [ids("hello there"), vec![7, 8, 9], ids("a")];
    let data = d["data"].as_array().expect("data");
    assert_eq!(data.len(), 3);
    for (i, (item, input)) in data.iter().zip(&inputs).enumerate() {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], i);
        let got = floats(&item["embedding"]);
        let want = finish_vector(script_embedding(Pooling::Mean, input), None);
        assert!(close(&got, &want), "input {i}: {got:?} vs {want:?}");
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "unit length, not {norm}");
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    assert_eq!(d["usage"]["prompt_tokens"], tokens);
    assert_eq!(d["usage"]["total_tokens"], tokens);
    assert_eq!(h.received(ConnId(1)).len(), 1, "one frame: the reply");
    // Vectors are not tokens: no token count, no token timings.
    let token_events = h.others.iter().filter(|o| {
        matches!(
            o,
            Output::Event(
                Event::TokensGenerated { .. } | Event::FirstToken { .. } | Event::InterToken { .. }
            )
        )
    });
    assert_eq!(token_events.count(), 0);
}

#[test]
fn one_string_one_id_array_dimensions_and_base64() {
    let mut h = harness(HostConfig::default());
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": "hello"}));
    let want = finish_vector(script_embedding(Pooling::Mean, &ids("hello")), None);
    assert!(
        close(&floats(&r["data"]["data"][0]["embedding"]), &want),
        "{r}"
    );

    // An array of numbers is one input of ids.
    let r = embed(&mut h, 2, json!({"model": "tiny", "input": [5, 6]}));
    assert_eq!(r["data"]["data"].as_array().map(Vec::len), Some(1), "{r}");
    let want = finish_vector(script_embedding(Pooling::Mean, &[5, 6]), None);
    assert!(close(&floats(&r["data"]["data"][0]["embedding"]), &want));

    // The first two values, made unit length again.
    let r = embed(
        &mut h,
        3,
        json!({"model": "tiny", "input": [5, 6], "dimensions": 2}),
    );
    let want = finish_vector(script_embedding(Pooling::Mean, &[5, 6]), Some(2));
    let got = floats(&r["data"]["data"][0]["embedding"]);
    assert_eq!(got.len(), 2);
    assert!(close(&got, &want));

    // Base64 of the little-endian f32s: the same values, bit for bit.
    let r = embed(
        &mut h,
        4,
        json!({"model": "tiny", "input": [5, 6], "encoding_format": "base64"}),
    );
    let b64 = r["data"]["data"][0]["embedding"]
        .as_str()
        .expect("a string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let want = finish_vector(script_embedding(Pooling::Mean, &[5, 6]), None);
    assert_eq!(got, want);
}

#[test]
fn more_inputs_than_the_window_all_come_back_in_order() {
    let mut h = harness(HostConfig::default());
    let n = WINDOW * 3 + 5;
    let inputs: Vec<Value> = (0..n).map(|i| json!([3 + (i % 200) as u32, 4])).collect();
    let c = h.open_http(1, Dialect::Chat);
    h.send(
        c,
        json!({"route": "embeddings", "body": {"model": "tiny", "input": inputs}}),
    );
    let mut most = 0;
    for _ in 0..2000 {
        if !h.step() {
            break;
        }
        let s = h.host.stats();
        most = most.max(s.generations);
    }
    assert!(most as usize <= WINDOW, "{most} computing at once");
    let r = last(&h, c);
    let data = r["data"]["data"].as_array().expect("data");
    assert_eq!(data.len(), n);
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        let want = finish_vector(
            script_embedding(Pooling::Mean, &[3 + (i % 200) as u32, 4]),
            None,
        );
        assert!(close(&floats(&item["embedding"]), &want), "input {i}");
    }
}

#[test]
fn the_server_s_pooling_is_used_and_off_refuses() {
    let mut h = harness(HostConfig {
        embed_pooling: EmbedPooling::Fixed(Pooling::Last),
        ..HostConfig::default()
    });
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": [5, 6, 9]}));
    let want = finish_vector(script_embedding(Pooling::Last, &[5, 6, 9]), None);
    assert!(
        close(&floats(&r["data"]["data"][0]["embedding"]), &want),
        "{r}"
    );

    // `auto`: what the model declares.
    let info = tokenwire_core::ModelInfo {
        pooling: Some(Pooling::Last),
        ..tokenwire_core::testing::tiny_model_info()
    };
    let mut h = Harness::with_info(HostConfig::default(), info, "abc", 1);
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": [5, 6, 9]}));
    assert!(
        close(&floats(&r["data"]["data"][0]["embedding"]), &want),
        "{r}"
    );

    let mut h = harness(HostConfig {
        embed_pooling: EmbedPooling::Off,
        ..HostConfig::default()
    });
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": "x"}));
    assert_eq!(r["status"], 400, "{r}");
    assert!(r["data"]["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--pooling off")));
}

#[test]
fn bad_bodies_name_their_field() {
    let mut h = harness(HostConfig::default());
    let context = tokenwire_core::testing::tiny_model_info().context_len as usize;
    let too_many: Vec<Value> = (0..=MAX_INPUTS).map(|_| json!("a")).collect();
    let cases = [
        (json!({"input": "a"}), "model"),
        (json!({"model": "tiny"}), "input"),
        (json!({"model": "tiny", "input": ""}), "input"),
        (json!({"model": "tiny", "input": []}), "input"),
        (json!({"model": "tiny", "input": {"a": 1}}), "input"),
        (json!({"model": "tiny", "input": ["a", ""]}), "input[1]"),
        (json!({"model": "tiny", "input": ["a", []]}), "input[1]"),
        (json!({"model": "tiny", "input": ["a", 3]}), "input[1]"),
        (
            json!({"model": "tiny", "input": [[1, 99999]]}),
            "input[0][1]",
        ),
        (json!({"model": "tiny", "input": [1, -2]}), "input[1]"),
        (json!({"model": "tiny", "input": too_many}), "input"),
        (
            json!({"model": "tiny", "input": vec![5; context + 1]}),
            "input",
        ),
        (
            json!({"model": "tiny", "input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": "tiny", "input": "a", "dimensions": 5}),
            "dimensions",
        ),
        (
            json!({"model": "tiny", "input": "a", "dimensions": "2"}),
            "dimensions",
        ),
        (
            json!({"model": "tiny", "input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"model": "tiny", "input": "a".repeat(context + 8)}),
            "input",
        ),
    ];
    for (i, (body, field)) in cases.into_iter().enumerate() {
        let r = embed(&mut h, 10 + i as u64, body.clone());
        assert_eq!(r["kind"], "error", "{body}: {r}");
        assert_eq!(r["status"], 400, "{body}: {r}");
        assert_eq!(r["data"]["error"]["param"], field, "{body}: {r}");
    }
    let r = embed(&mut h, 99, json!({"model": "other", "input": "a"}));
    assert_eq!(r["status"], 404, "{r}");
}

#[test]
fn an_engine_fault_fails_the_request_and_ends_its_other_inputs() {
    let mut h = harness(HostConfig::default());
    let c = h.open_http(1, Dialect::Chat);
    h.send(
        c,
        json!({"route": "embeddings", "body": {"model": "tiny", "input": [[5, 6], [7, 8], [9]]}}),
    );
    // The first step computes all three: it fails.
    let step = h.pending_step.take().expect("a step");
    assert_eq!(step.seqs.len(), 3);
    h.input(Input::EngineFault(EngineFault {
        step_id: step.step_id,
        kind: EngineFaultKind::Internal("boom".into()),
    }));
    h.run(50);
    let e = last(&h, c);
    assert_eq!(
        (e["kind"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(500)),
        "{e}"
    );
    let s = h.host.stats();
    assert_eq!(s.generations, 0, "nothing left computing");
}

#[test]
fn one_input_of_ids_may_be_longer_than_the_input_count_limit() {
    let info = tokenwire_core::ModelInfo {
        context_len: 4096,
        num_blocks: 512,
        ..tokenwire_core::testing::tiny_model_info()
    };
    let mut h = Harness::with_info(HostConfig::default(), info, "abc", 1);
    let ids: Vec<u32> = (0..MAX_INPUTS as u32 + 100).map(|i| 3 + i % 200).collect();
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": ids}));
    assert_eq!(r["kind"], "reply", "{r}");
    let want = finish_vector(script_embedding(Pooling::Mean, &ids), None);
    assert!(close(&floats(&r["data"]["data"][0]["embedding"]), &want));
    // One input too long in a list is named by its place, a lone one as
    // `input`, before anything is computed.
    let long = "a".repeat(5000);
    let r = embed(&mut h, 2, json!({"model": "tiny", "input": ["a", long]}));
    assert_eq!(r["data"]["error"]["param"], "input[1]", "{r}");
    assert_eq!(r["data"]["error"]["code"], "context_length_exceeded", "{r}");
    let r = embed(&mut h, 3, json!({"model": "tiny", "input": [long]}));
    assert_eq!(r["data"]["error"]["param"], "input[0]", "{r}");
    let r = embed(&mut h, 4, json!({"model": "tiny", "input": long}));
    assert_eq!(r["data"]["error"]["param"], "input", "{r}");
}

#[test]
fn a_small_queue_share_narrows_the_window_instead_of_failing() {
    let mut h = harness(HostConfig {
        max_queued_per_conn: 3,
        max_queued_requests: 3,
        ..HostConfig::default()
    });
    let inputs: Vec<Value> = (0..20).map(|i| json!([3 + i, 4])).collect();
    let r = embed(&mut h, 1, json!({"model": "tiny", "input": inputs}));
    assert_eq!(r["kind"], "reply", "{r}");
    assert_eq!(r["data"]["data"].as_array().map(Vec::len), Some(20));
}
