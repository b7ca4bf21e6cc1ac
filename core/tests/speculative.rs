//! Speculative decoding by prompt lookup through the Host: the same frames
//! as without it, in fewer engine steps, also where a generation ends (a
//! stop string, its length) inside a step that gave it several tokens, and
//! a `batch` continuation goes on from exactly the tokens delivered.

use serde_json::{json, Value};
use tokenwire_core::testing::{script_text, Harness};
use tokenwire_core::{Dialect, DraftConfig, Event, HostConfig, Output};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

/// A prompt (after BOS, at position 0) that follows the script, position
/// for position, as the scripted engine's samples do: prompt lookup then
/// guesses the engine's tokens.
const FOLLOWS: &str = "bcdefghijklmnopqrstuvwxyzabcdef";

fn config(draft_tokens: u32) -> HostConfig {
    HostConfig {
        draft: DraftConfig {
            max_tokens: draft_tokens,
            ngram_min: 1,
            ngram_max: 3,
            max_seqs: 4,
        },
        ..HostConfig::default()
    }
}

fn drafts(h: &Harness) -> (u32, u32) {
    h.others.iter().fold((0, 0), |(d, c), o| match o {
        Output::Event(Event::DraftTokens { drafted, confirmed }) => (d + drafted, c + confirmed),
        _ => (d, c),
    })
}

/// Prompt tokens each `batch` continuation reused from its kept blocks.
fn reused(h: &Harness) -> Vec<u32> {
    h.others
        .iter()
        .filter_map(|o| match o {
            Output::Event(Event::PromptTokensReused { count }) => Some(*count),
            _ => None,
        })
        .collect()
}

/// A `generate` request's frames (their timing left out) and the steps it took.
fn generate(draft_tokens: u32, params: Value) -> (Vec<Value>, u64, (u32, u32)) {
    let mut h = Harness::new(config(draft_tokens), SCRIPT, 7);
    let c = h.open(1, Dialect::Generate);
    h.send(
        c,
        json!({"type": "config", "prompt": FOLLOWS, "parameters": params}),
    );
    h.run(500);
    let frames = h
        .received(c)
        .iter()
        .map(|f| {
            let mut f = f.clone();
            if let Value::Object(m) = &mut f {
                m.retain(|k, _| !k.contains("time") && !k.contains("latency"));
            }
            f
        })
        .collect();
    (frames, h.steps_run, drafts(&h))
}

#[test]
fn a_drafted_generation_streams_the_same_frames_in_fewer_steps() {
    let params = json!({"max_tokens": 60});
    let (plain, plain_steps, none) = generate(0, params.clone());
    let (drafted, drafted_steps, (fed, confirmed)) = generate(6, params);
    assert_eq!(none, (0, 0));
    assert_eq!(drafted, plain);
    let tokens = drafted.iter().filter(|f| f["type"] == "token").count();
    assert_eq!(tokens, 60, "one frame per token");
    let text: String = drafted.iter().filter_map(|f| f["token"].as_str()).collect();
    assert_eq!(text, script_text(SCRIPT, FOLLOWS.len() + 1, 60));
    assert!(confirmed > 0 && confirmed <= fed);
    assert!(
        drafted_steps * 2 < plain_steps,
        "{drafted_steps} steps drafted, {plain_steps} plain"
    );
}

#[test]
fn a_stop_string_or_the_length_inside_a_drafted_step_ends_it_there() {
    for params in [
        json!({"max_tokens": 60, "stop": ["pqr"]}),
        json!({"max_tokens": 13}),
        json!({"max_tokens": 60, "stop": ["xyzab"]}),
    ] {
        let (plain, _, _) = generate(0, params.clone());
        let (drafted, _, (_, confirmed)) = generate(8, params.clone());
        assert!(confirmed > 0, "{params}: drafts were confirmed");
        assert_eq!(drafted, plain, "{params}");
    }
}

