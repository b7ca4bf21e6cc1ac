//! `tokenwire serve --backend wgpu --model stories260K` streams the golden text
//! over the `generate` dialect (on Mesa's lavapipe in CI, on a GPU elsewhere).

use serde_json::{json, Value};
use tokenwire_io::config::Backend;
use tokenwire_tests::{
    stories260k, stories_reference, token_text, Client, ModelSource, ServerConfig,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_backend_streams_the_stories260k_golden_text() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        model: ModelSource::Dir(dir),
        backend: Backend::Wgpu,
        ..ServerConfig::default()
    };
    let server = match tokenwire_io::start(cfg).await {
        Ok(s) => s,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no wgpu adapter here ({e:#})");
            return;
        }
        Err(e) => panic!("CI=true but the wgpu backend did not start: {e:#}"),
    };
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Once upon a time",
                  "parameters": {"max_tokens": 64, "temperature": 0},
                  "options": {"include_token_ids": true}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let ids: Vec<u64> = frames
        .iter()
        .filter_map(|f| f["token_id"].as_u64())
        .collect();
    // `greedy_ids` holds the prompt's ids then the 64 generated ones.
    let all: Vec<u64> = reference["greedy_ids"]
        .as_array()
        .expect("golden ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(ids, all[all.len() - 64..].to_vec());
    let full = reference["full_text"].as_str().expect("full text");
    assert_eq!(format!("Once upon a time{}", token_text(&frames)), full);
    assert_eq!(
        frames.last().map(|f| f["finish_reason"].clone()),
        Some(json!("length"))
    );
    server.shutdown().await;
}

/// A wgpu server on stories260K with prefix caching `on` or off, or `None`
/// without an adapter (outside CI).
async fn wgpu_server(cache: bool) -> Option<tokenwire_tests::RunningServer> {
    let mut cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        model: ModelSource::Dir(stories260k()),
        backend: Backend::Wgpu,
        ..ServerConfig::default()
    };
    cfg.host.prefix_cache = cache;
    match tokenwire_io::start(cfg).await {
        Ok(s) => Some(s),
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no wgpu adapter here ({e:#})");
            None
        }
        Err(e) => panic!("CI=true but the wgpu backend did not start: {e:#}"),
    }
}

/// Texts and cached prompt tokens of: a prompt, the same prompt again
/// (greedy, then seeded sampling), and a longer prompt starting with it.
async fn repeated_prompts(server: &tokenwire_tests::RunningServer) -> (Vec<String>, Vec<u64>) {
    let story = "Once upon a time, there was a little girl named Lily. She loved to play \
                 outside in the sunshine with her dog, Max. Every morning they ran to the \
                 big tree by the river and looked at the birds and the fish. One day, ";
    let longer = format!("{story}Lily saw a big red ball.");
    let greedy = json!({"max_tokens": 12, "temperature": 0});
    let seeded = json!({"max_tokens": 12, "temperature": 0.8, "seed": 42});
    let mut c = Client::connect(server, "/generate").await;
    let (mut texts, mut cached) = (Vec::new(), Vec::new());
    for (prompt, params) in [
        (story, &greedy),
        (story, &greedy),
        (story, &seeded),
        (longer.as_str(), &greedy),
    ] {
        c.send(
            json!({"type": "config", "prompt": prompt, "parameters": params,
                      "options": {"include_timing": true}}),
        )
        .await;
        let frames = c.recv_until(&["completion", "error"]).await;
        let done = frames.last().expect("completion");
        assert_eq!(done["type"], "completion", "{done}");
        texts.push(token_text(&frames));
        cached.push(done["timing"]["cached_tokens"].as_u64().unwrap_or(0));
    }
    (texts, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_prompts_served_from_cached_blocks_stream_the_cold_tokens() {
    let Some(on) = wgpu_server(true).await else {
        return;
    };
    let (texts, cached) = repeated_prompts(&on).await;
    on.shutdown().await;
    let off = wgpu_server(false).await.expect("started once already");
    let (cold_texts, cold_cached) = repeated_prompts(&off).await;
    off.shutdown().await;
    assert_eq!(texts, cold_texts, "the cache changes no token");
    assert_eq!(cold_cached, vec![0; 4]);
    assert_eq!(cached[0], 0);
    assert!(
        cached[1..].iter().all(|&n| n >= 48 && n % 16 == 0),
        "{cached:?}"
    );
}

/// Completions with the OpenAI presence and frequency penalties, and with
/// `logit_bias`: the wgpu engine applies them on the device by the shared
/// sampler's rule (each generated id with the amount the sampler
/// subtracts, each biased id with its bias), so its greedy text is the CPU
/// engine's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_chat_with_openai_penalties_gives_the_cpu_engines_text() {
    let Some(gpu) = wgpu_server(true).await else {
        return;
    };
    let cpu = tokenwire_tests::start(ModelSource::Dir(stories260k()), |_| {}).await;
    let body = json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 32,
                      "temperature": 0, "presence_penalty": 0.6, "frequency_penalty": 0.8})
    .to_string();
    let text = |r: tokenwire_tests::HttpResponse| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_owned()
    };
    let on_gpu = text(tokenwire_tests::http(&gpu, "POST", "/v1/completions", Some(&body)).await);
    let on_cpu = text(tokenwire_tests::http(&cpu, "POST", "/v1/completions", Some(&body)).await);
    assert_eq!(on_gpu, on_cpu);
    // The penalties change this text: a device that ignored them would not
    // give the CPU engine's.
    let plain = json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 32,
                       "temperature": 0})
    .to_string();
    let unpenalised =
        text(tokenwire_tests::http(&gpu, "POST", "/v1/completions", Some(&plain)).await);
    assert_ne!(on_gpu, unpenalised);
    // logit_bias, applied on the device: half the vocabulary banned, one id
    // raised (its order against the penalties is the kernel tests').
    let mut bias: serde_json::Map<String, serde_json::Value> = (256..512)
        .map(|id: u32| (id.to_string(), json!(-100)))
        .collect();
    bias.insert("100".into(), json!(2.5));
    let biased = json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 32,
                        "temperature": 0, "logit_bias": bias})
    .to_string();
    let on_gpu = text(tokenwire_tests::http(&gpu, "POST", "/v1/completions", Some(&biased)).await);
    let on_cpu = text(tokenwire_tests::http(&cpu, "POST", "/v1/completions", Some(&biased)).await);
    assert_eq!(on_gpu, on_cpu);
    assert_ne!(on_gpu, unpenalised, "the biases change the text");
    // Min-p 1 on the device keeps only the best token: a draw is greedy.
    let min_p = json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 32,
                       "temperature": 1, "seed": 3, "min_p": 1.0})
    .to_string();
    let drawn = text(tokenwire_tests::http(&gpu, "POST", "/v1/completions", Some(&min_p)).await);
    assert_eq!(drawn, unpenalised);
    gpu.shutdown().await;
    cpu.shutdown().await;
}

