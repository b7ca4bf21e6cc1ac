//! Tool calls over real sockets on stories260K: a forced call parses (JSON
//! and streamed, its markup never streamed as text), a named choice calls
//! that function, the Responses API gives a `function_call` item, and bad
//! tool definitions are refused with their field. Mistral's two formats on
//! a copy whose template writes them and whose tokenizer has their markers
//! as special tokens: forced calls come back parsed, and a conversation
//! with earlier calls renders through the template with Mistral's ids on
//! every route.

use serde_json::{json, Value};
use tokenwire_core::tools::mistral_call_id;
use tokenwire_tests::{
    http, mistral_copy, start, stories260k, ModelSource, MISTRAL_ARGS_TEMPLATE,
    MISTRAL_JSON_TEMPLATE,
};

const CHAT: &str = "/v1/chat/completions";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
         "parameters": {"type": "object", "additionalProperties": false, "required": ["city"],
                        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}}}}},
        {"type": "function", "function": {"name": "ping",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}
    ])
}

fn ask(extra: Value) -> String {
    let mut b = json!({"model": "stories260K", "messages": [{"role": "user", "content": "Help"}],
                       "tools": tools(), "max_tokens": 100, "temperature": 1,
                       "parallel_tool_calls": false});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    b.to_string()
}

/// The calls of a chat completion, checked against [`tools`]' schemas
/// (`finish_reason` `tool_calls`); their names.
fn checked_calls(v: &Value) -> Vec<String> {
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    calls
        .iter()
        .map(|c| {
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().expect("args"))
                    .expect("arguments parse");
            let name = c["function"]["name"].as_str().expect("a name");
            match name {
                "get_weather" => assert!(args["city"].is_string(), "{c}"),
                "ping" => assert_eq!(args, json!({}), "{c}"),
                other => panic!("unknown function {other:?}"),
            }
            name.to_string()
        })
        .collect()
}

