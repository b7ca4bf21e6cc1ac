//! The core's beam search machine (`tokenwire_core::gen::beam`) on the real
//! stories260K model against Hugging Face transformers' `generate(num_beams,
//! length_penalty, early_stopping)`: the goldens in
//! `tests/goldens/stories260k_beams.json` (made by `beam_goldens.py` beside
//! them; 24 cases, most of which differ from greedy decoding). Each beam's
//! log-probabilities come from the CPU engine's logits for its whole token
//! sequence, so this checks the search's choices, token for token, apart from
//! how a server shares the beams' KV cache.

mod common;

use std::collections::HashMap;

use common::*;
use tokenwire_core::gen::beam::{BeamConfig, BeamSearch, EarlyStopping};
use tokenwire_core::TokenId;
use tokenwire_kernels::{log_softmax, Engine, EngineOptions};

fn goldens() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/goldens/stories260k_beams.json"
    );
    let text = std::fs::read_to_string(path).expect("beam goldens readable");
    serde_json::from_str(&text).expect("beam goldens are JSON")
}

/// The best `k` (token, log-probability) pairs of the next token after `tokens`.
fn candidates(
    engine: &mut Engine,
    cache: &mut HashMap<Vec<TokenId>, Vec<(TokenId, f32)>>,
    tokens: &[TokenId],
    k: usize,
) -> Vec<(TokenId, f32)> {
    if let Some(c) = cache.get(tokens) {
        return c.clone();
    }
    let lp = log_softmax(&logits_alone(engine, tokens));
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    let top: Vec<(TokenId, f32)> = order
        .into_iter()
        .take(k)
        .map(|t| (t as TokenId, lp[t]))
        .collect();
    cache.insert(tokens.to_vec(), top.clone());
    top
}

#[test]
fn beam_search_matches_transformers_generate_token_for_token() {
    let dir = stories_dir();
    let mut engine = Engine::load(&dir, &EngineOptions::default()).expect("stories260K loads");
    let eos = engine.model_info().eos_ids;
    let g = goldens();
    let cases = g["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30);
    let mut cache = HashMap::new();
    let mut differ_from_greedy = 0;
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let encoded = engine
            .codec()
            .encode(case["prompt"].as_str().expect("prompt"), true)
            .expect("encode");
        assert_eq!(encoded, prompt, "the tokenizer agrees on the prompt");
        let early_stopping = match &case["early_stopping"] {
            serde_json::Value::Bool(true) => EarlyStopping::Yes,
            serde_json::Value::Bool(false) => EarlyStopping::No,
            _ => EarlyStopping::Never,
        };
        let cfg = BeamConfig {
            num_beams: case["num_beams"].as_u64().expect("num_beams") as usize,
            length_penalty: case["length_penalty"].as_f64().expect("length_penalty") as f32,
            early_stopping,
            max_new_tokens: case["max_new_tokens"].as_u64().expect("max") as usize,
            // The model's EOS ids, or those and "." (see beam_goldens.py).
            eos_ids: ids(&case["eos_ids"]),
        };
        let mut search = BeamSearch::new(cfg.clone());
        let k = search.candidates_per_beam();
        while !search.is_done() {
            let per_beam: Vec<Vec<(TokenId, f32)>> = search
                .running()
                .iter()
                .map(|b| {
                    let mut t = prompt.clone();
                    t.extend_from_slice(&b.tokens);
                    candidates(&mut engine, &mut cache, &t, k)
                })
                .collect();
            search.step(&per_beam);
        }
        assert!(
            cfg.eos_ids.starts_with(&eos),
            "the model's EOS ids come first"
        );
        let want = ids(&case["ids"]);
        assert_eq!(
            search.best(),
            want.as_slice(),
            "{:?} with {cfg:?}",
            case["prompt"]
        );
        if !ids(&case["greedy_ids"]).starts_with(&want) {
            differ_from_greedy += 1;
        }
    }
    assert!(
        differ_from_greedy * 2 >= cases.len(),
        "the goldens exercise beams that greedy decoding would not find ({differ_from_greedy})"
    );
}
