//! Tool calls over real sockets on stories260K: a forced call parses (JSON
//! and streamed, its markup never streamed as text), a named choice calls
//! that function, the Responses API gives a `function_call` item, and bad
//! tool definitions are refused with their field.

use serde_json::{json, Value};
use tokenwire_tests::{http, start, stories260k, ModelSource};

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
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        assert!(choice["message"]["content"].is_null(), "{v}");
        let calls = choice["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "parallel calls are off: {v}");
        for c in calls {
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().expect("args"))
                    .expect("arguments parse");
            match c["function"]["name"].as_str() {
                Some("get_weather") => assert!(args["city"].is_string(), "{c}"),
                Some("ping") => assert_eq!(args, json!({}), "{c}"),
                other => panic!("unknown function {other:?}"),
            }
        }
    }
    // Named, streamed: one call to that function, no text chunk at all.
    let body = ask(
        json!({"stream": true, "seed": 9, "parallel_tool_calls": false,
                          "tool_choice": {"type": "function", "function": {"name": "ping"}}}),
    );
    let r = http(&server, "POST", CHAT, Some(&body)).await;
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
    assert_eq!(calls[0]["function"]["name"], "ping");
    for c in &chunks {
        let text = c["choices"][0]["delta"]["content"].as_str().unwrap_or("");
        assert!(text.is_empty(), "text streamed beside a forced call: {c}");
    }
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
