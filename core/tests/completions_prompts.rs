//! Completions' prompts through a Host with a scripted engine: token ids as
//! the prompt, and `echo` with `logprobs` scoring the prompt (what
//! lm-evaluation-harness sends for log-likelihoods): the engine's scores
//! open each choice's `logprobs`, never computed from cached blocks.

use serde_json::{json, Value};
use tokenwire_core::testing::{script_prompt_logprobs, Harness, BYTE_BOS, BYTE_OFFSET};
use tokenwire_core::{ConnId, Dialect, HostConfig, Input, TokenId, Transport};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";
/// Longer than one KV block (16), so a plain request caches blocks of it.
const PROMPT: &str = "the quick brown fox jumps over the lazy dog";

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

fn completion(h: &mut Harness, id: u64, body: Value) -> Vec<Value> {
    let c = open(h, id);
    let mut b = json!({"model": "tiny", "max_tokens": 3, "temperature": 0});
    for (k, v) in body.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    h.send(c, json!({"route": "completions", "body": b}));
    h.run(80);
    h.received(c).to_vec()
}

fn prompt_ids() -> Vec<TokenId> {
    let mut ids = vec![BYTE_BOS];
    ids.extend(PROMPT.bytes().map(|b| b as TokenId + BYTE_OFFSET));
    ids
}

/// Checks a choice's `logprobs` against the script's scores of the prompt
/// and `answer`'s tokens after it.
fn check_echoed(lp: &Value, text: &str, top: u8, answer: &str) {
    let ids = prompt_ids();
    let scores = script_prompt_logprobs(&ids, top);
    let n = ids.len();
    assert_eq!(text, format!("{PROMPT}{answer}"));
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), n + answer.len(), "{lp}");
    let joined: String = tokens.iter().filter_map(Value::as_str).collect();
    assert_eq!(joined, text, "the tokens spell the text");
    assert_eq!(
        lp["token_logprobs"][0],
        Value::Null,
        "the first token is unscored"
    );
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    for p in 1..n {
        let want = f64::from(scores[p - 1].logprob);
        assert_eq!(lp["token_logprobs"][p].as_f64(), Some(want), "position {p}");
        let alts = lp["top_logprobs"][p].as_object().expect("alternatives");
        assert_eq!(alts.len(), top as usize, "position {p}");
        // The script's best alternative is the token itself.
        let own = tokens[p].as_str().expect("token");
        assert_eq!(alts[own].as_f64(), Some(want), "position {p}");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let mut at = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(offsets[i], at, "offset of token {i}");
        at += t.as_str().map_or(0, str::len) as u64;
    }
    // The answer's tokens carry the sampler's logprobs.
    if !answer.is_empty() {
        assert_eq!(lp["token_logprobs"][n].as_f64(), Some(-0.5));
    }
}

#[test]
fn echo_with_logprobs_scores_the_prompt_for_every_choice_never_from_cached_blocks() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    // A plain request first: the prompt's full blocks go to the prefix
    // cache. The scripted engine panics if a scored prompt starts on them.
    let plain = completion(&mut h, 1, json!({"prompt": PROMPT}));
    assert_eq!(plain.last().expect("reply")["kind"], "reply");
    let r = completion(
        &mut h,
        2,
        json!({"prompt": PROMPT, "echo": true, "logprobs": 2, "n": 2}),
    );
    let data = &r.last().expect("reply")["data"];
    let choices = data["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    for ch in choices {
        let text = ch["text"].as_str().expect("text");
        check_echoed(&ch["logprobs"], text, 2, &text[PROMPT.len()..]);
    }
    assert_eq!(data["usage"]["prompt_tokens"], prompt_ids().len());
    assert_eq!(
        data["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        0
    );

    // Without `echo`, only the answer's tokens have logprobs.
    let r = completion(&mut h, 3, json!({"prompt": PROMPT, "logprobs": 1}));
    let lp = &r.last().expect("reply")["data"]["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(3), "{lp}");
}

#[test]
fn a_streamed_echo_opens_each_choice_with_the_prompt_and_its_scores() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let frames = completion(
        &mut h,
        1,
        json!({"prompt": PROMPT, "echo": true, "logprobs": 1, "n": 2, "stream": true}),
    );
    for index in 0..2 {
        let first = frames
            .iter()
            .find(|f| f["kind"] == "chunk" && f["data"]["choices"][0]["index"] == index)
            .expect("a first chunk");
        let ch = &first["data"]["choices"][0];
        let text = ch["text"].as_str().expect("text");
        check_echoed(&ch["logprobs"], text, 1, &text[PROMPT.len()..]);
        assert_eq!(text.len(), PROMPT.len() + 1, "the prompt and one token");
    }
    assert_eq!(frames.last().expect("done")["kind"], "done");
}

