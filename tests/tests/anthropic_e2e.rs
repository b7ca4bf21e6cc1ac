//! Anthropic's Messages API over real sockets, for what the SDK suite
//! (`sdk_anthropic.rs`) does not reach: the stream's `event:` lines as
//! written, the same text streamed and whole, a stop sequence named, a
//! forced tool call as a `tool_use` block, `count_tokens`, Anthropic's
//! error shapes, and keys sent as `x-api-key`.

use serde_json::{json, Value};
use tokenwire_tests::{http, http_with, keys_file, start, stories260k, ModelSource, RunningServer};

const MESSAGES: &str = "/v1/messages";

/// A greedy request for "Once upon a time", `max_tokens` long.
fn body(max_tokens: u32, extra: Value) -> String {
    let mut b = json!({"model": "stories260K", "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": "Once upon a time"}]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    b.to_string()
}

async fn server() -> RunningServer {
    start(ModelSource::Dir(stories260k()), |_| {}).await
}

/// The `(event, data)` pairs of an SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "));
            let data = e.lines().find_map(|l| l.strip_prefix("data: "));
            let data: Value = serde_json::from_str(data.expect("a data line")).expect("JSON data");
            (name.expect("an event line").to_string(), data)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_message_is_named_events_with_the_whole_answers_text() {
    let server = server().await;
    let whole = http(&server, "POST", MESSAGES, Some(&body(12, json!({})))).await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let m = whole.json();
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
    assert_eq!(m["usage"]["output_tokens"], 12);
    let text = m["content"][0]["text"]
        .as_str()
        .expect("a text block")
        .to_string();

    let r = http(
        &server,
        "POST",
        MESSAGES,
        Some(&body(12, json!({"stream": true}))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let ev = events(&r.body);
    for (name, data) in &ev {
        assert_eq!(
            data["type"],
            name.as_str(),
            "each event line names its data's type"
        );
    }
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let streamed: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let start = &ev[0].1["message"];
    assert_eq!(
        start["usage"]["input_tokens"].as_u64().map(|n| n > 0),
        Some(true),
        "{start}"
    );
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 12);

    // A stop sequence inside that answer ends it there, and is named.
    let stop = text.split_whitespace().nth(2).expect("three words");
    let r = http(
        &server,
        "POST",
        MESSAGES,
        Some(&body(12, json!({"stop_sequences": [stop]}))),
    )
    .await;
    let m = r.json();
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop)),
        "{m}"
    );
    let cut = m["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(cut) && !cut.contains(stop),
        "{cut:?} of {text:?}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_is_a_tool_use_block_and_its_result_goes_back() {
    let server = server().await;
    let tools = json!([{"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                         "required": ["city"], "additionalProperties": false}}]);
    let extra = json!({"tools": tools, "tool_choice": {"type": "tool", "name": "get_weather"}});
    let r = http(&server, "POST", MESSAGES, Some(&body(200, extra.clone()))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .cloned()
        .expect("a tool_use block");
    assert_eq!(call["name"], "get_weather");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{call}"
    );
    assert!(call["input"]["city"].is_string(), "{call}");
    // The call and its result, sent back, continue the conversation.
    let mut next: Value = serde_json::from_str(&body(8, json!({}))).expect("json");
    next["tools"] = extra["tools"].clone();
    next["messages"] = json!([
        {"role": "user", "content": "Once upon a time"},
        {"role": "assistant", "content": [call.clone()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}
    ]);
    let r = http(&server, "POST", MESSAGES, Some(&next.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["stop_reason"], "max_tokens", "{}", r.body);
    // Streamed, the call is one block whose input comes as JSON deltas.
    let mut streamed: Value = serde_json::from_str(&body(200, extra)).expect("json");
    streamed["stream"] = json!(true);
    let r = http(&server, "POST", MESSAGES, Some(&streamed.to_string())).await;
    let ev = events(&r.body);
    let input: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    let input: Value = serde_json::from_str(&input).expect("the deltas are the input");
    assert_eq!(input, call["input"], "greedy: the same call");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_and_errors_answer_in_anthropics_shapes() {
    let server = server().await;
    let m = http(&server, "POST", MESSAGES, Some(&body(2, json!({}))))
        .await
        .json();
    let b = json!({"model": "stories260K", "messages": [{"role": "user", "content": "Once upon a time"}]});
    let r = http(
        &server,
        "POST",
        "/v1/messages/count_tokens",
        Some(&b.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let total = m["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(r.json(), json!({"input_tokens": total}));

    let cases = [
        (body(0, json!({})), 400, "invalid_request_error"),
        (
            body(5, json!({"model": "claude-other"})),
            404,
            "not_found_error",
        ),
        (
            body(
                5,
                json!({"messages": [{"role": "user", "content": [{"type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            ),
            400,
            "invalid_request_error",
        ),
        ("{not json".to_string(), 400, "invalid_request_error"),
    ];
    for (b, status, kind) in cases {
        let r = http(&server, "POST", MESSAGES, Some(&b)).await;
        assert_eq!(r.status, status, "{b}: {}", r.body);
        let v = r.json();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some(kind)),
            "{v}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let r = http(&server, "GET", MESSAGES, None).await;
    assert_eq!(r.status, 405);
    // Claude Code posts with a query string.
    let r = http(
        &server,
        "POST",
        "/v1/messages?beta=true",
        Some(&body(2, json!({}))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_on_every_route_x_api_key_is_a_key() {
    let key = "sk-anthropic-e2e";
    let keys = keys_file("anthropic-e2e", &[(key, &["org_a"])]);
    let server = start(ModelSource::Dir(stories260k()), move |c| {
        c.keys = Some(keys);
        c.tenancy.auth = tokenwire_io::tenancy::Auth::All;
    })
    .await;
    let b = body(2, json!({}));
    let r = http(&server, "POST", MESSAGES, Some(&b)).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(
        r.json()["error"]["type"],
        "authentication_error",
        "{}",
        r.body
    );
    let r = http_with(
        &server,
        "POST",
        MESSAGES,
        Some(&b),
        &[("x-api-key", "sk-wrong")],
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.body);
    let headers = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    let r = http_with(&server, "POST", MESSAGES, Some(&b), &headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Every route takes it, as it takes `Authorization`.
    let chat = json!({"model": "stories260K", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let r = http_with(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat.to_string()),
        &headers,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().await;
}

/// With `--reasoning-parser`, on stories260K with a template that opens the
/// reasoning: the thinking is a `thinking` block (streamed as
/// `thinking_delta`s) holding what Chat Completions gives as
/// `reasoning_content`, and `thinking: {"type": "disabled"}` closes the
/// reasoning in the prompt (the template's `enable_thinking`), so the
/// answer is text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_models_thinking_is_a_thinking_block() {
    let dir = tokenwire_tests::thinking_stories260k("anthropic");
    let server = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(tokenwire_core::reasoning::ReasoningTags::THINK);
    })
    .await;
    let chat = json!({"model": "stories260K", "max_tokens": 20, "temperature": 0,
                      "messages": [{"role": "user", "content": "Once upon a time"}]});
    let chat = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat.to_string()),
    )
    .await;
    let thought = chat.json()["choices"][0]["message"]["reasoning_content"].clone();
    assert!(
        thought.as_str().is_some_and(|t| !t.is_empty()),
        "{}",
        chat.body
    );

    let m = http(&server, "POST", MESSAGES, Some(&body(20, json!({}))))
        .await
        .json();
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert_eq!(m["content"][0]["thinking"], thought);
    assert_eq!(m["content"][0]["signature"], "");
    assert_eq!(
        m["content"].as_array().map(Vec::len),
        Some(1),
        "all thinking: {m}"
    );

    let r = http(
        &server,
        "POST",
        MESSAGES,
        Some(&body(20, json!({"stream": true}))),
    )
    .await;
    let ev = events(&r.body);
    assert_eq!(ev[1].1["content_block"]["type"], "thinking", "{}", r.body);
    let streamed: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(Some(streamed.as_str()), thought.as_str());

    let off = body(20, json!({"thinking": {"type": "disabled"}}));
    let m = http(&server, "POST", MESSAGES, Some(&off)).await.json();
    // count_tokens renders the prompt as the message did, switch included.
    let mut count: Value = serde_json::from_str(&off).expect("json");
    count.as_object_mut().map(|b| b.remove("max_tokens"));
    let n = http(
        &server,
        "POST",
        "/v1/messages/count_tokens",
        Some(&count.to_string()),
    )
    .await;
    let prompt = m["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(n.json()["input_tokens"], prompt, "{}", n.body);
    let on = http(
        &server,
        "POST",
        "/v1/messages/count_tokens",
        Some(&body(1, json!({}))),
    )
    .await;
    assert_ne!(
        on.json()["input_tokens"],
        prompt,
        "the switch changes the prompt"
    );
    let kinds: Vec<&str> = m["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|b| b["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(kinds, ["text"], "{m}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}

/// `thinking.budget_tokens` on the CPU engine, where `</think>` is one
/// token ([`tokenwire_tests::make_close_tag_one_token`]): the thinking
/// block holds the story's first `budget_tokens` tokens, the close tag is
/// forced, and a text block follows with what the model wrote after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_tokens_cuts_the_thinking_and_the_model_answers() {
    let dir = tokenwire_tests::thinking_stories260k("anthropic-budget");
    tokenwire_tests::make_close_tag_one_token(&dir);
    let server = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(tokenwire_core::reasoning::ReasoningTags::THINK);
    })
    .await;
    let first_four = http(&server, "POST", MESSAGES, Some(&body(4, json!({}))))
        .await
        .json();
    let thought = first_four["content"][0]["thinking"].clone();
    assert!(
        thought.as_str().is_some_and(|t| !t.is_empty()),
        "{first_four}"
    );
    let budgeted = json!({"thinking": {"type": "enabled", "budget_tokens": 4}});
    let m = http(&server, "POST", MESSAGES, Some(&body(20, budgeted)))
        .await
        .json();
    let kinds: Vec<&str> = m["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|b| b["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(kinds, ["thinking", "text"], "{m}");
    assert_eq!(m["content"][0]["thinking"], thought, "{m}");
    assert!(
        m["content"][1]["text"]
            .as_str()
            .is_some_and(|t| !t.trim().is_empty()),
        "{m}"
    );
    assert_eq!(
        (
            m["stop_reason"].as_str(),
            m["usage"]["output_tokens"].as_u64()
        ),
        (Some("max_tokens"), Some(20)),
        "{m}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}
