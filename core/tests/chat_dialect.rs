//! The `chat` dialect (Chat Completions and Completions) through a Host
//! with a scripted engine and virtual time: the frames its HTTP mapping
//! turns into replies, `n` choices sharing the prompt, and the errors a
//! failing engine or a shutdown give.

use serde_json::{json, Value};
use tokenwire_core::testing::Harness;
use tokenwire_core::{
    ConnId, Dialect, Duration, EngineFault, EngineFaultKind, HostConfig, Input, Transport,
};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness(config: HostConfig) -> Harness {
    Harness::new(config, SCRIPT, 1)
}

/// An HTTP request's virtual connection.
fn open(h: &mut Harness, id: u64) -> ConnId {
    let conn = ConnId(id);
    h.input(Input::Open {
        conn,
        dialect: Dialect::Chat,
        transport: Transport::Http,
        query: String::new(),
        authorization: None,
        peer: "p".into(),
    });
    conn
}

fn chat(body: Value) -> Value {
    json!({"route": "chat", "body": body})
}

fn request(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4, "temperature": 0});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    chat(b)
}

fn last(h: &Harness, c: ConnId) -> Value {
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

#[test]
fn a_request_is_answered_with_one_reply_and_n_choices_each_their_own_text() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, request(json!({"n": 3})));
    h.run(50);
    let r = last(&h, c);
    assert_eq!(r["kind"], "reply", "{r}");
    let choices = r["data"]["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
        assert_eq!(ch["finish_reason"], "length");
        assert_eq!(ch["message"]["content"].as_str().map(str::len), Some(4));
    }
    assert_eq!(r["data"]["usage"]["completion_tokens"], 12);
    assert_eq!(h.received(c).len(), 1, "one frame: the reply");
}

#[test]
fn a_stream_is_chunks_then_done() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(
        c,
        request(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    h.run(50);
    let frames = h.received(c);
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["kind"].as_str()).collect();
    assert_eq!(kinds.last(), Some(&"done"));
    assert!(
        kinds[..kinds.len() - 1].iter().all(|k| *k == "chunk"),
        "{kinds:?}"
    );
    let usage = &frames[frames.len() - 2]["data"];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
}

#[test]
fn an_engine_failure_is_a_500_and_a_shutdown_a_503() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, request(json!({"max_tokens": 50})));
    h.run(2);
    let step = h.pending_step.take().expect("a step");
    h.input(Input::EngineFault(EngineFault {
        step_id: step.step_id,
        kind: EngineFaultKind::Internal("boom".into()),
    }));
    let e = last(&h, c);
    assert_eq!(
        (e["kind"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(500)),
        "{e}"
    );
    assert_eq!(e["data"]["error"]["type"], "server_error");

    let mut h = harness(HostConfig {
        shutdown_grace: Duration::from_millis(15),
        ..HostConfig::default()
    });
    let c = open(&mut h, 1);
    h.send(c, request(json!({"max_tokens": 200})));
    h.run(2);
    h.input(Input::Shutdown);
    h.advance(Duration::from_millis(50));
    let e = h
        .received(c)
        .iter()
        .rev()
        .find(|f| f["kind"] == "error")
        .cloned()
        .expect("an error frame");
    assert_eq!(e["status"], 503, "retry elsewhere: {e}");
}

