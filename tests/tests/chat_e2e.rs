//! The Chat Completions and Completions routes over real sockets, for what
//! the SDK suite (`sdk_chat.rs`) does not reach: the wrong method, keys on
//! the route, fields the server does not know, `max_completion_tokens`, and
//! a client that hangs up mid-stream (its generations are cancelled, not
//! left to run).

use serde_json::{json, Value};
use tokenwire_tests::{
    http, http_with, keys_file, metric, start, stories260k, ModelSource, RunningServer, WAIT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

fn body(extra: Value) -> String {
    with(
        json!({"model": "stories260K",
               "messages": [{"role": "user", "content": "Once upon a time"}],
               "temperature": 0}),
        extra,
    )
}

/// A greedy Completions body for "Once upon a time", `max_tokens` long.
fn completion_body(max_tokens: u32, extra: Value) -> String {
    with(
        json!({"model": "stories260K", "prompt": "Once upon a time",
               "max_tokens": max_tokens, "temperature": 0}),
        extra,
    )
}

/// `base` with `extra`'s fields set over it.
fn with(mut base: Value, extra: Value) -> String {
    for (k, v) in extra.as_object().into_iter().flatten() {
        base[k] = v.clone();
    }
    base.to_string()
}

async fn server() -> RunningServer {
    start(ModelSource::Dir(stories260k()), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_ignored_and_max_completion_tokens_bounds_the_answer() {
    let server = server().await;
    let b = body(
        json!({"max_completion_tokens": 3, "max_tokens": 50, "user": "u-1",
                        "metadata": {"a": "b"}, "a_field_from_the_future": [1, 2]}),
    );
    let r = http(&server, "POST", CHAT, Some(&b)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let r = http(&server, "GET", CHAT, None).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    // One model by its id, percent-decoded (Hugging Face ids hold a `/`).
    let r = http(&server, "GET", "/v1/models/stories%32%360K", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.json()["id"].clone(), r.json()["object"].clone()),
        (json!("stories260K"), json!("model"))
    );
    let r = http(&server, "GET", "/v1/models/org%2Fother", None).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert!(r.json()["error"]["message"]
        .as_str()
        .expect("message")
        .contains("org/other"));
    assert_eq!(
        http(&server, "POST", "/v1/models/stories260K", Some("{}"))
            .await
            .status,
        405
    );
    let r = http(&server, "POST", CHAT, Some("{\"model\": ")).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["type"],
        "invalid_request_error",
        "{}",
        r.body
    );
    // Metrics count each route apart (the dialect's counters join them).
    let c = json!({"model": "stories260K", "prompt": "Once", "max_tokens": 2}).to_string();
    let r = http(&server, "POST", "/v1/completions", Some(&c)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let m = http(&server, "GET", "/metrics", None).await.body;
    let count = |route: &str, status: u16| {
        metric(
            &m,
            &format!("tokenwire_http_requests_total{{route=\"{route}\",status=\"{status}\"}}"),
        )
    };
    assert_eq!(count(CHAT, 200), Some(1.0), "{m}");
    assert_eq!(count(CHAT, 405), Some(1.0), "{m}");
    assert_eq!(count(CHAT, 400), Some(1.0), "{m}");
    assert_eq!(count("/v1/completions", 200), Some(1.0), "{m}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_on_every_route_chat_needs_one() {
    let key = "sk-chat-e2e";
    let keys = keys_file("chat-e2e", &[(key, &["org_a"])]);
    let server = start(ModelSource::Dir(stories260k()), move |c| {
        c.keys = Some(keys);
        c.tenancy.auth = tokenwire_io::tenancy::Auth::All;
    })
    .await;
    let b = body(json!({"max_tokens": 2}));
    let r = http(&server, "POST", CHAT, Some(&b)).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key", "{}", r.body);
    let auth = format!("Bearer {key}");
    let r = http_with(&server, "POST", CHAT, Some(&b), &[("Authorization", &auth)]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_stream_gets_its_generations_cancelled() {
    let server = server().await;
    let b = body(json!({"max_tokens": 400, "n": 2, "stream": true}));
    let mut s = TcpStream::connect(server.local_addr)
        .await
        .expect("connect");
    let req = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    // Read until the first chunk has arrived, then hang up.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        while !String::from_utf8_lossy(&seen).contains("chat.completion.chunk") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before a chunk");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a chunk in time");
    drop(s);
    let cancelled = "tokenwire_requests_total{dialect=\"chat\",outcome=\"cancelled\"}";
    let gone = tokio::time::timeout(WAIT, async {
        loop {
            let m = http(&server, "GET", "/metrics", None).await.body;
            if metric(&m, cancelled) == Some(2.0) {
                return m;
            }
        }
    })
    .await
    .expect("both choices are cancelled");
    let completed = "tokenwire_requests_total{dialect=\"chat\",outcome=\"completed\"}";
    assert_eq!(
        metric(&gone, completed).unwrap_or(0.0),
        0.0,
        "none ran to its end"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_choices_after_the_first_find_the_prompt_in_the_prefix_cache() {
    let server = server().await;
    let long = "Once upon a time there was a little girl named Lily. ".repeat(6);
    let b = json!({"model": "stories260K", "prompt": long, "max_tokens": 4, "n": 4,
                   "temperature": 1, "seed": 5})
    .to_string();
    let r = http(&server, "POST", "/v1/completions", Some(&b)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(4), "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    let m = http(&server, "GET", "/metrics", None).await.body;
    let hits = metric(&m, "tokenwire_prefix_cache_hits_total").expect("hits");
    // The first choice computes the prompt; each of the other three finds
    // every full 16-token block of it but the one holding its last token.
    let blocks = (prompt - 1) / 16;
    assert!(blocks >= 2, "a prompt of {prompt} tokens");
    assert_eq!(hits, (3 * 16 * blocks) as f64, "{m}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_and_frequency_penalties_steer_away_from_generated_tokens() {
    let server = server().await;
    let distinct = |v: &Value| {
        let toks: Vec<&str> = v["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("logprobs")
            .iter()
            .filter_map(|t| t["token"].as_str())
            .collect();
        let set: std::collections::BTreeSet<&str> = toks.iter().copied().collect();
        (toks.len(), set.len())
    };
    let ask = |penalties: Value| {
        let mut extra = json!({"max_tokens": 48, "logprobs": true});
        for (k, v) in penalties.as_object().into_iter().flatten() {
            extra[k] = v.clone();
        }
        body(extra)
    };
    let plain = http(&server, "POST", CHAT, Some(&ask(json!({}))))
        .await
        .json();
    let penalised = http(
        &server,
        "POST",
        CHAT,
        Some(&ask(
            json!({"presence_penalty": 1.5, "frequency_penalty": 1.5}),
        )),
    )
    .await
    .json();
    let (n_plain, d_plain) = distinct(&plain);
    let (n_pen, d_pen) = distinct(&penalised);
    assert_eq!((n_plain, n_pen), (48, 48), "{plain} {penalised}");
    assert_ne!(
        plain["choices"][0]["message"]["content"],
        penalised["choices"][0]["message"]["content"]
    );
    assert!(
        d_pen > d_plain,
        "{d_pen} distinct tokens penalised, {d_plain} plain"
    );
    let bad = http(
        &server,
        "POST",
        CHAT,
        Some(&ask(json!({"frequency_penalty": 3}))),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "frequency_penalty");
    server.shutdown().await;
}

/// `logit_bias` on both routes: +100 forces a token at every step (its
/// logprob, that of the biased row, is then about 0), -100 on half the
/// vocabulary changes the greedy text, and a token id past the vocabulary
/// is a 400 naming the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_forces_and_bans_tokens() {
    let server = server().await;
    let forced = http(
        &server,
        "POST",
        CHAT,
        Some(&body(
            json!({"max_tokens": 4, "logprobs": true, "logit_bias": {"300": 100}}),
        )),
    )
    .await;
    assert_eq!(forced.status, 200, "{}", forced.body);
    let v = forced.json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs")
        .clone();
    assert_eq!(content.len(), 4, "{v}");
    for t in &content {
        assert_eq!(t["token"], content[0]["token"], "one token, forced: {v}");
        assert!(t["logprob"].as_f64().expect("logprob") > -1e-3, "{t}");
    }
    let text = |extra: Value| {
        let b = completion_body(16, extra);
        let server = &server;
        async move {
            let r = http(server, "POST", "/v1/completions", Some(&b)).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned()
        }
    };
    let plain = text(json!({})).await;
    let ban: serde_json::Map<String, Value> = (256..512)
        .map(|id: u32| (id.to_string(), json!(-100)))
        .collect();
    let banned = text(json!({ "logit_bias": ban })).await;
    assert_ne!(
        plain, banned,
        "banning half the vocabulary changes the text"
    );
    // A bias of zero changes nothing.
    assert_eq!(text(json!({"logit_bias": {"300": 0}})).await, plain);
    let bad = http(
        &server,
        "POST",
        CHAT,
        Some(&body(json!({"logit_bias": {"512": 1}}))),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["param"], "logit_bias.512");
    server.shutdown().await;
}

/// vLLM's `ignore_eos` and `min_tokens`, which benchmark clients send for
/// fixed output lengths: a greedy story that ends by itself runs to
/// `max_tokens` with `ignore_eos`, and past its natural end with
/// `min_tokens`; and `min_p` 1, which draws the greedy text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_min_tokens_and_min_p_on_a_story_that_ends() {
    let server = server().await;
    let ask = |extra: Value| {
        let b = completion_body(400, extra);
        let server = &server;
        async move {
            let r = http(server, "POST", "/v1/completions", Some(&b)).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            let n = v["usage"]["completion_tokens"].as_u64().expect("usage");
            let finish = v["choices"][0]["finish_reason"]
                .as_str()
                .expect("finish")
                .to_owned();
            let text = v["choices"][0]["text"].as_str().expect("text").to_owned();
            (n, finish, text)
        }
    };
    let (natural, finish, text) = ask(json!({})).await;
    assert_eq!(finish, "stop", "the story ends by itself: {text}");
    assert!(natural < 390, "{natural} tokens");
    let (n, finish, long) = ask(json!({"ignore_eos": true})).await;
    assert_eq!((n, finish.as_str()), (400, "length"));
    assert!(long.starts_with(&text) && long.len() > text.len());
    // Min-p 1 keeps only the most likely token: a draw at temperature 1
    // is the greedy text.
    let (_, _, min_p_text) = ask(json!({"temperature": 1, "seed": 3, "min_p": 1.0})).await;
    assert_eq!(min_p_text, text);
    let (_, _, drawn) = ask(json!({"temperature": 1, "seed": 3})).await;
    assert_ne!(drawn, text, "without min-p the draw wanders");
    let min = natural + 5;
    let (n, _, held) = ask(json!({ "min_tokens": min })).await;
    assert!(n >= min, "{n} tokens, at least {min} asked");
    assert!(
        held.starts_with(&text),
        "the same text up to the held-back end"
    );
    // A stop string in the first min_tokens tokens does not end the
    // answer (vLLM's rule); without min_tokens it does.
    let word = text
        .split(' ')
        .nth(2)
        .filter(|w| w.len() > 1)
        .expect("a third word");
    let stop = format!(" {word}");
    let (n, finish, cut) = ask(json!({"stop": [stop.clone()]})).await;
    assert_eq!(finish, "stop");
    let at = text.find(&stop).expect("the stop string is in the text");
    assert_eq!(cut, text[..at]);
    let (n_min, finish_min, held) = ask(json!({"stop": [stop.clone()], "min_tokens": n + 3})).await;
    assert!(
        n_min >= n + 3 && held.len() > cut.len() + stop.len(),
        "{n_min} tokens: {held:?}"
    );
    assert!(held.starts_with(&format!("{cut}{stop}")), "{held:?}");
    assert!(finish_min == "stop" || finish_min == "length");
    // stop_token_ids: every id but the special ones ends the answer at its
    // first token, whose text is left out, ignore_eos or not.
    let every: Vec<u32> = (3..512).collect();
    let (n, finish, stopped) = ask(json!({"stop_token_ids": every, "ignore_eos": true})).await;
    assert_eq!((n, finish.as_str(), stopped.as_str()), (1, "stop", ""));
    // Under a grammar, its end is the answer's end, ignore_eos or not.
    let json_answer = http(
        &server,
        "POST",
        CHAT,
        Some(&body(json!({"max_tokens": 200, "ignore_eos": true,
            "response_format": {"type": "json_schema", "json_schema": {"name": "flag", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "boolean"}},
                           "required": ["a"], "additionalProperties": false}}}}))),
    )
    .await;
    assert_eq!(json_answer.status, 200, "{}", json_answer.body);
    let v = json_answer.json();
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let parsed: Value = serde_json::from_str(content).expect("JSON");
    assert!(parsed["a"].is_boolean(), "{content}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let bad = http(
        &server,
        "POST",
        "/v1/completions",
        Some(
            &json!({"model": "stories260K", "prompt": "x", "max_tokens": 3, "min_tokens": 4})
                .to_string(),
        ),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["param"], "min_tokens");
    server.shutdown().await;
}

/// vLLM's `allowed_token_ids`, `bad_words` and `include_stop_str_in_output`
/// on a greedy story: one allowed id is every token, two allowed ids are
/// every token of a draw at temperature 1 (and the end of the story,
/// not listed, never comes); a word of the story, banned, is written no
/// more while the text before it stays; a stop string kept ends the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_token_ids_bad_words_and_include_stop_str() {
    let server = server().await;
    let ask = |extra: Value| {
        let b = completion_body(24, extra);
        let server = &server;
        async move {
            let r = http(server, "POST", "/v1/completions", Some(&b)).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["choices"][0].clone()
        }
    };
    let text = |c: &Value| c["text"].as_str().expect("text").to_owned();
    let tokens = |c: &Value| -> Vec<String> {
        c["logprobs"]["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().expect("a token").to_owned())
            .collect()
    };
    // One id allowed: every token is it, to the length (no end allowed).
    let only = |id: u32| ask(json!({"allowed_token_ids": [id], "logprobs": 1, "max_tokens": 5}));
    let (a, b) = (only(300).await, only(301).await);
    let (ta, tb) = (tokens(&a), tokens(&b));
    assert_eq!((ta.len(), a["finish_reason"].as_str()), (5, Some("length")));
    assert!(
        ta.iter().all(|t| *t == ta[1]) && tb.iter().all(|t| *t == tb[1]),
        "{ta:?} {tb:?}"
    );
    let drawn = ask(json!({"allowed_token_ids": [300, 301], "logprobs": 1,
        "temperature": 1, "seed": 5}))
    .await;
    let td = tokens(&drawn);
    assert_eq!(td.len(), 24, "{drawn}");
    assert!(
        td[1..].iter().all(|t| *t == ta[1] || *t == tb[1]),
        "only the two allowed tokens: {td:?}"
    );
    // A word of the greedy story, banned.
    let plain = text(&ask(json!({})).await);
    let word = plain
        .split(' ')
        .filter(|w| w.len() > 3 && w.chars().all(char::is_alphabetic))
        .nth(1)
        .expect("a word")
        .to_owned();
    let at = plain
        .find(&format!(" {word}"))
        .expect("the word is in the text");
    let banned = text(&ask(json!({ "bad_words": [word.clone()] })).await);
    assert!(
        !banned.contains(&format!(" {word}")),
        "{word:?} banned: {banned:?}"
    );
    assert!(banned.starts_with(&plain[..at]), "{plain:?} / {banned:?}");
    // The stop string kept at the end of the text.
    let stop = format!(" {word}");
    let kept = ask(json!({"stop": [stop.clone()], "include_stop_str_in_output": true})).await;
    assert_eq!(kept["finish_reason"], "stop");
    assert_eq!(text(&kept), format!("{}{stop}", &plain[..at]));
    let cut = ask(json!({ "stop": [stop] })).await;
    assert_eq!(text(&cut), plain[..at]);
    // A grammar the allowed ids cannot write: the answer ends, empty.
    let none = http(
        &server,
        "POST",
        CHAT,
        Some(&body(json!({"allowed_token_ids": [300], "max_tokens": 8,
            "response_format": {"type": "json_object"}}))),
    )
    .await;
    assert_eq!(none.status, 200, "{}", none.body);
    let v = none.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "", "{v}");
    // Bad values name their field.
    for (extra, field) in [
        (
            json!({"allowed_token_ids": [3, 512]}),
            "allowed_token_ids[1]",
        ),
        (json!({"bad_words": [""]}), "bad_words[0]"),
    ] {
        let r = http(&server, "POST", CHAT, Some(&body(extra.clone()))).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{extra}");
    }
    server.shutdown().await;
}

/// vLLM's `truncate_prompt_tokens`: a text prompt twice the context, cut
/// to 100 tokens, keeps its BOS and its last 99 (as Hugging Face
/// tokenizers truncate), and is answered as those ids given as the prompt
/// are, its echo their text; a prompt of ids keeps its last 100; uncut it
/// is refused; a long conversation is cut after its template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_prompt_tokens_keeps_the_last_tokens() {
    let server = server().await;
    let post = |path: &'static str, body: Value| {
        let server = &server;
        async move { http(server, "POST", path, Some(&body.to_string())).await }
    };
    let long = "Once upon a time there was a little dog. ".repeat(100);
    let ids = post("/tokenize", json!({"model": "stories260K", "prompt": long}))
        .await
        .json()["tokens"]
        .as_array()
        .expect("tokens")
        .clone();
    assert!(ids.len() > 1000, "{} tokens", ids.len());
    let bos = post("/tokenize", json!({"model": "stories260K", "prompt": ""}))
        .await
        .json()["tokens"]
        .clone();
    assert_eq!(bos, json!([ids[0]]), "the tokenizer adds BOS alone");
    let mut kept = vec![ids[0].clone()];
    kept.extend_from_slice(&ids[ids.len() - 99..]);
    let ask = |prompt: Value, extra: Value| {
        let mut b = json!({"model": "stories260K", "prompt": prompt, "max_tokens": 8,
                           "temperature": 0});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        post("/v1/completions", b)
    };
    let answer = |v: &Value| v["choices"][0]["text"].as_str().expect("text").to_owned();
    let refused = ask(json!(long), json!({})).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "context_length_exceeded");
    let cut = ask(json!(long), json!({"truncate_prompt_tokens": 100})).await;
    assert_eq!(cut.status, 200, "{}", cut.body);
    let cut = cut.json();
    assert_eq!(cut["usage"]["prompt_tokens"], 100, "{cut}");
    let given = ask(json!(kept), json!({})).await.json();
    assert_eq!(answer(&cut), answer(&given));
    // The echo is the kept prompt's text, then the answer.
    let echoed = ask(
        json!(long),
        json!({"truncate_prompt_tokens": 100, "echo": true}),
    )
    .await
    .json();
    let kept_text = post("/detokenize", json!({ "tokens": kept })).await.json();
    let kept_text = kept_text["prompt"].as_str().expect("text");
    assert_eq!(answer(&echoed), format!("{kept_text}{}", answer(&given)));
    // Ids are cut as given: the last 100.
    let ids_cut = ask(json!(ids), json!({"truncate_prompt_tokens": 100}))
        .await
        .json();
    let last = ask(json!(ids[ids.len() - 100..]), json!({})).await.json();
    assert_eq!(ids_cut["usage"]["prompt_tokens"], 100);
    assert_eq!(answer(&ids_cut), answer(&last));
    // A conversation, cut after its template.
    let chat = http(
        &server,
        "POST",
        CHAT,
        Some(&body(json!({"max_tokens": 4, "truncate_prompt_tokens": 50,
            "messages": [{"role": "user", "content": long}]}))),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.body);
    assert_eq!(chat.json()["usage"]["prompt_tokens"], 50);
    server.shutdown().await;
}

/// vLLM's `/tokenize` and `/detokenize`: a prompt's ids are the ones the
/// Completions route counts, a conversation's those Chat Completions
/// counts, the text of the ids is the prompt again, and bad bodies name
/// their field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_agree_with_the_routes() {
    let server = server().await;
    let post = |path: &'static str, body: Value| {
        let server = &server;
        async move { http(server, "POST", path, Some(&body.to_string())).await }
    };
    let t = post(
        "/tokenize",
        json!({"model": "stories260K", "prompt": "Once upon a time"}),
    )
    .await;
    assert_eq!(t.status, 200, "{}", t.body);
    let t = t.json();
    let ids = t["tokens"].as_array().expect("tokens").clone();
    assert_eq!(t["count"], ids.len(), "{t}");
    assert!(t["max_model_len"].as_u64().expect("max_model_len") > 0);
    let c = post(
        "/v1/completions",
        json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 1}),
    )
    .await
    .json();
    assert_eq!(c["usage"]["prompt_tokens"], ids.len(), "{c}");
    let d = post("/detokenize", json!({ "tokens": ids })).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.json()["prompt"], "Once upon a time");
    let msgs = json!([{"role": "user", "content": "Once upon a time"}]);
    let m = post("/tokenize", json!({ "messages": msgs })).await.json();
    let chat = post(
        CHAT,
        json!({"model": "stories260K", "messages": msgs, "max_tokens": 1}),
    )
    .await
    .json();
    assert_eq!(chat["usage"]["prompt_tokens"], m["count"], "{m} {chat}");
    // With tools offered, as Chat Completions renders them.
    let tools = json!([{"type": "function", "function": {"name": "weather",
        "description": "The weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let mt = post("/tokenize", json!({"messages": msgs, "tools": tools}))
        .await
        .json();
    let chat_t = post(
        CHAT,
        json!({"model": "stories260K", "messages": msgs, "tools": tools, "max_tokens": 1}),
    )
    .await
    .json();
    assert_eq!(
        chat_t["usage"]["prompt_tokens"], mt["count"],
        "{mt} {chat_t}"
    );
    assert!(
        mt["count"].as_u64() > m["count"].as_u64(),
        "the tools count"
    );
    for (path, body, status, param) in [
        (
            "/tokenize",
            json!({"prompt": "a", "messages": msgs}),
            400,
            "messages",
        ),
        (
            "/tokenize",
            json!({"model": "other", "prompt": "a"}),
            404,
            "model",
        ),
        (
            "/detokenize",
            json!({"model": 7, "tokens": [1]}),
            400,
            "model",
        ),
        ("/detokenize", json!({"tokens": [1, 512]}), 400, "tokens[1]"),
        ("/detokenize", json!({}), 400, "tokens"),
    ] {
        let r = post(path, body.clone()).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{path} {body}");
    }
    let r = http(&server, "GET", "/tokenize", None).await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    server.shutdown().await;
}

/// `--anon-requests-per-minute`: a client without a key is limited by its
/// address, answered 429 with `Retry-After` and the API's code; a key's
/// requests are not. Each HTTP request counts once, however many choices
/// or prompts it asks for, and is computed whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_clients_over_their_rate_get_429_with_retry_after() {
    let key = "sk-anon-e2e";
    let keys = keys_file("anon-e2e", &[(key, &["org_a"])]);
    let server = start(ModelSource::Dir(stories260k()), move |c| {
        c.keys = Some(keys);
        c.tenancy.anon_requests_per_minute = Some(2);
    })
    .await;
    let b = body(json!({"max_tokens": 2}));
    let r = http(
        &server,
        "POST",
        CHAT,
        Some(&body(json!({"max_tokens": 2, "n": 3}))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"].as_array().map(Vec::len), Some(3));
    let prompts = json!({"model": "stories260K", "prompt": ["Once", "Lily", "Ben"],
                         "max_tokens": 2, "n": 2});
    let r = http(
        &server,
        "POST",
        "/v1/completions",
        Some(&prompts.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"].as_array().map(Vec::len), Some(6));
    let r = http(&server, "POST", CHAT, Some(&b)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(
        r.json()["error"]["code"],
        "rate_limit_exceeded",
        "{}",
        r.body
    );
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    // A key's requests pay by its organisation, not by the address.
    let auth = format!("Bearer {key}");
    let r = http_with(&server, "POST", CHAT, Some(&b), &[("authorization", &auth)]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().await;
}

/// `Content-Encoding: gzip` request bodies: inflated and served; one that
/// inflates past the body limit (a compression bomb) is 413, never inflated
/// whole; an encoding the server does not take is 415; a corrupt one 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bodies_are_inflated_under_the_body_limit() {
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;
    use tokenwire_tests::raw_http;
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.host.max_frame_bytes = 64 * 1024;
    })
    .await;
    let gzip = |data: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    };
    let post = |body: &[u8], encoding: &str| {
        let mut req = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Encoding: {encoding}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        req
    };
    let plain = body(json!({"max_tokens": 3}));
    let r = raw_http(&server, &post(&gzip(plain.as_bytes()), "gzip")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3, "{}", r.body);

    // 2 MiB of JSON whitespace: about 2 KiB gzipped, 32 times the limit.
    let mut bomb = plain.clone().into_bytes();
    bomb.splice(1..1, std::iter::repeat_n(b' ', 2 << 20));
    let packed = gzip(&bomb);
    assert!(packed.len() < 64 * 1024, "{}", packed.len());
    let r = raw_http(&server, &post(&packed, "gzip")).await;
    assert_eq!(r.status, 413, "{}", r.body);

    let r = raw_http(&server, &post(plain.as_bytes(), "br")).await;
    assert_eq!(r.status, 415, "{}", r.body);
    assert!(r.body.contains("Content-Encoding"), "{}", r.body);
    let r = raw_http(&server, &post(b"\x1f\x8bnot gzip at all", "gzip")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    server.shutdown().await;
}

/// `--max-context`: the server serves a shorter context than the model's
/// (stories260K's is 512), reports it where vLLM does, and refuses what
/// does not fit it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_context_bounds_what_the_routes_take() {
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.max_context = Some(40)
    })
    .await;
    let post = |path: &'static str, body: Value| {
        let server = &server;
        async move { http(server, "POST", path, Some(&body.to_string())).await }
    };
    let t = post("/tokenize", json!({"prompt": "Once upon a time"}))
        .await
        .json();
    assert_eq!(t["max_model_len"], 40, "{t}");
    let count = t["count"].as_u64().expect("count");
    let fits = post(
        "/v1/completions",
        json!({"model": "stories260K", "prompt": "Once upon a time",
               "max_tokens": 40 - count, "ignore_eos": true}),
    )
    .await;
    assert_eq!(fits.status, 200, "{}", fits.body);
    assert_eq!(fits.json()["usage"]["total_tokens"], 40, "{}", fits.body);
    let over = post(
        "/v1/completions",
        json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 41 - count}),
    )
    .await;
    assert_eq!(over.status, 400, "{}", over.body);
    let long = "Once upon a time there was a little girl. ".repeat(8);
    let over = post(
        "/v1/completions",
        json!({"model": "stories260K", "prompt": long, "max_tokens": 1}),
    )
    .await;
    assert_eq!(over.status, 400, "{}", over.body);
    assert!(
        over.body.contains("context length of 40 tokens"),
        "{}",
        over.body
    );
    server.shutdown().await;
}