/// Structured output on the wgpu engine: constrained rows are sampled on
/// the host under the grammar's mask, so the JSON (seeded, temperature 1)
/// is the CPU engine's, and it matches its schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_json_schema_output_is_the_cpu_engines() {
    let Some(gpu) = wgpu_server(true).await else {
        return;
    };
    let cpu = tokenwire_tests::start(ModelSource::Dir(stories260k()), |_| {}).await;
    let schema = json!({"type": "object",
                        "properties": {"name": {"type": "string", "maxLength": 12},
                                       "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["name", "age"], "additionalProperties": false});
    let body = json!({"model": "stories260K",
                      "messages": [{"role": "user", "content": "Once upon a time"}],
                      "max_tokens": 64, "temperature": 1, "seed": 4, "n": 2,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "p", "schema": schema}}})
    .to_string();
    let texts = |r: tokenwire_tests::HttpResponse| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["message"]["content"].as_str().expect("text").to_owned())
            .collect::<Vec<_>>()
    };
    let chat = "/v1/chat/completions";
    let on_gpu = texts(tokenwire_tests::http(&gpu, "POST", chat, Some(&body)).await);
    let on_cpu = texts(tokenwire_tests::http(&cpu, "POST", chat, Some(&body)).await);
    assert_eq!(on_gpu, on_cpu);
    for t in &on_gpu {
        let v: Value = serde_json::from_str(t).expect("parses");
        assert!(v["name"].is_string() && v["age"].is_u64(), "{t}");
    }
    gpu.shutdown().await;
    cpu.shutdown().await;
}

/// `/v1/embeddings` on the wgpu engine: the CPU engine's vectors (mean
/// pooling; `kernels/tests/wgpu_engine.rs` has both), several inputs
/// batched in one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_embeddings_are_the_cpu_engines() {
    let Some(gpu) = wgpu_server(true).await else {
        return;
    };
    let cpu = tokenwire_tests::start(ModelSource::Dir(stories260k()), |_| {}).await;
    let inputs = json!([
        "Once upon a time",
        "The cat sat on the mat and looked at the ball.",
        [1, 400, 27, 5]
    ]);
    let vectors = |r: tokenwire_tests::HttpResponse| -> Vec<Vec<f64>> {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|d| {
                d["embedding"]
                    .as_array()
                    .expect("floats")
                    .iter()
                    .map(|x| x.as_f64().expect("a number"))
                    .collect()
            })
            .collect()
    };
    let body = json!({"model": "stories260K", "input": inputs}).to_string();
    let on_gpu = vectors(tokenwire_tests::http(&gpu, "POST", "/v1/embeddings", Some(&body)).await);
    let on_cpu = vectors(tokenwire_tests::http(&cpu, "POST", "/v1/embeddings", Some(&body)).await);
    assert_eq!((on_gpu.len(), on_cpu.len()), (3, 3));
    for (i, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        assert_eq!(g.len(), c.len());
        let worst = g
            .iter()
            .zip(c)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "input {i}: off by {worst}");
    }
    gpu.shutdown().await;
    cpu.shutdown().await;
}
