//! `POST /v1/embeddings` over real sockets on stories260K: each vector is
//! the unit-length pooled hidden state the engine computes for the input's
//! tokens (checked against an engine loaded in the test), in order, for
//! text and token ids; `dimensions`, `--pooling last` and `off`,
//! and the errors a client meets.

use serde_json::{json, Value};
use tokenwire_core::config::EmbedPooling;
use tokenwire_core::{Pooling, SeqId, SeqStep, StepPlan};
use tokenwire_kernels::{Engine, EngineOptions};
use tokenwire_tests::{http, start, stories260k, ModelSource, RunningServer};

const ROUTE: &str = "/v1/embeddings";

async fn server(pooling: EmbedPooling) -> RunningServer {
    start(ModelSource::Dir(stories260k()), |c| {
        c.host.embed_pooling = pooling;
    })
    .await
}

/// The unit vector the engine gives `tokens` pooled by `pooling`.
fn reference(engine: &mut Engine, tokens: &[u32], pooling: Pooling) -> Vec<f32> {
    let bs = engine.model_info().block_size as usize;
    let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32 + 1).collect();
    let step = SeqStep {
        seq: SeqId(1),
        tokens: tokens.to_vec(),
        start_pos: 0,
        block_table: table,
        sampling: Default::default(),
        sample: true,
        logprobs: None,
        cached_prefix: Vec::new(),
        allowed: None,
        draft: Vec::new(),
        embed: Some(pooling),
        prompt_logprobs: None,
    };
    let done = engine
        .step(&StepPlan {
            step_id: 1,
            seqs: vec![step],
            ..Default::default()
        })
        .expect("step");
    engine
        .step(&StepPlan {
            step_id: 2,
            free: vec![SeqId(1)],
            ..Default::default()
        })
        .expect("free");
    let v = done.results[0].embedding.clone().expect("a vector");
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-5, "{what}: off by {worst}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_are_the_engine_s_pooled_states_in_order() {
    let server = server(EmbedPooling::Auto).await;
    let mut engine = Engine::load(&stories260k(), &EngineOptions::default()).expect("engine");
    let texts = ["Once upon a time", "The cat sat on the mat.", "Lily"];
    let body =
        json!({"model": "stories260K", "input": [texts[0], texts[1], [1, 400, 27], texts[2]]});
    let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let codec = engine.codec();
    let mut inputs: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| codec.encode(t, true).expect("encode"))
        .collect();
    inputs.insert(2, vec![1, 400, 27]);
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 4);
    for (i, (item, ids)) in data.iter().zip(&inputs).enumerate() {
        assert_eq!(item["index"], i);
        let want = reference(&mut engine, ids, Pooling::Mean);
        assert_close(&floats(&item["embedding"]), &want, &format!("input {i}"));
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    assert_eq!(v["model"], "stories260K");
    // Different texts, different vectors.
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);

    // Cut to 16 values, unit length again.
    let body = json!({"model": "stories260K", "input": texts[0], "dimensions": 16});
    let cut = http(&server, "POST", ROUTE, Some(&body.to_string()))
        .await
        .json();
    let cut = floats(&cut["data"][0]["embedding"]);
    assert_eq!(cut.len(), 16);
    let full = reference(&mut engine, &inputs[0], Pooling::Mean);
    let norm = full[..16].iter().map(|x| x * x).sum::<f32>().sqrt();
    let want: Vec<f32> = full[..16].iter().map(|x| x / norm).collect();
    assert_close(&cut, &want, "dimensions 16");
    server.shutdown().await;
}

/// vLLM's `truncate_prompt_tokens`: an input longer than the context, cut
/// to 40 tokens, is the engine's vector of its BOS and last 39 as text, of
/// its last 40 as ids; uncut, it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_prompt_tokens_embeds_the_last_tokens() {
    let server = server(EmbedPooling::Auto).await;
    let mut engine = Engine::load(&stories260k(), &EngineOptions::default()).expect("engine");
    let long = "The cat sat on the mat and looked at the moon. ".repeat(60);
    let ids = engine.codec().encode(&long, true).expect("encode");
    assert!(ids.len() > 512, "{} tokens", ids.len());
    let mut kept = vec![ids[0]];
    kept.extend_from_slice(&ids[ids.len() - 39..]);
    let want_text = reference(&mut engine, &kept, Pooling::Mean);
    let want_ids = reference(&mut engine, &ids[ids.len() - 40..], Pooling::Mean);
    let refused = http(
        &server,
        "POST",
        ROUTE,
        Some(&json!({"model": "stories260K", "input": long}).to_string()),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    for (input, want) in [(json!([long]), want_text), (json!([ids]), want_ids)] {
        let body = json!({"model": "stories260K", "input": input, "truncate_prompt_tokens": 40});
        let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["usage"]["prompt_tokens"], 40, "{v}");
        assert_close(
            &floats(&v["data"][0]["embedding"]),
            &want,
            "the kept tokens",
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pooling_flag_is_used_and_off_turns_the_route_off() {
    let last = server(EmbedPooling::Fixed(Pooling::Last)).await;
    let mut engine = Engine::load(&stories260k(), &EngineOptions::default()).expect("engine");
    let ids = engine
        .codec()
        .encode("Once upon a time", true)
        .expect("encode");
    let body = json!({"model": "stories260K", "input": "Once upon a time"});
    let r = http(&last, "POST", ROUTE, Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let want = reference(&mut engine, &ids, Pooling::Last);
    assert_close(&floats(&r.json()["data"][0]["embedding"]), &want, "last");
    last.shutdown().await;

    let server = server(EmbedPooling::Off).await;
    let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--pooling off"), "{}", r.body);
    // The text routes still answer.
    let chat = json!({"model": "stories260K", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_naming_the_field() {
    let server = server(EmbedPooling::Auto).await;
    let long = "word ".repeat(600);
    let cases = [
        (json!({"model": "stories260K"}), 400, Some("input")),
        (
            json!({"model": "stories260K", "input": ""}),
            400,
            Some("input"),
        ),
        (
            json!({"model": "stories260K", "input": ["a", 7]}),
            400,
            Some("input[1]"),
        ),
        (
            json!({"model": "stories260K", "input": [[1, 512]]}),
            400,
            Some("input[0][1]"),
        ),
        (
            json!({"model": "stories260K", "input": long}),
            400,
            Some("input"),
        ),
        (
            json!({"model": "stories260K", "input": "a", "dimensions": 65}),
            400,
            Some("dimensions"),
        ),
        (
            json!({"model": "stories260K", "input": "a", "encoding_format": "int8"}),
            400,
            Some("encoding_format"),
        ),
        (json!({"model": "gpt-4", "input": "a"}), 404, Some("model")),
    ];
    for (body, status, param) in cases {
        let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"].as_str(), param, "{body}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    }
    let r = http(&server, "POST", ROUTE, Some("not json")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = http(&server, "GET", ROUTE, None).await;
    assert_eq!(r.status, 405, "{}", r.body);
    server.shutdown().await;
}
