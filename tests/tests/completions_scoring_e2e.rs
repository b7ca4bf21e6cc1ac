//! Scoring prompts through `POST /v1/completions` over real sockets on
//! stories260K, as lm-evaluation-harness does for log-likelihoods: a batch
//! of prompts as token ids with `echo`, `logprobs` and one token. Each
//! prompt token's logprob is the one the engine's own logits give after
//! the tokens before it (an engine loaded in the test), with the most
//! likely alternative; the same batch again (its blocks now cached) scores
//! the same, and a streamed echo carries the same numbers.

use serde_json::{json, Value};
use tokenwire_kernels::sampler::log_softmax;
use tokenwire_kernels::{Engine, EngineOptions};
use tokenwire_tests::{http, start, stories260k, ModelSource};

const ROUTE: &str = "/v1/completions";

/// Per position from 1: the logprob of the prompt's token there and the
/// best token's id and logprob, from the logits of the prefix before it.
fn reference(engine: &mut Engine, ids: &[u32]) -> Vec<(f32, u32, f32)> {
    (1..ids.len())
        .map(|k| {
            let bs = engine.model_info().block_size as usize;
            let table: Vec<u32> = (0..k.div_ceil(bs) as u32).collect();
            engine.set_full_logits(true);
            let plan = tokenwire_core::StepPlan {
                step_id: k as u64,
                seqs: vec![tokenwire_core::SeqStep {
                    seq: tokenwire_core::SeqId(1),
                    tokens: ids[..k].to_vec(),
                    start_pos: 0,
                    block_table: table,
                    sampling: tokenwire_core::SamplingParams::greedy(),
                    sample: true,
                    logprobs: None,
                    cached_prefix: Vec::new(),
                    allowed: None,
                    draft: Vec::new(),
                    embed: None,
                    prompt_logprobs: None,
                }],
                free: vec![tokenwire_core::SeqId(1)],
                ..Default::default()
            };
            engine.step(&plan).expect("step");
            let lp = log_softmax(engine.last_logits().next().expect("a row"));
            let best = (0..lp.len())
                .max_by(|&a, &b| lp[a].total_cmp(&lp[b]).then(b.cmp(&a)))
                .expect("a vocabulary");
            (lp[ids[k] as usize], best as u32, lp[best])
        })
        .collect()
}