/// Found by the simulator's `chat` clients: a request with no generation
/// running when the grace ends (its prompt still at the tokenizer, or a
/// `/tokenize` waiting for its ids) got a bare close; it gets the 503 a
/// going-away server gives, before its connection goes.
#[test]
fn a_request_without_a_generation_at_shutdown_gets_a_503_before_the_close() {
    for body in [
        request(json!({})),
        json!({"route": "tokenize", "body": {"prompt": "hi"}}),
        json!({"route": "embeddings", "body": {"model": "tiny", "input": ["a", "b"]}}),
    ] {
        let mut h = harness(HostConfig {
            shutdown_grace: Duration::from_millis(15),
            ..HostConfig::default()
        });
        h.auto_text = false;
        let c = open(&mut h, 1);
        h.send(c, body.clone());
        assert!(!h.text_jobs.is_empty(), "held at the tokenizer: {body}");
        h.input(Input::Shutdown);
        h.advance(Duration::from_millis(50));
        let frames = h.received(c);
        assert_eq!(frames.len(), 1, "one answer: {frames:?}");
        let e = &frames[0];
        assert_eq!(
            (e["kind"].as_str(), e["status"].as_u64()),
            (Some("error"), Some(503)),
            "{body}: {e}"
        );
        assert_eq!(e["data"]["error"]["type"], "server_error", "{e}");
        assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1001), "then the close");
    }
}

#[test]
fn bad_frames_and_bodies_are_refused_with_their_field() {
    let mut h = harness(HostConfig::default());
    let c = open(&mut h, 1);
    h.send(c, json!({"route": "nope"}));
    assert_eq!(last(&h, c)["status"], 400);
    h.send(c, request(json!({"temperature": 9})));
    let e = last(&h, c);
    assert_eq!(e["data"]["error"]["param"], "temperature", "{e}");
    h.send(c, request(json!({"model": "other"})));
    let e = last(&h, c);
    assert_eq!(
        (e["status"].as_u64(), e["data"]["error"]["code"].as_str()),
        (Some(404), Some("model_not_found"))
    );
}

/// What the tiny model's engine writes: a Qwen3-style answer that thinks
/// first, then answers.
const THINKING: &str = "<think>\nplan it\n</think>\n\nthe answer";

/// A harness over [`THINKING`] with the `<think>` reasoning parser, and a
/// user message whose prompt makes the engine start at the script's start
/// (`opening`: the message ends with the open tag, as a template that
/// opens the reasoning writes it; the script then starts inside it).
fn thinking(opening: bool) -> (Harness, Value) {
    let script = if opening {
        THINKING.trim_start_matches("<think>")
    } else {
        THINKING
    };
    thinking_with(script, opening)
}

/// [`thinking`] with the engine writing `script`.
fn thinking_with(script: &str, opening: bool) -> (Harness, Value) {
    thinking_with_tools(script, opening, &[])
}

/// [`thinking_with`], the prompt also describing `tools` (as the byte
/// codec, which has no template, describes them in a system message).
fn thinking_with_tools(
    script: &str,
    opening: bool,
    tools: &[tokenwire_core::tools::ToolDef],
) -> (Harness, Value) {
    use tokenwire_core::testing::ByteCodec;
    let content = starting_prompt(&ByteCodec, script, opening, tools);
    let h = Harness::with_info(thinking_config(), long_context(), script, 1);
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": content}],
                      "max_tokens": script.len(), "temperature": 0});
    (h, body)
}

/// A user message whose prompt under `codec` makes the tiny engine start
/// at `script`'s start (its length a whole number of the script's), ending
/// with the open tag where `opening`.
fn starting_prompt(
    codec: &dyn tokenwire_core::TextCodec,
    script: &str,
    opening: bool,
    tools: &[tokenwire_core::tools::ToolDef],
) -> String {
    use tokenwire_core::{ChatMessage, Role};
    let base = if opening { "q <think>" } else { "q" };
    (0..script.len())
        .map(|pad| format!("{}{base}", "x".repeat(pad)))
        .find(|c| {
            let m = [ChatMessage::new(Role::User, c.clone())];
            let n = codec
                .encode_chat_templated(&m, tools, &Default::default())
                .expect("encodes")
                .len();
            n.is_multiple_of(script.len())
        })
        .expect("some prompt starts the script at its start")
}

/// The host's configuration with the `<think>` reasoning parser.
fn thinking_config() -> HostConfig {
    HostConfig {
        reasoning_tags: Some(tokenwire_core::reasoning::ReasoningTags::THINK),
        ..HostConfig::default()
    }
}

