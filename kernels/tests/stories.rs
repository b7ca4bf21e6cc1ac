//! The real stories260K checkpoint against its golden reference outputs.

mod common;

use common::*;
use tokenwire_core::{SeqId, StepPlan, TokenId};
use tokenwire_kernels::{Engine, EngineOptions};

fn engine() -> Option<(Engine, serde_json::Value)> {
    let dir = stories_dir();
    let engine = Engine::load(&dir, &EngineOptions::default()).expect("stories260K loads");
    Some((engine, reference(&dir)))
}

/// Greedy decoding through `Engine::step`, one token per step after the prompt.
fn greedy(engine: &mut Engine, prompt: &[TokenId], n: usize, stop: &[TokenId]) -> Vec<TokenId> {
    let bs = engine.model_info().block_size as usize;
    let table: Vec<u32> = (0..(prompt.len() + n).div_ceil(bs) as u32).collect();
    let mut out = Vec::new();
    let mut feed = prompt.to_vec();
    let mut pos = 0;
    for step in 0..n as u64 {
        let done = engine
            .step(&plan(step, vec![seq_step(1, &feed, pos, &table, true)]))
            .expect("step");
        pos += feed.len() as u32;
        let tok = done.results[0].token;
        out.push(tok);
        if stop.contains(&tok) {
            break;
        }
        feed = vec![tok];
    }
    out
}

#[test]
fn model_info_describes_stories260k() {
    let Some((engine, _)) = engine() else { return };
    let info = engine.model_info();
    assert_eq!(info.name, "stories260K");
    assert_eq!(info.version, "stories260K");
    assert_eq!(info.context_len, 512);
    assert_eq!(info.vocab_size, 512);
    assert_eq!(info.eos_ids, vec![2, 1]);
    assert_eq!(info.dtype, "f32");
    assert_eq!(info.block_size, 16);
    assert_eq!(info.num_blocks, 128);
}