/// `thinking_token_budget` on the CPU engine, with stories260K whose
/// tokenizer spells `</think>` in one token
/// ([`tokenwire_tests::make_close_tag_one_token`]). Its story is all
/// reasoning without a budget (the template opened it and the model never
/// closes it). Given 5, the reasoning is the story's first five tokens,
/// the close tag is forced as the sixth, and the model answers from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_forces_the_close_tag_after_that_many_tokens() {
    use tokenwire_core::reasoning::ReasoningTags;
    let dir = tokenwire_tests::thinking_stories260k("budget");
    tokenwire_tests::make_close_tag_one_token(&dir);
    let server = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(ReasoningTags::THINK);
    })
    .await;
    let reply = |extra: Value| {
        let server = &server;
        async move {
            let v = http(server, "POST", CHAT, Some(&body(extra))).await.json();
            assert!(v["choices"][0]["message"].is_object(), "{v}");
            v
        }
    };
    let first_five = reply(json!({"max_tokens": 5})).await;
    let thought = first_five["choices"][0]["message"]["reasoning_content"].clone();
    assert!(
        thought.as_str().is_some_and(|t| !t.is_empty()),
        "{first_five}"
    );

    let v = reply(json!({"max_tokens": 20, "thinking_token_budget": 5})).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], thought, "{v}");
    assert!(
        m["content"].as_str().is_some_and(|t| !t.trim().is_empty()),
        "the model answers after the forced close: {v}"
    );
    let usage = &v["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"], 6,
        "{v}"
    );
    assert_eq!(usage["completion_tokens"], 20, "{v}");

    // A budget the story never reaches changes nothing.
    let unbounded = reply(json!({"max_tokens": 20})).await;
    let roomy = reply(json!({"max_tokens": 20, "thinking_token_budget": 50})).await;
    assert_eq!(
        roomy["choices"][0]["message"],
        unbounded["choices"][0]["message"]
    );
    server.shutdown().await;
    std::fs::remove_dir_all(dir.parent().expect("its temp folder")).ok();
}