/// The tiny model with room for the longer scripts.
fn long_context() -> tokenwire_core::ModelInfo {
    tokenwire_core::ModelInfo {
        context_len: 4096,
        ..tokenwire_core::testing::tiny_model_info()
    }
}

/// The `delta` of each streamed chunk's first choice, in order.
fn first_choice_deltas(h: &Harness, c: ConnId) -> Vec<Value> {
    h.received(c)
        .iter()
        .filter(|f| f["kind"] == "chunk")
        .map(|f| f["data"]["choices"][0]["delta"].clone())
        .collect()
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    chat(body)
}

#[test]
fn a_reasoning_parser_parts_the_thinking_from_the_answer() {
    for opening in [false, true] {
        let (mut h, body) = thinking(opening);
        let c = open(&mut h, 1);
        h.send(c, chat(body));
        h.run(100);
        let r = last(&h, c);
        let m = &r["data"]["choices"][0]["message"];
        assert_eq!(m["reasoning_content"], "plan it", "opening {opening}: {r}");
        assert_eq!(m["content"], "the answer", "opening {opening}: {r}");
        let usage = &r["data"]["usage"];
        // The tokens up to and including `</think>`, the open tag's
        // tokens too where the model wrote them.
        let reasoning = THINKING.find("</think>").expect("tag") + "</think>".len();
        let reasoning = if opening {
            reasoning - "<think>".len()
        } else {
            reasoning
        };
        assert_eq!(
            usage["completion_tokens_details"]["reasoning_tokens"], reasoning,
            "{usage}"
        );
    }
}

#[test]
fn streamed_reasoning_comes_as_reasoning_content_deltas_before_the_answer() {
    let (mut h, body) = thinking(false);
    let c = open(&mut h, 1);
    h.send(c, with(body, json!({"stream": true})));
    h.run(100);
    let deltas = first_choice_deltas(&h, c);
    assert_eq!(deltas[0]["role"], "assistant");
    let field = |name: &str| -> String {
        deltas
            .iter()
            .filter_map(|d| d[name].as_str())
            .collect::<String>()
    };
    assert_eq!(field("reasoning_content"), "plan it");
    assert_eq!(field("content"), "the answer");
    let last_reasoning = deltas
        .iter()
        .rposition(|d| d["reasoning_content"].is_string())
        .expect("reasoning");
    let first_answer = deltas
        .iter()
        .position(|d| d["content"].as_str().is_some_and(|t| !t.is_empty()))
        .expect("answer");
    assert!(last_reasoning < first_answer, "{deltas:?}");
    // No tag, and no whitespace around the parts, reached the client.
    assert!(deltas.iter().all(|d| !d.to_string().contains("think>")));
}

#[test]
fn without_a_parser_or_with_include_reasoning_false_the_thinking_is_not_sent_apart() {
    // No parser: the text as the model wrote it, no reasoning fields.
    let (_, body) = thinking(false);
    let script = THINKING;
    let content = body["messages"][0]["content"].clone();
    let mut h = Harness::new(HostConfig::default(), script, 1);
    let c = open(&mut h, 1);
    h.send(c, chat(body.clone()));
    h.run(100);
    let r = last(&h, c);
    let m = &r["data"]["choices"][0]["message"];
    assert_eq!(m["content"], THINKING, "{r}");
    assert!(m.get("reasoning_content").is_none(), "{r}");
    assert!(r["data"]["usage"]
        .get("completion_tokens_details")
        .is_none());
    // `include_reasoning: false`: the answer alone, the reasoning dropped.
    let (mut h, body) = thinking(false);
    assert_eq!(body["messages"][0]["content"], content);
    let c = open(&mut h, 1);
    h.send(c, with(body, json!({"include_reasoning": false})));
    h.run(100);
    let m = last(&h, c)["data"]["choices"][0]["message"].clone();
    assert_eq!(m["content"], "the answer");
    assert!(m["reasoning_content"].is_null(), "{m}");
}