#[test]
fn token_ids_are_a_prompt_fed_as_given_and_echoed_as_their_text() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let ids = prompt_ids();
    for (id, prompt) in [(1, json!(ids)), (2, json!([ids]))] {
        let r = completion(
            &mut h,
            id,
            json!({"prompt": prompt, "echo": true, "logprobs": 3}),
        );
        let data = &r.last().expect("reply")["data"];
        let ch = &data["choices"][0];
        let text = ch["text"].as_str().expect("text");
        check_echoed(&ch["logprobs"], text, 3, &text[PROMPT.len()..]);
        assert_eq!(data["usage"]["prompt_tokens"], ids.len());
    }
    // Too long for the context beside max_tokens (512, from 510 ids).
    let long = vec![BYTE_OFFSET; 510];
    let r = completion(&mut h, 3, json!({"prompt": long, "max_tokens": 3}));
    let err = &r.last().expect("error")["data"]["error"];
    assert_eq!(err["code"], "context_length_exceeded", "{err}");
    assert_eq!(err["param"], "prompt");
    // An id past the vocabulary names its place.
    let r = completion(&mut h, 4, json!({"prompt": [[3, 259]]}));
    assert_eq!(
        r.last().expect("error")["data"]["error"]["param"],
        "prompt[0][1]"
    );
}

#[test]
fn a_batch_of_prompts_answers_n_choices_each_in_prompt_order() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    let ids = prompt_ids();
    let r = completion(
        &mut h,
        1,
        json!({"prompt": [PROMPT, ids, "hi"], "n": 2, "echo": true, "logprobs": 1}),
    );
    let data = &r.last().expect("reply")["data"];
    let choices = data["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 6, "{data}");
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
        let text = ch["text"].as_str().expect("text");
        if i < 4 {
            // The text prompt and the same prompt as ids score alike.
            check_echoed(&ch["logprobs"], text, 1, &text[PROMPT.len()..]);
        } else {
            assert!(text.starts_with("hi"), "{text}");
            assert_eq!(
                ch["logprobs"]["tokens"].as_array().map(Vec::len),
                Some(3 + 3)
            );
        }
    }
    assert_eq!(data["usage"]["prompt_tokens"], 2 * ids.len() + 3);
    assert_eq!(data["usage"]["completion_tokens"], 6 * 3);
}

#[test]
fn prompts_past_the_connection_s_queue_share_wait_for_room() {
    let config = HostConfig {
        max_queued_per_conn: 2,
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, SCRIPT, 1);
    let prompts: Vec<String> = (0..7).map(|i| format!("prompt {i}")).collect();
    let r = completion(&mut h, 1, json!({"prompt": prompts, "n": 2}));
    let data = &r.last().expect("reply")["data"];
    let choices = data["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 14, "{data}");
    assert!(choices.iter().all(|c| c["finish_reason"] == "length"));
    // Too many choices in all is refused before anything runs.
    let r = completion(&mut h, 2, json!({"prompt": vec!["a"; 200], "n": 8}));
    let err = &r.last().expect("error")["data"]["error"];
    assert_eq!(err["param"], "n", "{err}");
}

#[test]
fn max_tokens_0_with_echo_scores_the_prompt_and_generates_nothing() {
    let mut h = Harness::new(HostConfig::default(), SCRIPT, 1);
    for (id, stream) in [(1, false), (2, true)] {
        let frames = completion(
            &mut h,
            id,
            json!({"prompt": PROMPT, "echo": true, "logprobs": 2, "max_tokens": 0, "n": 2,
                   "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }}),
        );
        let (choices, usage) = if stream {
            let chunks: Vec<&Value> = frames.iter().filter(|f| f["kind"] == "chunk").collect();
            let firsts: Vec<Value> = (0..2)
                .map(|i| {
                    chunks
                        .iter()
                        .map(|c| &c["data"]["choices"][0])
                        .find(|c| c["index"] == i)
                        .cloned()
                        .expect("a chunk per choice")
                })
                .collect();
            let usage = chunks.last().expect("usage")["data"]["usage"].clone();
            assert_eq!(frames.last().expect("done")["kind"], "done");
            (firsts, usage)
        } else {
            let data = &frames.last().expect("reply")["data"];
            (
                data["choices"].as_array().expect("choices").clone(),
                data["usage"].clone(),
            )
        };
        assert_eq!(choices.len(), 2);
        for ch in &choices {
            check_echoed(&ch["logprobs"], ch["text"].as_str().expect("text"), 2, "");
        }
        assert_eq!(usage["completion_tokens"], 0, "stream {stream}");
        assert_eq!(
            usage["prompt_tokens"],
            prompt_ids().len(),
            "a prompt counts once"
        );
    }
    // Without `echo`, nothing to answer: refused.
    let r = completion(&mut h, 3, json!({"prompt": PROMPT, "max_tokens": 0}));
    assert_eq!(
        r.last().expect("error")["data"]["error"]["param"],
        "max_tokens"
    );
}
