//! Greedy generation with timings.
//!
//! ```text
//! cargo run --release -p tokenwire-kernels --example generate -- [MODEL_DIR|tiny] [PROMPT] [N]
//! ```
//!
//! MODEL_DIR defaults to `models/stories260K`; `tiny` uses the built-in
//! random model. Prints the text, then prefill time and decode tokens/s for a
//! single stream (one token per `Engine::step`).

use std::path::PathBuf;
use std::time::Instant;

use tokenwire_core::{SamplingParams, SeqId, SeqStep, StepPlan};
use tokenwire_kernels::{Engine, EngineOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K").into());
    let prompt = args.next().unwrap_or_else(|| "Once upon a time".into());
    let n: usize = args.next().map_or(Ok(200), |s| s.parse())?;

    let t0 = Instant::now();
    let mut engine = if model == "tiny" {
        Engine::tiny(1)
    } else {
        Engine::load(&PathBuf::from(&model), &EngineOptions::default())?
    };
    let load = t0.elapsed();
    let info = engine.model_info();
    let codec = engine.codec();
    let ids = codec.encode(&prompt, true)?;
    let room = (info.context_len as usize).checked_sub(ids.len() + 1);
    let Some(room) = room else {
        return Err(format!("prompt of {} tokens does not fit the context", ids.len()).into());
    };
    let n = n.min(room + 1);
    let bs = info.block_size as usize;
    let table: Vec<u32> = (0..(ids.len() + n).div_ceil(bs) as u32).collect();

    let mut out = Vec::with_capacity(n);
    let mut feed = ids.clone();
    let mut pos = 0u32;
    let mut prefill = None;
    let t1 = Instant::now();
    for step in 0..n as u64 {
        let plan = StepPlan {
            step_id: step,
            seqs: vec![SeqStep {
                seq: SeqId(1),
                tokens: std::mem::take(&mut feed),
                start_pos: pos,
                block_table: table.clone(),
                sampling: SamplingParams::greedy(),
                sample: true,
                logprobs: None,
                cached_prefix: Vec::new(),
                allowed: None,
                draft: Vec::new(),
                embed: None,
                prompt_logprobs: None,
            }],
            ..Default::default()
        };
        let done = engine.step(&plan).map_err(|f| format!("{f:?}"))?;
        pos += plan.seqs[0].tokens.len() as u32;
        if prefill.is_none() {
            prefill = Some(t1.elapsed());
        }
        let tok = done.results[0].token;
        out.push(tok);
        feed.push(tok);
    }
    let total = t1.elapsed();
    let prefill = prefill.unwrap_or_default();
    let decode = total - prefill;
    println!("{}{}", prompt, codec.decode(&out));
    eprintln!(
        "{}: load {:.1} ms, prefill {} tokens {:.3} ms, decode {} tokens {:.1} ms = {:.0} tokens/s ({:.1} us/token)",
        info.name,
        load.as_secs_f64() * 1e3,
        ids.len(),
        prefill.as_secs_f64() * 1e3,
        n.saturating_sub(1),
        decode.as_secs_f64() * 1e3,
        n.saturating_sub(1) as f64 / decode.as_secs_f64(),
        decode.as_secs_f64() * 1e6 / n.saturating_sub(1).max(1) as f64,
    );
    Ok(())
}