#[test]
fn an_answer_cut_short_while_thinking_is_all_reasoning() {
    let (mut h, body) = thinking(false);
    let c = open(&mut h, 1);
    h.send(c, with(body, json!({"max_tokens": 12})));
    h.run(100);
    let r = last(&h, c);
    let choice = &r["data"]["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["reasoning_content"], "plan");
    assert_eq!(choice["message"]["content"], "");
}

/// What a model whose tags are one token each writes (the stand-in codec
/// spells `<think>` and `</think>` as bytes 1 and 2): it thinks, then
/// would answer in words, which a grammar turns into its digits.
const GATED: &str = "\u{1}\nplan it\n\u{2}\n\nthe answer";

/// A harness whose engine writes `script` under [`DigitsCodec::thinking`]
/// (three digits, tags of one token each), with the `<think>` parser, and
/// a body asking for `response_format` whose prompt starts the engine at
/// the script's start (`opening`: the prompt ends with the open tag).
fn gated_thinking(script: &str, opening: bool) -> (Harness, Value) {
    use tokenwire_core::testing::DigitsCodec;
    let content = starting_prompt(&DigitsCodec::thinking(3), script, opening, &[]);
    let codec = DigitsCodec::shared_thinking(3);
    let h = Harness::with_codec(thinking_config(), long_context(), codec, script, 1);
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": content}],
                      "max_tokens": 40, "temperature": 0,
                      "response_format": {"type": "json_object"}});
    (h, body)
}

fn is_digits(s: &Value, n: usize) -> bool {
    s.as_str()
        .is_some_and(|s| s.len() == n && s.bytes().all(|b| b.is_ascii_digit()))
}

#[test]
fn a_grammar_starts_where_the_reasoning_ends() {
    // As vLLM applies structured output to a reasoning model: the model
    // thinks freely, and the grammar holds from the token after the close
    // tag, whether the template opened the reasoning or the model did.
    for opening in [false, true] {
        let script = if opening {
            GATED.trim_start_matches('\u{1}')
        } else {
            GATED
        };
        let (mut h, body) = gated_thinking(script, opening);
        let c = open(&mut h, 1);
        h.send(c, chat(body.clone()));
        h.run(200);
        let r = last(&h, c);
        let choice = &r["data"]["choices"][0];
        assert_eq!(choice["message"]["reasoning_content"], "plan it", "{r}");
        assert!(is_digits(&choice["message"]["content"], 3), "{r}");
        assert_eq!(choice["finish_reason"], "stop");
        // The open tag (when the model wrote it), "\nplan it\n", the close.
        let thought = 9 + 1 + u64::from(!opening);
        assert_eq!(
            r["data"]["usage"]["completion_tokens_details"]["reasoning_tokens"], thought,
            "{r}"
        );
        assert_eq!(r["data"]["usage"]["completion_tokens"], thought + 3 + 1);

        // Streamed: the thinking's deltas, then the grammar's.
        let c = open(&mut h, 2);
        h.send(c, with(body, json!({"stream": true})));
        h.run(200);
        let deltas = first_choice_deltas(&h, c);
        let text = |key: &str| -> String {
            deltas
                .iter()
                .filter_map(|d| d[key].as_str())
                .collect::<String>()
        };
        assert_eq!(text("reasoning_content"), "plan it", "{deltas:?}");
        assert!(is_digits(&json!(text("content")), 3), "{deltas:?}");
        let first_content = deltas
            .iter()
            .position(|d| d["content"].as_str().is_some_and(|s| !s.is_empty()));
        let last_reasoning = deltas
            .iter()
            .rposition(|d| d["reasoning_content"].is_string());
        assert!(first_content > last_reasoning, "{deltas:?}");
    }
}

