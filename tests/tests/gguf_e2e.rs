//! `tokenwire serve --model SmolLM2-135M-Instruct.Q4_1.gguf` end to end: a
//! real chat model from a GGUF file, over real sockets, answering the same
//! question through every dialect. The dialects that carry messages render
//! the file's own chat template; the raw-prompt ones (`generate`, `batch`)
//! are given ChatML markup by hand, as their users would.

use serde_json::{json, Value};
use tokenwire_core::keys::{hash_key, to_hex};
use tokenwire_tests::{http, smollm2_gguf, start, token_text, Client, ModelSource};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";
/// What the model answers (greedy, 8-bit activations; transformers' f32
/// model answers the same).
const ANSWER: &str = "The capital of France is Paris.";
const KEY: &str = "sk-gguf-0123456789";

fn chatml(question: &str) -> String {
    format!("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

fn of<'a>(frames: &'a [Value], kind: &str) -> impl Iterator<Item = &'a Value> {
    let kind = kind.to_owned();
    frames.iter().filter(move |f| f["type"] == kind.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_chat_model_answers_through_every_dialect() {
    let Some(path) = smollm2_gguf() else { return };
    let keys =
        std::env::temp_dir().join(format!("tokenwire-gguf-keys-{}.toml", std::process::id()));
    std::fs::write(
        &keys,
        format!(
            "[[key]]\nname = \"t\"\nsha256 = \"{}\"\norgs = [\"org\"]\n",
            to_hex(&hash_key(KEY))
        ),
    )
    .expect("keys file");
    let k = keys.clone();
    let server = start(ModelSource::Dir(path), move |c| c.keys = Some(k)).await;

    // Health says which model and quantization is served.
    let info = http(&server, "GET", "/v1/models", None).await;
    assert_eq!(info.status, 200, "{}", info.body);
    assert!(
        info.body.contains("SmolLM2-135M-Instruct.Q4_1"),
        "{}",
        info.body
    );

    // generate: a raw prompt, templated by the client.
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": chatml(QUESTION),
                  "parameters": {"max_tokens": 24, "temperature": 0, "stop": ["<|im_end|>"]}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(done["type"], "completion", "{done}");
    assert_eq!(done["generated_text"], ANSWER, "{done}");
    assert_eq!(token_text(&frames), ANSWER);
    c.close().await;

    // session: the server renders the file's chat template.
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(json!({"type":"session_init","session_id":"g","job_id":"j","conversation_context":[]}))
        .await;
    assert_eq!(c.recv().await["type"], "session_ready");
    c.send(
        json!({"type":"prompt","session_id":"g","content":QUESTION,"message_index":0,
                  "max_tokens":24,"temperature":0}),
    )
    .await;
    let frames = c.recv_until(&["response", "error"]).await;
    let resp = frames.last().expect("response");
    assert_eq!(resp["type"], "response", "{resp}");
    assert_eq!(
        resp["content"], ANSWER,
        "the model's EOS <|im_end|> ends the turn"
    );
    c.close().await;

    // responses: the OpenAI Responses API over WebSocket.
    let mut c = Client::connect(&server, "/v1/responses").await;
    c.send(
        json!({"type":"response.create","input":QUESTION,"max_output_tokens":24,"temperature":0}),
    )
    .await;
    let frames = c
        .recv_until(&[
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        ])
        .await;
    let last = frames.last().expect("terminal");
    assert_eq!(last["type"], "response.completed", "{last}");
    let deltas: String = of(&frames, "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, ANSWER);
    c.close().await;

    // cai: a user message after an empty context.
    let mut c = Client::connect(
        &server,
        &format!("/?authorization=Bearer%20{KEY}&orgId=org"),
    )
    .await;
    c.send(json!({"type":"COMPLETION","requestId":"r1",
                  "payload":{"prompt":QUESTION,"options":{"maxTokens":24,"temperature":0}}}))
        .await;
    let frames = c.recv_until(&["STREAM_COMPLETE", "ERROR"]).await;
    assert_eq!(
        frames.last().expect("end")["type"],
        "STREAM_COMPLETE",
        "{frames:?}"
    );
    let text: String = of(&frames, "CONTENT_CHUNK")
        .filter_map(|f| f["payload"]["content"].as_str())
        .collect();
    assert_eq!(text, ANSWER);
    c.close().await;

    // batch: raw prompts, templated by the client, in one batch.
    let mut c = Client::connect(&server, "/ws").await;
    c.send(
        json!({"prompts": [{"request_id": "a", "prompt": chatml(QUESTION)},
                              {"request_id": "b", "prompt": chatml("What is 2 + 2?")}],
                  "generation_config": {"do_sample": false, "max_new_tokens": 24}}),
    )
    .await;
    let mut complete = std::collections::BTreeMap::new();
    while complete.len() < 2 {
        let f = c.recv().await;
        for e in f.as_array().expect("event arrays") {
            assert_ne!(e["type"], "ERROR", "{e}");
            if e["type"] == "COMPLETE" {
                complete.insert(e["request_id"].as_str().unwrap_or("").to_owned(), e.clone());
            }
        }
    }
    let text = |id: &str| complete[id]["text"].as_str().unwrap_or("").to_owned();
    assert!(text("a").contains(ANSWER), "{}", text("a"));
    assert!(text("b").contains("4"), "{}", text("b"));
    c.close().await;

    server.shutdown().await;
    let _ = std::fs::remove_file(keys);
}

/// The replies of a three-turn `session` conversation, and the prompt tokens
/// `/metrics` says came from the prefix cache.
async fn conversation(path: &std::path::Path, cache: bool) -> (Vec<String>, f64) {
    let server = start(ModelSource::Dir(path.to_path_buf()), |c| {
        c.host.prefix_cache = cache
    })
    .await;
    let mut c = Client::connect(&server, "/ws/session").await;
    c.send(json!({"type":"session_init","session_id":"s","job_id":"j",
                  "conversation_context":[]}))
        .await;
    assert_eq!(c.recv().await["type"], "session_ready");
    let mut replies = Vec::new();
    for (turn, said) in [QUESTION, "And of Italy?", "Which of the two is larger?"]
        .iter()
        .enumerate()
    {
        c.send(json!({"type":"prompt","session_id":"s","content":said,
                      "message_index": 2 * turn,"max_tokens":16,"temperature":0}))
            .await;
        let frames = c.recv_until(&["response", "error"]).await;
        let last = frames.last().expect("response");
        assert_eq!(last["type"], "response", "{last}");
        replies.push(last["content"].as_str().unwrap_or("").to_string());
    }
    let m = http(&server, "GET", "/metrics", None).await.body;
    let hits = tokenwire_tests::metric(&m, "tokenwire_prefix_cache_hits_total").unwrap_or(-1.0);
    server.shutdown().await;
    (replies, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_conversation_from_cached_blocks_says_what_a_cold_one_says() {
    let Some(path) = smollm2_gguf() else { return };
    let (cached, hits) = conversation(&path, true).await;
    let (cold, cold_hits) = conversation(&path, false).await;
    assert_eq!(cached, cold, "8-bit activations, cached or not");
    assert!(cached[0].contains("Paris"), "{cached:?}");
    // Turns 2 and 3 start with the whole of the turn before: at least the
    // system prompt and the first question (over 40 tokens) each.
    assert!(hits >= 64.0, "{hits} prompt tokens hit");
    assert_eq!(cold_hits, 0.0);
}