/// Magistral's tags since 2507: `[THINK]` and `[/THINK]` special tokens
/// (stories260K with both made so, and a template opening `[THINK]`).
/// Decoding keeps them in the text, so `--reasoning-parser mistral` starts
/// (it refused such a tokenizer before) and finds the thinking, and a
/// budget forces `[/THINK]`, one token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_token_reasoning_tags_are_found_and_forced() {
    use tokenwire_core::reasoning::ReasoningTags;
    let template = tokenwire_tests::THINKING_TEMPLATE
        .replace("</think>", "[/THINK]")
        .replace("<think>", "[THINK]");
    let dir = tokenwire_tests::stories260k_with_template("magistral", &template);
    tokenwire_tests::make_tags_one_token(&dir, &["[THINK]", "[/THINK]"], true);
    let plain = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let server = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(ReasoningTags::MISTRAL);
    })
    .await;
    let reply = |server, extra: Value| async move {
        let v = http(server, "POST", CHAT, Some(&body(extra))).await.json();
        assert!(v["choices"][0]["message"].is_object(), "{v}");
        v
    };
    // Without the parser the story is the content; with it, the reasoning.
    let raw = reply(&plain, json!({"max_tokens": 12})).await;
    let story = raw["choices"][0]["message"]["content"].clone();
    let v = reply(&server, json!({"max_tokens": 12})).await;
    let trimmed = story.as_str().map(str::trim);
    assert_eq!(
        v["choices"][0]["message"]["reasoning_content"].as_str(),
        trimmed,
        "{v}"
    );

    // A budget of 4: the first four tokens are the thinking, `[/THINK]` is
    // forced, the rest is the answer, and `[/THINK]` is in no text.
    let first_four = reply(&server, json!({"max_tokens": 4})).await;
    let v = reply(
        &server,
        json!({"max_tokens": 12, "thinking_token_budget": 4}),
    )
    .await;
    let m = &v["choices"][0]["message"];
    assert_eq!(
        m["reasoning_content"], first_four["choices"][0]["message"]["reasoning_content"],
        "{v}"
    );
    let answer = m["content"].as_str().expect("content");
    assert!(
        !answer.trim().is_empty() && !answer.contains("[/THINK]"),
        "{v}"
    );
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 5,
        "{v}"
    );
    // Without the parser nothing is known of the tags, so nothing is cut.
    let v = reply(
        &plain,
        json!({"max_tokens": 12, "thinking_token_budget": 4}),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], story, "{v}");
    plain.shutdown().await;
    server.shutdown().await;
    std::fs::remove_dir_all(dir.parent().expect("its temp folder")).ok();
}