#[test]
fn an_answer_that_does_not_open_the_reasoning_is_the_grammars_from_its_first_token() {
    // The first token may be the open tag or the grammar's first; the
    // model took a digit, so the open tag later is not reasoning.
    let (mut h, body) = gated_thinking("42\u{1}x", false);
    let c = open(&mut h, 1);
    h.send(c, chat(body));
    h.run(200);
    let r = last(&h, c);
    let m = &r["data"]["choices"][0]["message"];
    assert!(is_digits(&m["content"], 3), "{r}");
    assert!(
        m["content"].as_str().is_some_and(|s| s.starts_with("42")),
        "{r}"
    );
    assert_eq!(m["reasoning_content"], Value::Null, "{r}");
    assert_eq!(
        r["data"]["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );
}

/// A harness whose engine thinks `GATED`'s plan (opened by the template,
/// tags of one token each), and a chat body without a grammar.
fn budgeted_thinking() -> (Harness, Value) {
    use tokenwire_core::testing::DigitsCodec;
    let script = GATED.trim_start_matches('\u{1}');
    let content = starting_prompt(&DigitsCodec::thinking(3), script, true, &[]);
    let codec = DigitsCodec::shared_thinking(3);
    let h = Harness::with_codec(thinking_config(), long_context(), codec, script, 1);
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": content}],
                      "max_tokens": 16, "temperature": 0});
    (h, body)
}

#[test]
fn a_thinking_budget_closes_the_reasoning_after_that_many_tokens() {
    // The model would think "\nplan it\n" (9 tokens) before its close tag.
    // Given 3 (vLLM's `thinking_token_budget`), it thinks "\npl", the close
    // tag is the only token allowed next, and the answer goes on from the
    // model's next token; given 9 or more it thinks as it would.
    let (mut h, body) = budgeted_thinking();
    let c = open(&mut h, 1);
    h.send(c, with(body.clone(), json!({"thinking_token_budget": 3})));
    h.run(200);
    let r = last(&h, c);
    let choice = &r["data"]["choices"][0];
    assert_eq!(choice["message"]["reasoning_content"], "pl", "{r}");
    let content = choice["message"]["content"].as_str().expect("content");
    assert!(content.starts_with("n it"), "the model's next tokens: {r}");
    assert_eq!(
        r["data"]["usage"]["completion_tokens_details"]["reasoning_tokens"], 4,
        "three thought, then the close tag: {r}"
    );
    assert_eq!(choice["finish_reason"], "length");

    for budget in [9, 1000] {
        let c = open(&mut h, 2 + budget);
        h.send(
            c,
            with(body.clone(), json!({"thinking_token_budget": budget})),
        );
        h.run(200);
        let r = last(&h, c);
        let m = &r["data"]["choices"][0]["message"];
        assert_eq!(m["reasoning_content"], "plan it", "{r}");
        assert!(
            m["content"].as_str().is_some_and(|t| t.starts_with("the")),
            "{r}"
        );
    }

    // Streamed, the same split.
    let c = open(&mut h, 3);
    h.send(
        c,
        with(
            body.clone(),
            json!({"thinking_token_budget": 3, "stream": true}),
        ),
    );
    h.run(200);
    let deltas = first_choice_deltas(&h, c);
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning.trim(), "pl", "{deltas:?}");

    // Not a whole number: refused by name.
    let c = open(&mut h, 4);
    h.send(c, with(body, json!({"thinking_token_budget": -1})));
    h.run(50);
    let r = last(&h, c);
    assert_eq!(r["data"]["error"]["param"], "thinking_token_budget", "{r}");
}