fn batch_payload(max_new_tokens: u32) -> Value {
    json!({
        "prompts": [
            {"request_id": "a", "prompt": FOLLOWS},
            {"request_id": "b", "prompt": "bcdefgh"},
        ],
        "generation_config": {"max_new_tokens": max_new_tokens},
    })
}

/// Three `batch` payloads of the same ids (so the last two continue the
/// first), ending inside drafted steps: each prompt's elements in order
/// (timing left out; frames group them by step, and a drafted prompt takes
/// fewer steps), and the prompt tokens each continuation reused from its
/// kept blocks.
fn batch(draft_tokens: u32) -> (Vec<Vec<Value>>, Vec<u32>, (u32, u32)) {
    let mut h = Harness::new(config(draft_tokens), SCRIPT, 3);
    let c = h.open(1, Dialect::Batch);
    for n in [7, 11, 5] {
        h.send(c, batch_payload(n));
        h.run(200);
    }
    let of = |rid: &str| -> Vec<Value> {
        h.received(c)
            .iter()
            .flat_map(|f| f.as_array().cloned().unwrap_or_default())
            .filter(|e| e["request_id"] == rid)
            .map(|mut e| {
                if let Value::Object(m) = &mut e {
                    m.remove("execution_time");
                }
                e
            })
            .collect()
    };
    let elements = vec![of("a"), of("b")];
    (elements, reused(&h), drafts(&h))
}

#[test]
fn a_batch_continuation_goes_on_from_the_tokens_delivered() {
    let (plain, plain_reused, _) = batch(0);
    let (drafted, drafted_reused, (_, confirmed)) = batch(8);
    assert!(confirmed > 0);
    // The same elements: PROGRESS one token each (a step that gave a
    // prompt several tokens sends several frames), COMPLETE texts, and
    // continuations that start where the last payload's text ended.
    assert_eq!(drafted, plain);
    let progress = drafted[0]
        .iter()
        .filter(|e| e["type"] == "PROGRESS")
        .count();
    assert_eq!(progress, 7 + 11 + 5);
    // Each continuation took its kept blocks: the tokens the scheduler kept
    // are exactly those delivered, not the ones a step gave past the end.
    assert_eq!(drafted_reused, plain_reused);
    assert_eq!(drafted_reused.len(), 4, "{drafted_reused:?}");
}

#[test]
fn a_batch_that_ends_at_a_confirmed_end_of_sequence_continues_from_it() {
    // The script ends each round with an end-of-sequence token (byte 0).
    // The second payload's history holds the first one's end, so prompt
    // lookup drafts through it: the step confirms the end and gives tokens
    // after it, which the kept sequence must not keep.
    let run = |draft_tokens: u32| {
        let mut h = Harness::new(config(draft_tokens), "abcdefg\0", 3);
        let c = h.open(1, Dialect::Batch);
        let payload = json!({
            "prompts": [{"request_id": "a", "prompt": "bcdefg"}],
            "generation_config": {"max_new_tokens": 30},
        });
        for _ in 0..3 {
            h.send(c, payload.clone());
            h.run(200);
        }
        let completes: Vec<Value> = h
            .received(c)
            .iter()
            .flat_map(|f| f.as_array().cloned().unwrap_or_default())
            .filter(|e| e["type"] == "COMPLETE")
            .map(|e| json!([e["text"], e["is_eos"], e["new_tokens_count"]]))
            .collect();
        (completes, reused(&h), drafts(&h))
    };
    let (plain, plain_reused, _) = run(0);
    let (drafted, drafted_reused, (_, confirmed)) = run(8);
    assert!(confirmed > 0);
    assert_eq!(drafted, plain);
    assert_eq!(plain[1], json!(["abcdefg", true, 8]), "{plain:?}");
    assert_eq!(drafted_reused, plain_reused);
    assert_eq!(
        drafted_reused.len(),
        2,
        "both continuations kept their blocks"
    );
}