fn check(engine: &mut Engine, logprobs: &Value, ids: &[u32], what: &str) {
    let want = reference(engine, ids);
    let got = &logprobs["token_logprobs"];
    assert_eq!(got[0], Value::Null, "{what}: the first token is unscored");
    assert_eq!(
        logprobs["tokens"].as_array().map(Vec::len),
        Some(ids.len() + 1),
        "{what}: the prompt's tokens and the one generated"
    );
    for (p, &(logprob, best, best_lp)) in want.iter().enumerate().map(|(i, w)| (i + 1, w)) {
        let g = got[p].as_f64().expect("a logprob") as f32;
        assert!(
            (g - logprob).abs() < 1e-4,
            "{what}: position {p}: {g} vs {logprob}"
        );
        let top = logprobs["top_logprobs"][p]
            .as_object()
            .expect("alternatives");
        let text = engine.codec().decode(&[ids[p - 1], best]);
        let before = engine.codec().decode(&[ids[p - 1]]);
        let best_text = text.strip_prefix(&before).unwrap_or(&text);
        let v = top.get(best_text).and_then(Value::as_f64);
        assert!(
            v.is_some_and(|v| (v as f32 - best_lp).abs() < 1e-4),
            "{what}: position {p}: {top:?} lacks {best_text:?} at {best_lp}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_token_prompts_is_scored_as_the_engine_s_logits_say() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let mut engine = Engine::load(&stories260k(), &EngineOptions::default()).expect("engine");
    let codec = engine.codec();
    let prompts: Vec<Vec<u32>> = [
        "Once upon a time, there was a little girl named Lily. She loved to play outside.",
        "The cat sat on the mat.",
    ]
    .iter()
    .map(|t| codec.encode(t, true).expect("encode"))
    .collect();
    // lm-evaluation-harness's log-likelihood request.
    let body = json!({"model": "stories260K", "prompt": prompts, "echo": true,
                      "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234});
    let mut first = None;
    for round in 0..2 {
        let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let choices = v["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 2);
        for (i, (c, ids)) in choices.iter().zip(&prompts).enumerate() {
            assert_eq!(c["index"], i);
            check(
                &mut engine,
                &c["logprobs"],
                ids,
                &format!("round {round}, prompt {i}"),
            );
            let text = c["text"].as_str().expect("text");
            assert!(text.starts_with(&engine.codec().decode(ids)), "{text:?}");
        }
        let total: usize = prompts.iter().map(Vec::len).sum();
        assert_eq!(v["usage"]["prompt_tokens"], total);
        // The second round finds the prompts' blocks cached, and scores
        // them all the same.
        let numbers: Vec<Value> = choices.iter().map(|c| c["logprobs"].clone()).collect();
        match &first {
            None => first = Some(numbers),
            Some(f) => assert_eq!(&numbers, f, "the same scores again"),
        }
    }

    // `max_tokens: 0` (the API's way to score without generating): the
    // same scores, nothing after them.
    let mut zero = body.clone();
    zero["max_tokens"] = json!(0);
    let v = http(&server, "POST", ROUTE, Some(&zero.to_string()))
        .await
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
    for (c, (ids, f)) in v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .zip(prompts.iter().zip(first.as_ref().expect("scored")))
    {
        let n = ids.len();
        assert_eq!(
            c["logprobs"]["token_logprobs"].as_array().map(Vec::len),
            Some(n)
        );
        assert_eq!(
            c["logprobs"]["token_logprobs"],
            json!(f["token_logprobs"].as_array().expect("scores")[..n])
        );
        assert_eq!(
            c["text"].as_str(),
            Some(engine.codec().decode(ids).as_str())
        );
        assert_eq!(c["finish_reason"], "length");
    }

    // Streamed, a choice's first chunk echoes the prompt with its scores.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["prompt"] = json!(prompts[1]);
    let r = http(&server, "POST", ROUTE, Some(&streamed.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.sse_events();
    let chunk = events.first().expect("a chunk");
    check(
        &mut engine,
        &chunk["choices"][0]["logprobs"],
        &prompts[1],
        "streamed",
    );

    // Strings batch too, and a bad id names its place.
    let body = json!({"model": "stories260K", "prompt": ["Once", "The cat"], "max_tokens": 2});
    let v = http(&server, "POST", ROUTE, Some(&body.to_string()))
        .await
        .json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    let body = json!({"model": "stories260K", "prompt": [[1, 2], [3, 100000]]});
    let r = http(&server, "POST", ROUTE, Some(&body.to_string())).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "prompt[1][1]");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokenizer_routes_serve_a_remote_tokenizer() {
    // What lm-evaluation-harness's remote tokenizer asks: the special
    // tokens from `GET /tokenizer_info`, ids without them from `/tokenize`,
    // and the end-of-sequence token's id from its text.
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let engine = Engine::load(&stories260k(), &EngineOptions::default()).expect("engine");
    let info = http(&server, "GET", "/tokenizer_info", None).await;
    assert_eq!(info.status, 200, "{}", info.body);
    let info = info.json();
    assert_eq!(info["bos_token"], "<s>", "{info}");
    assert_eq!(info["eos_token"], "</s>", "{info}");
    assert_eq!(info["model_max_length"], engine.model_info().context_len);
    assert_eq!(info["chat_template"], Value::Null, "stories260K has none");
    let tokenize = |prompt: &str, add: Option<bool>| {
        let mut body = json!({"prompt": prompt});
        if let Some(add) = add {
            body["add_special_tokens"] = json!(add);
        }
        let server = &server;
        async move {
            let r = http(server, "POST", "/tokenize", Some(&body.to_string())).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["tokens"].clone()
        }
    };
    let codec = engine.codec();
    let text = "Once upon a time";
    assert_eq!(
        tokenize(text, None).await,
        json!(codec.encode(text, true).expect("ids"))
    );
    assert_eq!(
        tokenize(text, Some(true)).await,
        json!(codec.encode(text, true).expect("ids"))
    );
    let plain = codec.encode(text, false).expect("ids");
    assert_eq!(tokenize(text, Some(false)).await, json!(plain));
    // The special tokens' text tokenizes to their ids.
    assert_eq!(
        tokenize("</s>", Some(false)).await,
        json!(engine.model_info().eos_ids[..1])
    );
    assert_eq!(
        tokenize("<s>", Some(false)).await[0],
        json!(codec.encode("", true).expect("bos")[0])
    );
    server.shutdown().await;
}