#[test]
fn anthropic_budget_tokens_is_the_thinking_budget() {
    let (mut h, body) = budgeted_thinking();
    let c = h.open_http(1, Dialect::Anthropic);
    h.send(
        c,
        json!({"route": "messages", "body": {
            "model": "tiny", "max_tokens": 12, "temperature": 0,
            "messages": body["messages"],
            "thinking": {"type": "enabled", "budget_tokens": 3}}}),
    );
    h.run(200);
    let r = last(&h, c);
    let m = tokenwire_core::dialect::anthropic::message(&r["data"]);
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert_eq!(m["content"][0]["thinking"], "pl", "{m}");
    assert!(
        m["content"][1]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("n it")),
        "{m}"
    );
    let c = h.open_http(2, Dialect::Anthropic);
    h.send(
        c,
        json!({"route": "messages", "body": {
            "model": "tiny", "max_tokens": 12, "messages": body["messages"],
            "thinking": {"type": "enabled", "budget_tokens": "lots"}}}),
    );
    h.run(50);
    let r = last(&h, c);
    assert_eq!(r["data"]["error"]["param"], "thinking.budget_tokens", "{r}");
}

#[test]
fn a_grammar_leaves_no_room_to_think_where_the_tags_are_several_tokens() {
    // Completions never split; neither does a chat answer under
    // `response_format` where the close tag is not one token (the byte
    // codec spells it in eight), as no grammar can wait for it (the tiny
    // engine writes the script where the stand-in grammar allows it).
    let (mut h, body) = thinking(false);
    let c = open(&mut h, 1);
    let prompt = body["messages"][0]["content"].clone();
    h.send(
        c,
        json!({"route": "completions", "body": {"model": "tiny", "prompt": prompt,
               "max_tokens": 8, "temperature": 0}}),
    );
    h.run(100);
    let r = last(&h, c);
    assert!(r["data"]["choices"][0]["text"]
        .as_str()
        .expect("text")
        .contains("<think>"));
    assert!(r["data"]["usage"]
        .get("completion_tokens_details")
        .is_none());

    let mut h = Harness::with_codec(
        thinking_config(),
        tokenwire_core::testing::tiny_model_info(),
        tokenwire_core::testing::DigitsCodec::shared(3),
        THINKING,
        1,
    );
    let c = open(&mut h, 1);
    h.send(
        c,
        with(body, json!({"response_format": {"type": "json_object"}})),
    );
    h.run(100);
    let r = last(&h, c);
    let m = &r["data"]["choices"][0]["message"];
    assert_eq!(m["content"].as_str().map(str::len), Some(3), "{r}");
    assert!(m.get("reasoning_content").is_none(), "{r}");
    assert!(r["data"]["usage"]
        .get("completion_tokens_details")
        .is_none());
}