#[test]
fn greedy_64_tokens_and_first_logits_match_reference() {
    let Some((mut engine, r)) = engine() else {
        return;
    };
    let prompt = engine
        .codec()
        .encode(r["prompt"].as_str().expect("prompt"), true)
        .expect("encode");
    assert_eq!(prompt, ids(&r["prompt_ids"]));
    let want = ids(&r["greedy_ids"]);
    assert_eq!(want.len(), 64);

    // First step alone, to check the logits.
    let table: Vec<u32> = (0..5).collect();
    engine
        .step(&plan(1, vec![seq_step(7, &prompt, 0, &table, true)]))
        .expect("prefill");
    let logits = engine.last_logits().next().expect("row").to_vec();
    let mut worst = 0.0f32;
    for top in r["first_step_top5"].as_array().expect("top5") {
        let id = top["id"].as_u64().expect("id") as usize;
        let want = top["logit"].as_f64().expect("logit") as f32;
        worst = worst.max((logits[id] - want).abs());
        assert!(
            (logits[id] - want).abs() < 1e-3,
            "logit[{id}] = {}, reference {want}",
            logits[id]
        );
    }
    eprintln!("first-step top-5 logits: max |diff| vs REFERENCE = {worst:e}");
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top5: Vec<u64> = order[..5].iter().map(|&i| i as u64).collect();
    let want5: Vec<u64> = r["first_step_top5"]
        .as_array()
        .expect("top5")
        .iter()
        .map(|t| t["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(top5, want5);
    engine
        .step(&StepPlan {
            step_id: 2,
            free: vec![SeqId(7)],
            ..Default::default()
        })
        .expect("free");

    let got = greedy(&mut engine, &prompt, 64, &[]);
    assert_eq!(got, want);
    assert_eq!(
        engine.codec().decode(&got),
        r["greedy_text"].as_str().expect("text")
    );
}

#[test]
fn bos_only_256_steps_match_reference() {
    let Some((mut engine, r)) = engine() else {
        return;
    };
    let want = ids(&r["bos_only_greedy_ids"]);
    let got = greedy(&mut engine, &[1], 256, &[1, 2]);
    assert!(!got.is_empty());
    assert_eq!(got[..], want[..got.len()]);
    assert_eq!(got.len(), want.len(), "the reference run has no stop token");
}

#[test]
fn generate_greedy_helper_agrees() {
    let Some((mut engine, r)) = engine() else {
        return;
    };
    let got = engine
        .generate_greedy(&ids(&r["prompt_ids"]), 64, &[])
        .expect("generate");
    assert_eq!(got, ids(&r["greedy_ids"]));
}

#[test]
fn tokenizer_cases_round_trip() {
    let Some((engine, r)) = engine() else { return };
    let codec = engine.codec();
    let cases = r["tokenizer_cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        assert_eq!(codec.encode(text, false).expect("encode"), want, "{text:?}");
        let mut with_bos = vec![1];
        with_bos.extend(&want);
        assert_eq!(
            codec.encode(text, true).expect("encode"),
            with_bos,
            "{text:?}"
        );
        if case["decode_roundtrip"].as_bool() == Some(true) {
            assert_eq!(codec.decode(&with_bos), text, "{text:?}");
        }
    }
    assert_eq!(codec.token_text(378), " time");
    assert_eq!(codec.token_text(13), "\n");
    assert_eq!(codec.decode(&[1, 2]), "");
    assert_eq!(
        codec.render_chat(&[
            tokenwire_core::ChatMessage::new(tokenwire_core::Role::User, "a"),
            tokenwire_core::ChatMessage::new(tokenwire_core::Role::User, "b")
        ]),
        Ok("a\nb".into()),
        "no chat template: contents joined by newline"
    );
}

#[test]
fn batched_chunked_and_shuffled_parity() {
    let Some((mut engine, _)) = engine() else {
        return;
    };
    let dir = stories_dir();
    let mut alone = Engine::load(&dir, &EngineOptions::default()).expect("load");
    let codec = engine.codec();
    let texts = [
        "Once upon a time, there was a little girl named Lily. She loved to play.",
        "The cat sat on the mat and looked at the big red ball in the garden all day long.",
        "Tom had a dog.",
        "One day, a bird flew over the tree and sang a happy song.",
    ];
    let toks: Vec<Vec<TokenId>> = texts
        .iter()
        .map(|t| codec.encode(t, true).expect("encode"))
        .collect();
    batched_parity(&mut engine, &mut alone, &toks, 1e-4);
}

#[test]
fn the_built_in_model_is_the_repositorys_stories260k_bit_for_bit() {
    // `tokenwire serve` without `--model` serves the copy built into the
    // binary: it must be this directory's model, read in place.
    let dir = stories_dir();
    let mut from_dir = Engine::load(&dir, &EngineOptions::default()).expect("directory loads");
    let mut built_in = Engine::builtin(&EngineOptions::default()).expect("built-in loads");
    assert_eq!(built_in.model_info(), from_dir.model_info());
    assert!(
        built_in.model().weights().matrices().all(|m| m.is_mapped()),
        "the built-in weights are read in place, not copied"
    );
    let r = reference(&dir);
    let prompt = built_in
        .codec()
        .encode(r["prompt"].as_str().expect("prompt"), true)
        .expect("encode");
    assert_eq!(prompt, ids(&r["prompt_ids"]));
    let a = logits_alone(&mut built_in, &prompt);
    let b = logits_alone(&mut from_dir, &prompt);
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "same logits"
    );
    let eos = built_in.model_info().eos_ids;
    assert_eq!(
        greedy(&mut built_in, &prompt, 64, &eos),
        ids(&r["greedy_ids"])
    );
}

#[test]
fn loading_reports_its_progress_in_order_up_to_done() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<(f32, String)>>> = Arc::default();
    let sink = seen.clone();
    let opts = EngineOptions {
        progress: Some(tokenwire_kernels::LoadProgress::new(move |f, what| {
            sink.lock().expect("lock").push((f, what.to_owned()))
        })),
        ..EngineOptions::default()
    };
    Engine::load(&stories_dir(), &opts).expect("loads");
    let seen = seen.lock().expect("lock");
    assert!(seen.len() >= 4, "{seen:?}");
    assert_eq!(seen[0], (0.0, "reading the model's files".to_owned()));
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "never backwards: {seen:?}"
    );
    assert_eq!(seen.last().expect("last"), &(1.0, "loaded".to_owned()));
    assert!(
        seen.iter().any(|(_, w)| w == "building the tokenizer"),
        "{seen:?}"
    );
}
