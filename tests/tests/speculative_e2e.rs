//! Speculative decoding by prompt lookup end to end: over real sockets, with
//! stories260K on the CPU engine, a server with `--draft-tokens` writes
//! exactly the texts (and logprobs) of a server without it, greedy and
//! seeded, streamed and whole, for several choices at once, and its
//! `/metrics` count the draft tokens it fed and those the model confirmed;
//! an answer under a thinking budget is drafted for and cut where it is
//! without drafts.

use serde_json::{json, Value};
use tokenwire_core::DraftConfig;
use tokenwire_tests::{http, metric, start, stories260k, ModelSource, RunningServer};

/// A story that repeats itself, so that prompt lookup finds what follows.
const STORY: &str = "Once upon a time, there was a little girl named Lily. She loved to play \
                     outside with her dog, Max. Once upon a time, there was a little girl named";

async fn server(draft_tokens: u32) -> RunningServer {
    serve(&stories260k(), draft_tokens, None).await
}

/// A server on the model in `dir` that drafts up to `draft_tokens`, with
/// the reasoning parser of `tags`.
async fn serve(
    dir: &std::path::Path,
    draft_tokens: u32,
    tags: Option<tokenwire_core::reasoning::ReasoningTags>,
) -> RunningServer {
    start(ModelSource::Dir(dir.to_path_buf()), move |c| {
        c.host.reasoning_tags = tags;
        c.host.draft = DraftConfig {
            max_tokens: draft_tokens,
            ngram_min: 1,
            ngram_max: 4,
            max_seqs: 4,
        };
    })
    .await
}

/// Every answer the scenario's requests got, in order: texts, finish
/// reasons, token counts and logprobs as the client reads them.
async fn scenario(server: &RunningServer) -> Vec<Value> {
    let mut out = Vec::new();
    let bodies = [
        json!({"model": "stories260K", "prompt": STORY, "max_tokens": 48, "temperature": 0}),
        json!({"model": "stories260K", "prompt": STORY, "max_tokens": 48,
               "temperature": 0.8, "seed": 11, "logprobs": 2}),
        json!({"model": "stories260K", "prompt": STORY, "max_tokens": 40, "temperature": 0,
               "stop": ["Max"], "n": 2}),
        json!({"model": "stories260K", "prompt": STORY, "max_tokens": 40, "temperature": 0,
               "stream": true}),
    ];
    for b in &bodies {
        let r = http(server, "POST", "/v1/completions", Some(&b.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        if b["stream"] == true {
            let text: String = r
                .body
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str::<Value>(d).expect("an SSE chunk"))
                .filter_map(|e| e["choices"][0]["text"].as_str().map(String::from))
                .collect();
            assert!(!text.is_empty(), "{}", r.body);
            out.push(json!(text));
        } else {
            let v = r.json();
            out.push(json!([v["choices"], v["usage"]["completion_tokens"]]));
        }
    }
    out
}

async fn draft_counters(server: &RunningServer) -> (f64, f64) {
    let m = http(server, "GET", "/metrics", None).await.body;
    (
        metric(&m, "tokenwire_draft_tokens_total").unwrap_or(-1.0),
        metric(&m, "tokenwire_draft_tokens_accepted_total").unwrap_or(-1.0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafting_writes_the_texts_of_a_server_without_it() {
    let plain = server(0).await;
    let drafting = server(8).await;
    let want = scenario(&plain).await;
    let got = scenario(&drafting).await;
    assert_eq!(got, want);
    let text = want[0][0][0]["text"].as_str().expect("text");
    assert!(!text.is_empty());
    assert_eq!(draft_counters(&plain).await, (0.0, 0.0));
    let (fed, confirmed) = draft_counters(&drafting).await;
    assert!(
        confirmed > 0.0 && confirmed <= fed,
        "{confirmed} of {fed} draft tokens confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_is_drafted_for_and_cut_where_it_is_without_drafts() {
    // The story repeats, so lookup guesses while the model thinks; the
    // guesses stop short of the budget, so the close tag comes where it
    // does without them, and the answers are the same.
    let dir = tokenwire_tests::thinking_stories260k("draft-budget");
    tokenwire_tests::make_close_tag_one_token(&dir);
    // A template that opens the reasoning, a one-token `</think>`.
    let think = Some(tokenwire_core::reasoning::ReasoningTags::THINK);
    let plain = serve(&dir, 0, think).await;
    let drafting = serve(&dir, 8, think).await;
    let answers = |server| async move {
        let mut out = Vec::new();
        for budget in [6, 17, 30] {
            let body = json!({"model": "stories260K", "max_tokens": 48, "temperature": 0,
                              "messages": [{"role": "user", "content": STORY}],
                              "thinking_token_budget": budget});
            let r = http(
                server,
                "POST",
                "/v1/chat/completions",
                Some(&body.to_string()),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            out.push(json!([v["choices"][0]["message"], v["usage"]]));
        }
        out
    };
    let want = answers(&plain).await;
    assert_eq!(answers(&drafting).await, want);
    for (answer, budget) in want.iter().zip([6, 17, 30]) {
        let thought = &answer[1]["completion_tokens_details"]["reasoning_tokens"];
        assert_eq!(thought.as_u64(), Some(budget + 1), "{answer}");
    }
    let (fed, confirmed) = draft_counters(&drafting).await;
    assert!(
        confirmed > 0.0 && confirmed <= fed,
        "{confirmed} of {fed} draft tokens confirmed"
    );
    plain.shutdown().await;
    drafting.shutdown().await;
    std::fs::remove_dir_all(dir.parent().expect("its temp folder")).ok();
}