#[test]
fn template_kwargs_are_an_object_without_the_servers_own_variables() {
    let mut h = harness(HostConfig::default());
    for (i, (kwargs, param)) in [
        (json!(true), "chat_template_kwargs"),
        (json!({"messages": []}), "chat_template_kwargs.messages"),
        (
            json!({"add_generation_prompt": false}),
            "chat_template_kwargs.add_generation_prompt",
        ),
        (
            Value::Object((0..65).map(|i| (format!("k{i}"), json!(i))).collect()),
            "chat_template_kwargs",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let c = open(&mut h, 10 + i as u64);
        h.send(c, request(json!({"chat_template_kwargs": kwargs})));
        h.run(5);
        let e = last(&h, c);
        assert_eq!(e["status"], 400, "{e}");
        assert_eq!(e["data"]["error"]["param"], param, "{e}");
    }
    // Accepted: the byte codec has no template and ignores them.
    let c = open(&mut h, 1);
    h.send(
        c,
        request(json!({"chat_template_kwargs": {"enable_thinking": false}})),
    );
    h.run(50);
    assert_eq!(last(&h, c)["kind"], "reply");
}

#[test]
fn calls_are_looked_for_in_the_answer_only_and_reasoning_tokens_add_up_over_choices() {
    // A call's markup inside the thinking is thinking; the one after it
    // is a call. The script ends with the end of the sequence (a 0 byte).
    let call = r#"<tool_call>{"name": "f", "arguments": {}}</tool_call>"#;
    let script = format!("<think>\nmaybe {call}\n</think>\n\n{call}\0");
    let def = tokenwire_core::tools::ToolDef {
        name: "f".into(),
        description: None,
        parameters: json!({"type": "object"}),
    };
    let (mut h, body) = thinking_with_tools(&script, false, &[def]);
    let c = open(&mut h, 1);
    let tools = json!([{"type": "function", "function": {"name": "f",
                        "parameters": {"type": "object"}}}]);
    h.send(
        c,
        with(body.clone(), json!({"tools": tools, "max_tokens": 200})),
    );
    h.run(400);
    let r = last(&h, c);
    let choice = &r["data"]["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    let m = &choice["message"];
    assert_eq!(m["reasoning_content"], format!("maybe {call}"), "{r}");
    assert_eq!(m["tool_calls"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "f");
    // Two choices of one prompt: each counts its own reasoning.
    let (mut h, body) = thinking(false);
    let c = open(&mut h, 2);
    h.send(c, with(body, json!({"n": 2})));
    h.run(200);
    let r = last(&h, c);
    let per_choice = THINKING.find("</think>").expect("tag") + "</think>".len();
    assert_eq!(
        r["data"]["usage"]["completion_tokens_details"]["reasoning_tokens"],
        2 * per_choice,
        "{r}"
    );
}

#[test]
fn streamed_with_include_reasoning_false_no_reasoning_chunk_is_sent() {
    let (mut h, body) = thinking(false);
    let c = open(&mut h, 1);
    h.send(
        c,
        with(body, json!({"stream": true, "include_reasoning": false})),
    );
    h.run(100);
    let deltas = first_choice_deltas(&h, c);
    assert!(
        deltas.iter().all(|d| d.get("reasoning_content").is_none()),
        "{deltas:?}"
    );
    let content: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(content, "the answer");
}

/// The events of an Anthropic stream the machine sent on `c`.
fn anthropic_events(h: &Harness, c: ConnId) -> Vec<Value> {
    let mut stream = tokenwire_core::dialect::anthropic::MessageStream::default();
    let mut events = Vec::new();
    for f in h.received(c) {
        match f["kind"].as_str() {
            Some("chunk") => events.extend(stream.on_chunk(&f["data"])),
            Some("done") => events.extend(stream.on_done()),
            _ => {}
        }
    }
    events
        .iter()
        .map(|e| serde_json::from_str(&e.data).expect("json"))
        .collect()
}

#[test]
fn messages_stream_a_call_and_the_text_after_it_in_the_order_written() {
    // The same prompt through the Messages route (Anthropic's dialect on
    // this machine): a call, then text the splitter releases with it.
    let call = r#"<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>"#;
    let script = format!("{call}\n\nDone.\0");
    let def = tokenwire_core::tools::ToolDef {
        name: "f".into(),
        description: None,
        parameters: json!({"type": "object"}),
    };
    let (mut h, body) = thinking_with_tools(&script, false, &[def]);
    let c = h.open_http(1, Dialect::Anthropic);
    let messages = json!({"route": "messages", "body": {
        "model": "tiny", "max_tokens": 200, "temperature": 0, "stream": true,
        "messages": body["messages"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}]}});
    h.send(c, messages);
    h.run(400);
    let events = anthropic_events(&h, c);
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .filter_map(|e| e["content_block"]["type"].as_str())
        .collect();
    assert_eq!(starts, ["tool_use", "text"], "{events:?}");
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert!(text.contains("Done."), "{text:?}");
    let end = events.iter().find(|e| e["type"] == "message_delta");
    assert_eq!(
        end.map(|e| e["delta"]["stop_reason"].clone()),
        Some(json!("tool_use"))
    );
}
