//! The `batch` dialect against PROTOCOLS.md, driven through a Host with a
//! scripted engine and virtual time (no sockets): the event arrays and their
//! order, payload validation, duplicates, queued payloads, generation_config
//! defaults and greedy decoding, and the continue-generation cache (also
//! after its entry was evicted).

use serde_json::{json, Value};
use tokenwire_core::dialect::batch::{GenerationDefaults, BEAMS_WITH_STREAMER};
use tokenwire_core::testing::{script_text, tiny_model_info, Harness};
use tokenwire_core::{ConnId, Dialect, Duration, Event, HostConfig, Output};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness_with(config: HostConfig) -> (Harness, ConnId) {
    let mut h = Harness::new(config, SCRIPT, 1);
    let c = h.open(1, Dialect::Batch);
    (h, c)
}

fn harness() -> (Harness, ConnId) {
    harness_with(HostConfig::default())
}

fn payload(prompts: &[(&str, &str)], extra: Value) -> Value {
    let mut p = json!({
        "prompts": prompts.iter().map(|(id, p)| json!({"request_id": id, "prompt": p})).collect::<Vec<_>>(),
        "generation_config": {"max_new_tokens": 6},
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut p, extra) {
        for (k, v) in e {
            m.insert(k, v);
        }
    }
    p
}

/// Each frame as (type of its elements, their request ids); every frame must
/// be a non-empty array of one type.
fn frames(h: &Harness, c: ConnId) -> Vec<(String, Vec<Value>)> {
    h.received(c)
        .iter()
        .map(|f| {
            let items = f.as_array().expect("every frame is an array");
            assert!(!items.is_empty());
            let kind = items[0]["type"].as_str().unwrap_or("").to_string();
            assert!(items.iter().all(|i| i["type"] == kind.as_str()), "{f}");
            (
                kind,
                items.iter().map(|i| i["request_id"].clone()).collect(),
            )
        })
        .collect()
}

fn elements(h: &Harness, c: ConnId, kind: &str, rid: &str) -> Vec<Value> {
    h.received(c)
        .iter()
        .flat_map(|f| f.as_array().cloned().unwrap_or_default())
        .filter(|e| e["type"] == kind && e["request_id"] == rid)
        .collect()
}

/// Prompt tokens the Host continued from kept KV blocks, one entry per
/// generation that reused them.
fn reused(h: &Harness) -> Vec<u32> {
    h.others
        .iter()
        .filter_map(|o| match o {
            Output::Event(Event::PromptTokensReused { count }) => Some(*count),
            _ => None,
        })
        .collect()
}

fn complete_text(h: &Harness, c: ConnId, rid: &str) -> Vec<String> {
    elements(h, c, "COMPLETE", rid)
        .iter()
        .map(|e| e["text"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_payload_runs_as_one_batch_with_one_progress_frame_per_step() {
    let (mut h, c) = harness();
    h.send(c, payload(&[("a", "hi"), ("b", "hey")], json!({})));
    h.run(50);
    let f = frames(&h, c);
    let ab = vec![json!("a"), json!("b")];
    assert_eq!(f[0], ("ACCEPTED".to_string(), ab.clone()));
    assert_eq!(
        f[1],
        ("STARTED".to_string(), ab.clone()),
        "admitted together"
    );
    assert_eq!(f[2], ("INITIALIZED".to_string(), ab.clone()));
    let progress: Vec<_> = f.iter().filter(|(k, _)| k == "PROGRESS").collect();
    assert_eq!(progress.len(), 6, "one frame per step");
    assert!(progress.iter().all(|(_, ids)| *ids == ab), "payload order");
    assert_eq!(f.last().cloned(), Some(("COMPLETE".to_string(), ab)));
    // "hi" is 3 tokens with BOS, "hey" 4: each continues the script from there.
    assert_eq!(complete_text(&h, c, "a"), vec![script_text(SCRIPT, 3, 6)]);
    assert_eq!(complete_text(&h, c, "b"), vec![script_text(SCRIPT, 4, 6)]);
    let streamed: String = elements(&h, c, "PROGRESS", "a")
        .iter()
        .filter_map(|e| e["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, script_text(SCRIPT, 3, 6));
    let done = &elements(&h, c, "COMPLETE", "a")[0];
    assert_eq!(done["is_eos"], false);
    assert_eq!(done["new_tokens_count"], 6);
    assert!(
        done["execution_time"].as_f64().is_some_and(|t| t > 0.0),
        "{done}"
    );
    assert_eq!(elements(&h, c, "INITIALIZED", "a")[0]["text"], "");
}

#[test]
fn only_new_tokens_false_returns_the_prompt_and_stream_false_sends_no_progress() {
    let (mut h, c) = harness();
    h.send(
        c,
        payload(
            &[("a", "hi")],
            json!({"only_new_tokens": false, "stream_response": false}),
        ),
    );
    h.run(50);
    let kinds: Vec<String> = frames(&h, c).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        vec!["ACCEPTED", "STARTED", "INITIALIZED", "COMPLETE"]
    );
    assert_eq!(elements(&h, c, "INITIALIZED", "a")[0]["text"], "hi");
    assert_eq!(
        complete_text(&h, c, "a"),
        vec![format!("hi{}", script_text(SCRIPT, 3, 6))]
    );
}

#[test]
fn a_payload_that_fails_as_a_whole_gets_one_error_per_prompt_and_nothing_runs() {
    let (mut h, c) = harness();
    let cases = [
        ("{nope".to_string(), vec![Value::Null], "JSON"),
        (json!({}).to_string(), vec![Value::Null], "prompts"),
        (
            json!({"prompts": []}).to_string(),
            vec![Value::Null],
            "prompts",
        ),
        (
            json!({"prompts": [{"request_id": "a", "prompt": "x"}, {"request_id": "b"}]})
                .to_string(),
            vec![json!("a"), json!("b")],
            "prompts[1].prompt",
        ),
        (
            payload(
                &[("a", "x"), ("b", "y")],
                json!({"generation_config": {"temperature": 9}}),
            )
            .to_string(),
            vec![json!("a"), json!("b")],
            "generation_config.temperature",
        ),
        (
            payload(
                &[("a", "x")],
                json!({"generation_config": {"num_beams": 0}}),
            )
            .to_string(),
            vec![json!("a")],
            "generation_config.num_beams",
        ),
        (
            payload(&[("a", "x")], json!({"only_new_tokens": "yes"})).to_string(),
            vec![json!("a")],
            "only_new_tokens",
        ),
        (
            // Finite as JSON reads it, not as the f32 the search uses.
            payload(
                &[("a", "x")],
                json!({"stream_response": false,
                       "generation_config": {"num_beams": 2, "length_penalty": 1e39}}),
            )
            .to_string(),
            vec![json!("a")],
            "generation_config.length_penalty",
        ),
        (
            payload(
                &[("a", "x"), ("b", "y")],
                json!({"generation_config": {"num_beams": 2}}),
            )
            .to_string(),
            vec![json!("a"), json!("b")],
            BEAMS_WITH_STREAMER,
        ),
    ];
    for (frame, ids, needle) in cases {
        let before = h.received(c).len();
        h.send_raw(c, &frame);
        let got = &h.received(c)[before..];
        assert_eq!(got.len(), 1, "{frame}: {got:?}");
        let items = got[0].as_array().expect("array");
        let got_ids: Vec<Value> = items.iter().map(|e| e["request_id"].clone()).collect();
        assert_eq!(got_ids, ids, "{frame}");
        for e in items {
            assert_eq!(e["type"], "ERROR");
            assert!(
                e["error"].as_str().unwrap_or("").contains(needle),
                "{frame}: {e}"
            );
        }
    }
    h.run(20);
    assert_eq!(h.steps_run, 0, "nothing was queued");
    assert!(h.closes.is_empty());
}

#[test]
fn a_duplicate_id_gets_one_error_none_of_its_prompts_run_and_the_others_run() {
    let (mut h, c) = harness();
    h.send(
        c,
        payload(
            &[("a", "hi"), ("b", "x"), ("a", "again"), ("a", "thrice")],
            json!({}),
        ),
    );
    h.run(50);
    let f = frames(&h, c);
    assert_eq!(f[0], ("ACCEPTED".to_string(), vec![json!("b")]));
    assert_eq!(f[1].0, "ERROR");
    assert_eq!(f[1].1, vec![json!("a")], "one ERROR for the id");
    assert!(
        complete_text(&h, c, "a").is_empty(),
        "an ambiguous id never also completes"
    );
    assert_eq!(elements(&h, c, "ERROR", "a").len(), 1);
    assert_eq!(complete_text(&h, c, "b").len(), 1);
}

#[test]
fn payloads_past_the_bounds_are_refused_and_the_connection_stays() {
    let (mut h, c) = harness_with(HostConfig {
        batch_max_prompts: 3,
        batch_max_payloads: 2,
        ..HostConfig::default()
    });
    // Too many prompts: one ERROR with a null id, not one per prompt.
    let many: Vec<(String, String)> = (0..4).map(|i| (i.to_string(), "p".to_string())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    h.send(c, payload(&many, json!({})));
    let f = frames(&h, c);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0], ("ERROR".to_string(), vec![Value::Null]));
    let e = h.received(c)[0][0]["error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(e.contains("4 prompts") && e.contains("3"), "{e}");
    // Two payloads queue; the third is refused whole while they run.
    h.send(c, payload(&[("a", "x")], json!({})));
    h.send(c, payload(&[("b", "x")], json!({})));
    h.send(c, payload(&[("c", "x")], json!({})));
    let refused = elements(&h, c, "ERROR", "c");
    assert_eq!(refused.len(), 1);
    assert!(refused[0]["error"]
        .as_str()
        .is_some_and(|e| e.contains("2 payloads")));
    h.run(100);
    assert_eq!(complete_text(&h, c, "a").len(), 1);
    assert_eq!(complete_text(&h, c, "b").len(), 1);
    // Room again: the connection was kept and takes the next one.
    h.send(c, payload(&[("c", "x")], json!({})));
    h.run(100);
    assert_eq!(complete_text(&h, c, "c").len(), 1);
    assert!(h.closes.is_empty());
}

#[test]
fn a_prompt_that_cannot_fit_gets_its_error_and_the_others_run() {
    let (mut h, c) = harness();
    let long = "x".repeat(600);
    h.send(c, payload(&[("a", "hi"), ("long", &long)], json!({})));
    h.run(50);
    let e = elements(&h, c, "ERROR", "long");
    assert_eq!(e.len(), 1);
    assert!(e[0]["error"]
        .as_str()
        .unwrap_or("")
        .contains("context length"));
    assert_eq!(complete_text(&h, c, "a"), vec![script_text(SCRIPT, 3, 6)]);
}

#[test]
fn a_prompt_that_exactly_fills_the_context_runs_and_one_token_more_does_not() {
    // 512 positions: BOS, 505 prompt bytes and 6 new tokens fill them.
    let (mut h, c) = harness();
    let fits = "x".repeat(505);
    let over = "x".repeat(506);
    h.send(c, payload(&[("fits", &fits), ("over", &over)], json!({})));
    h.run(50);
    assert_eq!(complete_text(&h, c, "fits").len(), 1, "the exact fit runs");
    assert!(elements(&h, c, "ERROR", "fits").is_empty());
    let e = elements(&h, c, "ERROR", "over");
    assert_eq!(e.len(), 1);
    assert!(e[0]["error"]
        .as_str()
        .unwrap_or("")
        .contains("context length"));
}

#[test]
fn queued_payloads_run_in_arrival_order() {
    let (mut h, c) = harness();
    h.send(c, payload(&[("p1", "hi")], json!({})));
    h.send(c, payload(&[("p2", "hi")], json!({})));
    h.send(c, payload(&[("p3", "hi")], json!({})));
    h.run(100);
    let started: Vec<Value> = frames(&h, c)
        .into_iter()
        .filter(|(k, _)| k == "STARTED")
        .flat_map(|(_, ids)| ids)
        .collect();
    assert_eq!(started, vec![json!("p1"), json!("p2"), json!("p3")]);
    for id in ["p1", "p2", "p3"] {
        assert_eq!(complete_text(&h, c, id), vec![script_text(SCRIPT, 3, 6)]);
    }
}

#[test]
fn generation_config_falls_back_to_the_servers_defaults_and_do_sample_false_is_greedy() {
    let (mut h, c) = harness_with(HostConfig {
        batch_defaults: GenerationDefaults {
            max_new_tokens: 4,
            do_sample: true,
            temperature: 0.5,
            repetition_penalty: 1.3,
            ..GenerationDefaults::default()
        },
        ..HostConfig::default()
    });
    h.send(
        c,
        json!({"prompts": [{"request_id": "a", "prompt": "hi"}], "generation_config": {}}),
    );
    let plan = h.pending_step.clone().expect("a step");
    let s = &plan.seqs[0].sampling;
    assert_eq!(
        (s.temperature, s.top_k, s.repetition_penalty),
        (0.5, 50, 1.3)
    );
    h.run(50);
    assert_eq!(elements(&h, c, "COMPLETE", "a")[0]["new_tokens_count"], 4);
    h.send(
        c,
        json!({"prompts": [{"request_id": "b", "prompt": "hi"}],
               "generation_config": {"do_sample": false, "temperature": 1.5}}),
    );
    let plan = h.pending_step.clone().expect("a step");
    assert_eq!(plan.seqs[0].sampling.temperature, 0.0, "greedy");
}

#[test]
fn a_continued_batch_extends_each_sequence_exactly_even_after_eviction() {
    for capacity in [256usize, 1] {
        let (mut h, c) = harness_with(HostConfig {
            batch_cache_entries: capacity,
            ..HostConfig::default()
        });
        let first = payload(&[("a", "hi"), ("b", "hey")], json!({}));
        h.send(c, first.clone());
        h.run(50);
        // "hi" + 6 and "hey" + 6 tokens, each in one KV block kept.
        assert_eq!(h.host.stats().kv_blocks_kept, 2);
        if capacity == 1 {
            // Another batch pushes the first out of a one-entry cache (and
            // its blocks are freed at once)...
            h.send(c, payload(&[("z", "hi")], json!({})));
            h.run(50);
            assert_eq!(h.host.stats().kv_blocks_kept, 1, "only z's");
        }
        // ... and the same ids in the same order continue where they stopped
        // (prompts ignored), or start afresh from the prompts once evicted.
        let cont = payload(&[("a", "IGNORED"), ("b", "IGNORED")], json!({}));
        h.send(c, cont);
        h.run(50);
        let a = complete_text(&h, c, "a");
        if capacity == 256 {
            assert_eq!(
                reused(&h),
                vec![3 + 6 - 1, 4 + 6 - 1],
                "both continued from their kept blocks, only the last token fed"
            );
            assert_eq!(
                a,
                vec![script_text(SCRIPT, 3, 6), script_text(SCRIPT, 9, 6)]
            );
            assert_eq!(
                complete_text(&h, c, "b")[1],
                script_text(SCRIPT, 10, 6),
                "each sequence from its own end"
            );
            // The whole text from the original prompt on.
            h.send(
                c,
                payload(&[("a", "x"), ("b", "y")], json!({"only_new_tokens": false})),
            );
            h.run(50);
            assert_eq!(
                complete_text(&h, c, "a")[2],
                format!("hi{}", script_text(SCRIPT, 3, 18))
            );
            // Another order is another key: the prompts are used.
            h.send(c, payload(&[("b", "hi"), ("a", "hi")], json!({})));
            h.run(50);
            assert_eq!(complete_text(&h, c, "a")[3], script_text(SCRIPT, 3, 6));
        } else {
            assert_eq!(
                a[1],
                script_text(SCRIPT, 8, 6),
                "evicted: the prompt (7 bytes and BOS) is used"
            );
            assert!(reused(&h).is_empty(), "{:?}", reused(&h));
        }
    }
}

#[test]
fn kept_kv_blocks_are_the_first_freed_under_memory_pressure_and_then_recomputed() {
    let mut info = tiny_model_info();
    info.num_blocks = 4; // 64 positions
    let mut h = Harness::with_info(HostConfig::default(), info, SCRIPT, 1);
    let c = h.open(1, Dialect::Batch);
    h.send(c, payload(&[("a", "hi"), ("b", "hey")], json!({})));
    h.run(50);
    h.send(c, payload(&[("a", "-"), ("b", "-")], json!({})));
    h.run(50);
    assert_eq!(reused(&h), vec![8, 9]);
    // a (15 tokens) and b (16) keep a block each; z needs 43 positions,
    // three blocks: the oldest kept sequence (a's) is freed for it.
    let long = json!({"generation_config": {"max_new_tokens": 40}});
    h.send(c, payload(&[("z", "hi")], long));
    h.run(100);
    assert_eq!(complete_text(&h, c, "z"), vec![script_text(SCRIPT, 3, 40)]);
    // Continuing a and b: a is recomputed from its token ids; b frees z's
    // kept blocks for the copy of its partial block and continues from its own.
    h.send(c, payload(&[("a", "-"), ("b", "-")], json!({})));
    h.run(50);
    assert_eq!(
        reused(&h),
        vec![8, 9, 15],
        "only b's blocks were still kept"
    );
    assert_eq!(
        complete_text(&h, c, "a"),
        vec![
            script_text(SCRIPT, 3, 6),
            script_text(SCRIPT, 9, 6),
            script_text(SCRIPT, 15, 6)
        ],
        "eviction changes time, never tokens"
    );
    assert_eq!(complete_text(&h, c, "b")[2], script_text(SCRIPT, 16, 6));
    h.host.check_invariants().expect("scheduler invariants");
}

#[test]
fn beams_fork_from_their_parents_sharing_kv_blocks_and_end_with_one_complete() {
    let (mut h, c) = harness();
    h.send(
        c,
        payload(
            &[("a", "a prompt of twenty b")],
            json!({"stream_response": false,
                   "generation_config": {"num_beams": 3, "max_new_tokens": 8}}),
        ),
    );
    let mut forks = 0;
    let mut copies = 0;
    for _ in 0..40 {
        if let Some(plan) = &h.pending_step {
            forks += plan.forks.len();
            copies += plan.copy_blocks.len();
        }
        if !h.step() {
            break;
        }
    }
    let done = elements(&h, c, "COMPLETE", "a");
    assert_eq!(done.len(), 1, "{:?}", h.received(c));
    assert_eq!(done[0]["new_tokens_count"], 8);
    assert_eq!(done[0]["text"].as_str().map(str::len), Some(8));
    // Ended by max_new_tokens, not by an end of sequence.
    assert_eq!(done[0]["is_eos"], false, "{}", done[0]);
    // Three beams forked from their parents after each of the first seven
    // rounds; the eighth ends the search.
    assert_eq!(forks, 3 * 7, "{forks} forks");
    assert!(copies > 0, "partial blocks are copied, full ones shared");
    let st = h.host.stats();
    assert_eq!(st.running + st.queued, 0, "every beam ended");
    assert_eq!(st.kv_blocks_used, 0, "and gave its blocks back");
    assert!(elements(&h, c, "PROGRESS", "a").is_empty());
    // Beams with streaming, beam sampling and a repetition penalty are refused.
    for (cfg, needle) in [
        (json!({"num_beams": 2}), "streamer"),
        (
            json!({"num_beams": 2, "do_sample": true, "temperature": 1}),
            "beam sampling",
        ),
        (
            json!({"num_beams": 2, "repetition_penalty": 1.2}),
            "repetition_penalty",
        ),
        (json!({"num_beams": 30}), "num_beams"),
        (
            json!({"num_beams": 2, "early_stopping": "sometimes"}),
            "early_stopping",
        ),
    ] {
        let stream = cfg["num_beams"] == 2 && needle == "streamer";
        h.send(
            c,
            payload(
                &[("z", "x")],
                json!({"stream_response": stream, "generation_config": cfg}),
            ),
        );
        let e = elements(&h, c, "ERROR", "z");
        let last = e.last().and_then(|e| e["error"].as_str()).unwrap_or("");
        assert!(last.contains(needle), "{needle}: {last}");
    }
}

#[test]
fn a_shutdown_answers_every_prompt_that_did_not_finish() {
    let (mut h, c) = harness_with(HostConfig {
        shutdown_grace: Duration::from_secs(1),
        ..HostConfig::default()
    });
    h.send(
        c,
        payload(
            &[("run", "hi")],
            json!({"generation_config": {"max_new_tokens": 400}}),
        ),
    );
    // Queued behind the first until it is admitted; then it runs too.
    h.send(c, payload(&[("q1", "hi"), ("q2", "hey")], json!({})));
    h.run(2);
    h.input(tokenwire_core::Input::Shutdown);
    h.send(c, payload(&[("late", "hi")], json!({})));
    for _ in 0..300 {
        if !h.step() {
            break;
        }
    }
    h.advance(Duration::from_secs(2));
    // A payload whose prompts are still being tokenized when the grace ends.
    let (mut h2, c2) = harness_with(HostConfig {
        shutdown_grace: Duration::from_secs(1),
        ..HostConfig::default()
    });
    h2.auto_text = false;
    h2.send(c2, payload(&[("t1", "hi"), ("t2", "hey")], json!({})));
    h2.input(tokenwire_core::Input::Shutdown);
    h2.advance(Duration::from_secs(2));
    for id in ["t1", "t2"] {
        assert_eq!(
            elements(&h2, c2, "ERROR", id).len(),
            1,
            "{id}: {:?}",
            h2.received(c2)
        );
    }
    assert_eq!(h2.closes.get(&c2).map(|x| x.0), Some(1001));
    for id in ["run", "q1", "q2", "late"] {
        let ends = elements(&h, c, "COMPLETE", id).len() + elements(&h, c, "ERROR", id).len();
        assert_eq!(ends, 1, "{id}: {:?}", h.received(c));
    }
    assert_eq!(h.closes.get(&c).map(|x| x.0), Some(1001));
}

#[test]
fn a_beam_waiting_for_the_rest_of_its_round_is_not_timed_out_like_a_client_pause() {
    // One sequence per step: each round's beams run one after another, the
    // first waiting a whole step for the second, longer than a pause may last.
    let (mut h, c) = harness_with(HostConfig {
        max_running_seqs: 1,
        pause_timeout: Duration::from_millis(5),
        ..HostConfig::default()
    });
    h.send(
        c,
        payload(
            &[("a", "hi")],
            json!({"stream_response": false,
                   "generation_config": {"num_beams": 2, "max_new_tokens": 6}}),
        ),
    );
    h.run(100);
    let done = elements(&h, c, "COMPLETE", "a");
    assert_eq!(done.len(), 1, "{:?}", h.received(c));
    assert_eq!(done[0]["new_tokens_count"], 6);
    assert!(elements(&h, c, "ERROR", "a").is_empty());
    let st = h.host.stats();
    assert_eq!((st.running, st.queued, st.generations), (0, 0, 0));
}

#[test]
fn another_connection_naming_the_same_ids_never_sees_the_first_ones_text() {
    let (mut h, alice) = harness();
    h.send(alice, payload(&[("1", "alice's secret")], json!({})));
    h.run(50);
    let kept = h.host.stats().kv_blocks_kept;
    assert_eq!(kept, 2, "15 prompt and 6 new tokens");
    // The attack of the issue: the same id from another connection, asking
    // for the whole text from the original prompt on.
    let mallory = h.open(2, Dialect::Batch);
    h.send(
        mallory,
        payload(&[("1", "x")], json!({"only_new_tokens": false})),
    );
    h.run(50);
    let got = complete_text(&h, mallory, "1");
    assert_eq!(
        got,
        vec![format!("x{}", script_text(SCRIPT, 2, 6))],
        "mallory's own prompt, computed afresh"
    );
    assert!(reused(&h).is_empty(), "nothing of alice's was reused");
    // Alice still continues her own batch: mallory did not overwrite it.
    h.send(alice, payload(&[("1", "IGNORED")], json!({})));
    h.run(50);
    assert_eq!(
        complete_text(&h, alice, "1")[1],
        script_text(SCRIPT, 15 + 6, 6)
    );
    // A closed connection's entries go with it, blocks and all.
    h.input(tokenwire_core::Input::Closed { conn: alice });
    h.input(tokenwire_core::Input::Closed { conn: mallory });
    assert_eq!(h.host.stats().kv_blocks_kept, 0);
    assert_eq!(h.host.stats().kv_blocks_used, 0);
}

#[test]
fn the_host_wide_scope_shares_entries_as_the_source_does() {
    let (mut h, a) = harness_with(HostConfig {
        batch_cache_scope: tokenwire_core::config::CacheScope::Host,
        ..HostConfig::default()
    });
    h.send(a, payload(&[("1", "hi")], json!({})));
    h.run(50);
    let b = h.open(2, Dialect::Batch);
    h.send(b, payload(&[("1", "x")], json!({"only_new_tokens": false})));
    h.run(50);
    assert_eq!(
        complete_text(&h, b, "1"),
        vec![format!("hi{}", script_text(SCRIPT, 3, 12))],
        "trusted networks: any client continues any batch"
    );
}

/// A payload waits only until every prompt of the payloads before it is
/// admitted or over: a prompt refused before it started (its context
/// overflowed) does not hold the next payload back until the rest of its
/// own payload has finished.
#[test]
fn a_prompt_refused_before_it_started_does_not_hold_the_next_payload_back() {
    let (mut h, c) = harness();
    let long = "x".repeat(600);
    h.send(
        c,
        payload(
            &[("a", long.as_str()), ("b", "hi")],
            json!({"generation_config": {"max_new_tokens": 40}}),
        ),
    );
    h.send(c, payload(&[("c", "hi")], json!({})));
    h.run(200);
    let at = |kind: &str, rid: &str| {
        h.received(c).iter().position(|f| {
            f.as_array().is_some_and(|a| {
                a.iter()
                    .any(|e| e["type"] == kind && e["request_id"] == rid)
            })
        })
    };
    assert!(at("ERROR", "a").is_some(), "{:?}", h.received(c));
    let (started, b_done) = (at("STARTED", "c"), at("COMPLETE", "b"));
    assert!(
        started.is_some() && b_done.is_some() && started < b_done,
        "c started at frame {started:?}, b completed at {b_done:?}: {:?}",
        h.received(c)
    );
}