/// Streams `body` (a forced call to `function`): exactly one call, to it,
/// and no text in any chunk. Returns the chunks.
async fn one_streamed_call(
    server: &tokenwire_tests::RunningServer,
    body: &str,
    function: &str,
) -> Vec<Value> {
    let r = http(server, "POST", CHAT, Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks: Vec<Value> = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{}", r.body);
    assert_eq!(calls[0]["function"]["name"], function);
    for c in &chunks {
        let text = c["choices"][0]["delta"]["content"].as_str().unwrap_or("");
        assert!(text.is_empty(), "text streamed beside a forced call: {c}");
    }
    chunks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_parse_as_json_and_as_a_stream() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    for seed in 0..5 {
        let r = http(
            &server,
            "POST",
            CHAT,
            Some(&ask(json!({"tool_choice": "required", "seed": seed}))),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert!(v["choices"][0]["message"]["content"].is_null(), "{v}");
        assert_eq!(checked_calls(&v).len(), 1, "parallel calls are off: {v}");
    }
    // Named, streamed: one call to that function, no text chunk at all.
    let body = ask(
        json!({"stream": true, "seed": 9, "parallel_tool_calls": false,
                          "tool_choice": {"type": "function", "function": {"name": "ping"}}}),
    );
    let chunks = one_streamed_call(&server, &body, "ping").await;
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_gives_a_function_call_item_and_bad_tools_are_refused() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let flat: Vec<Value> = tools()
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let mut f = t["function"].clone();
            f["type"] = json!("function");
            f
        })
        .collect();
    let body = json!({"model": "stories260K", "input": "Help", "tools": flat, "max_output_tokens": 100,
                      "tool_choice": {"type": "function", "name": "get_weather"}});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(v["status"], "completed", "{v}");
    let item = &v["output"][0];
    assert_eq!(item["type"], "function_call", "{v}");
    assert_eq!(item["name"], "get_weather");
    let args: Value =
        serde_json::from_str(item["arguments"].as_str().expect("args")).expect("parses");
    assert!(args["city"].is_string(), "{item}");

    for (tools, field) in [
        (
            json!([{"type": "function", "function": {"name": "x y"}}]),
            "tools[0].function.name",
        ),
        (json!([{"type": "code_interpreter"}]), "tools[0].type"),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]),
            "tools[0].function.parameters",
        ),
    ] {
        let body = json!({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "tools": tools});
        let r = http(&server, "POST", CHAT, Some(&body.to_string())).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let e: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(e["error"]["param"], field, "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_calls_are_forced_by_their_special_tokens_and_parsed() {
    for (name, template) in [
        ("mistral-args", MISTRAL_ARGS_TEMPLATE),
        ("mistral-json", MISTRAL_JSON_TEMPLATE),
    ] {
        let server = start(ModelSource::Dir(mistral_copy(name, template)), |_| {}).await;
        let mut names = Vec::new();
        // A list of up to four calls is longer than a small context leaves
        // room for after the tools: parallel calls are tried on the other.
        let parallel = name == "mistral-args";
        for seed in 0..4 {
            let body = ask(json!({"tool_choice": "required", "seed": seed,
                                   "parallel_tool_calls": parallel, "logprobs": true}));
            let r = http(&server, "POST", CHAT, Some(&body)).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            let v: Value = serde_json::from_str(&r.body).expect("json");
            // The marker came as the special token, not spelled in bytes.
            let first = &v["choices"][0]["logprobs"]["content"][0]["token"];
            assert_eq!(first, "[TOOL_CALLS]", "{name}: {v}");
            assert!(
                v["choices"][0]["message"]["content"].is_null(),
                "{name}: {v}"
            );
            names.extend(checked_calls(&v));
        }
        assert!(names.len() >= 4, "{name}: {names:?}");
        // Streamed and named: one call, no text.
        let body = ask(json!({"stream": true, "seed": 3,
                               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
        one_streamed_call(&server, &body, "get_weather").await;
    }
}

/// Token ids of a `/tokenize` body.
async fn tokens(server: &tokenwire_tests::RunningServer, body: Value) -> Vec<u64> {
    let r = http(server, "POST", "/tokenize", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("an id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_conversation_renders_through_mistrals_template_on_every_route() {
    let server = start(
        ModelSource::Dir(mistral_copy("mistral-history", MISTRAL_ARGS_TEMPLATE)),
        |_| {},
    )
    .await;
    // Clients send back the ids the server gave (`call_…`); Mistral's
    // template takes nine letters and digits only.
    let id = mistral_call_id("call_weather1");
    assert_ne!(id, "call_weather1");
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_weather1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_weather1", "content": "sunny"},
        {"role": "user", "content": "And then?"}
    ]);
    let expected = format!(
        "<s>[INST]Weather in Paris?[/INST][TOOL_CALLS]get_weather[CALL_ID]{id}[ARGS]{{\"city\": \"Paris\"}}</s>[TOOL_RESULTS]{id}[TOOL_CONTENT]sunny[/TOOL_RESULTS][INST]And then?[/INST]"
    );
    let rendered = tokens(
        &server,
        json!({"model": "stories260K", "messages": history}),
    )
    .await;
    let wanted = tokens(
        &server,
        json!({"model": "stories260K", "prompt": expected, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(rendered, wanted, "the template renders the calls itself");

    // Chat Completions answers after it.
    let body = json!({"model": "stories260K", "messages": history, "max_tokens": 8,
                      "tools": tools(), "temperature": 0});
    let r = http(&server, "POST", CHAT, Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let chat: Value = serde_json::from_str(&r.body).expect("json");
    assert!(
        chat["usage"]["prompt_tokens"].as_u64() > Some(rendered.len() as u64),
        "tools too: {chat}"
    );

    // Anthropic's tool_use and tool_result, with Anthropic's ids.
    let body = json!({"model": "stories260K", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "sunny"},
            {"type": "text", "text": "And then?"}]}
    ]});
    let r = http(
        &server,
        "POST",
        "/v1/messages/count_tokens",
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let counted: Value = serde_json::from_str(&r.body).expect("json");
    let anthropic_id = mistral_call_id("toolu_01A");
    let expected_anthropic = expected.replace(&id, &anthropic_id);
    let wanted = tokens(
        &server,
        json!({"model": "stories260K", "prompt": expected_anthropic, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(counted["input_tokens"], wanted.len(), "{counted}");
    let r = http(&server, "POST", "/v1/messages", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The Responses API's function_call and function_call_output items.
    let body = json!({"model": "stories260K", "max_output_tokens": 8, "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_weather1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_weather1", "output": "sunny"},
        {"role": "user", "content": "And then?"}
    ]});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(v["usage"]["input_tokens"], rendered.len(), "{v}");
}