/// `--reasoning-parser` on a model whose chat template opens the reasoning
/// (stories260K with [`tokenwire_tests::THINKING_TEMPLATE`]): the story it
/// writes is all reasoning, since it never closes the tag, and equals what a
/// server without the parser sends as text; `enable_thinking: false` closes
/// the reasoning in the prompt, so the answer is all content; streamed, the
/// reasoning comes as `reasoning_content` deltas; `/tokenize` renders the
/// kwargs as the route does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_parser_sends_the_thinking_as_reasoning_content() {
    use tokenwire_core::reasoning::ReasoningTags;
    let dir = tokenwire_tests::thinking_stories260k("e2e");
    let parsed = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(ReasoningTags::THINK);
    })
    .await;
    let plain = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let ask = body(json!({"max_tokens": 20}));

    let raw = http(&plain, "POST", CHAT, Some(&ask)).await.json();
    let raw_text = raw["choices"][0]["message"]["content"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(raw["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
    let v = http(&parsed, "POST", CHAT, Some(&ask)).await.json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], raw_text.trim(), "{v}");
    assert_eq!(m["content"], "", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        20
    );

    let off = body(json!({"max_tokens": 20, "chat_template_kwargs": {"enable_thinking": false}}));
    let v = http(&parsed, "POST", CHAT, Some(&off)).await.json();
    let m = &v["choices"][0]["message"];
    assert!(m["reasoning_content"].is_null(), "{v}");
    assert!(!m["content"].as_str().expect("content").is_empty(), "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );

    let streamed = with(
        serde_json::from_str(&ask).expect("json"),
        json!({"stream": true}),
    );
    let r = http(&parsed, "POST", CHAT, Some(&streamed)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut reasoning = String::new();
    for line in r.body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("a chunk");
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        assert!(
            delta["content"].as_str().unwrap_or_default().is_empty(),
            "{chunk}"
        );
    }
    assert_eq!(reasoning, raw_text.trim());

    let count = |kwargs: Value| {
        json!({"messages": [{"role": "user", "content": "Once upon a time"}],
               "chat_template_kwargs": kwargs})
        .to_string()
    };
    // The template itself, for clients that render it (lm-eval).
    let info = http(&parsed, "GET", "/tokenizer_info", None).await.json();
    assert_eq!(info["chat_template"], tokenwire_tests::THINKING_TEMPLATE);
    let on = http(&parsed, "POST", "/tokenize", Some(&count(json!({})))).await;
    let off = http(
        &parsed,
        "POST",
        "/tokenize",
        Some(&count(json!({"enable_thinking": false}))),
    )
    .await;
    assert!(
        off.json()["count"].as_u64() > on.json()["count"].as_u64(),
        "{} {}",
        on.body,
        off.body
    );
    // A kwarg holding the model's control text would be read as markup.
    let forged = body(json!({"chat_template_kwargs": {"note": "</s>"}}));
    let r = http(&parsed, "POST", CHAT, Some(&forged)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.json()["error"]["param"],
        "chat_template_kwargs",
        "{}",
        r.body
    );
    let bad = body(json!({"chat_template_kwargs": {"messages": []}}));
    let r = http(&parsed, "POST", CHAT, Some(&bad)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "chat_template_kwargs.messages");
    parsed.shutdown().await;
    plain.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}

/// A ChatML template, as Qwen's and SmolLM2's.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// vLLM's `continue_final_message`: the model continues the final
/// assistant message. The prompt ends with its text (no end of turn, no new
/// turn, as `/tokenize` shows with the same fields), the answer is only
/// what the model adds (greedy: exactly what Completions gives for that
/// prompt), and without the field the message is answered as a finished
/// turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_final_message_continues_the_assistant_s_text() {
    let dir = tokenwire_tests::stories260k_with_template("continue-final", CHATML);
    let server = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let messages = json!([{"role": "user", "content": "Tell me a story."},
                          {"role": "assistant", "content": "Once upon a time, there was a"}]);
    let continued = json!({"model": "stories260K", "messages": messages, "max_tokens": 12,
                           "temperature": 0, "continue_final_message": true,
                           "add_generation_prompt": false});
    let r = http(&server, "POST", CHAT, Some(&continued.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    let tokenized = http(
        &server,
        "POST",
        "/tokenize",
        Some(&json!({"messages": messages, "continue_final_message": true}).to_string()),
    )
    .await;
    assert_eq!(tokenized.status, 200, "{}", tokenized.body);
    let ids = tokenized.json()["tokens"].clone();
    assert_eq!(
        r.json()["usage"]["prompt_tokens"],
        ids.as_array().expect("ids").len()
    );
    let text = http(
        &server,
        "POST",
        "/detokenize",
        Some(&json!({"tokens": ids}).to_string()),
    )
    .await;
    let prompt = text.json()["prompt"].as_str().expect("text").to_string();
    assert!(
        prompt.ends_with("<|im_start|>assistant\nOnce upon a time, there was a"),
        "{prompt:?}"
    );
    let raw = json!({"model": "stories260K", "prompt": ids, "max_tokens": 12, "temperature": 0});
    let c = http(&server, "POST", "/v1/completions", Some(&raw.to_string())).await;
    assert_eq!(
        c.json()["choices"][0]["text"],
        answer.as_str(),
        "{}",
        c.body
    );
    // Without the field, the final message is a finished turn, answered.
    let answered = json!({"model": "stories260K", "messages": messages, "max_tokens": 12,
                          "temperature": 0});
    let tokenized = http(
        &server,
        "POST",
        "/tokenize",
        Some(&json!({"messages": messages}).to_string()),
    )
    .await;
    let n = tokenized.json()["count"].as_u64().expect("count");
    let a = http(&server, "POST", CHAT, Some(&answered.to_string())).await;
    assert_eq!(a.json()["usage"]["prompt_tokens"], n);
    assert!(n > ids.as_array().map_or(0, Vec::len) as u64);
    let bad = json!({"model": "stories260K", "continue_final_message": true,
                     "messages": [{"role": "user", "content": "x"}]});
    let e = http(&server, "POST", CHAT, Some(&bad.to_string())).await;
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(e.json()["error"]["param"], "continue_final_message");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}

/// Completions' `suffix` on a model with fill-in-the-middle tokens: the
/// prompt is the markers around the two texts (the ids `/tokenize` gives
/// for it written out), one each; the text is the greedy middle; the
/// refusals name `suffix`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suffix_fills_in_the_middle() {
    let dir = tokenwire_tests::fim_stories260k("fim-e2e");
    let server = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let (before, after) = ("Once upon a time, Lily", " and they were happy.");
    let body = json!({"model": "stories260K", "prompt": before, "suffix": after,
                      "max_tokens": 8, "temperature": 0});
    let r = http(&server, "POST", "/v1/completions", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let written = format!("<|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>");
    let t = http(
        &server,
        "POST",
        "/tokenize",
        Some(&json!({"prompt": written}).to_string()),
    )
    .await;
    let ids: Vec<u64> = t.json()["tokens"]
        .as_array()
        .expect("ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    for tag in tokenwire_tests::FIM_TAGS {
        let d = http(
            &server,
            "POST",
            "/tokenize",
            Some(&json!({"prompt": tag, "add_special_tokens": false}).to_string()),
        )
        .await;
        let tag_ids = d.json()["tokens"].clone();
        assert_eq!(
            tag_ids.as_array().map(Vec::len),
            Some(1),
            "{tag}: one token"
        );
        let id = tag_ids[0].as_u64().expect("an id");
        assert_eq!(
            ids.iter().filter(|&&i| i == id).count(),
            1,
            "{tag} in {ids:?}"
        );
    }
    assert_eq!(r.json()["usage"]["prompt_tokens"], ids.len());
    let by_hand = json!({"model": "stories260K", "prompt": ids, "max_tokens": 8, "temperature": 0});
    let h = http(
        &server,
        "POST",
        "/v1/completions",
        Some(&by_hand.to_string()),
    )
    .await;
    assert_eq!(
        r.json()["choices"][0]["text"],
        h.json()["choices"][0]["text"],
        "{} vs {}",
        r.body,
        h.body
    );
    for (extra, why) in [
        (json!({"echo": true}), "echo"),
        (json!({"prompt": [[1, 2, 3]]}), "token ids"),
    ] {
        let mut b = body.clone();
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        let e = http(&server, "POST", "/v1/completions", Some(&b.to_string())).await;
        assert_eq!(e.status, 400, "{why}: {}", e.body);
        assert_eq!(e.json()["error"]["param"], "suffix", "{why}");
    }
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
    // A model without the markers refuses a suffix, naming it.
    let plain = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let e = http(&plain, "POST", "/v1/completions", Some(&body.to_string())).await;
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(e.json()["error"]["param"], "suffix");
    // An empty suffix is no suffix, as clients that always send one mean.
    let empty = json!({"model": "stories260K", "prompt": before, "suffix": "", "max_tokens": 2});
    let ok = http(&plain, "POST", "/v1/completions", Some(&empty.to_string())).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    plain.shutdown().await;
}
