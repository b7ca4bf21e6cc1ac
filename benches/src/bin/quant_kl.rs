//! `quant-kl`: how far the CPU engine's 8-bit-activation path strays from
//! its f32 path on real text, measured as llama.cpp measures its quants.
//!
//! ```text
//! quant-kl --gguf FILE --text FILE [--window 512] [--windows 8]
//!          [--ids-out FILE] [--ref-out FILE] [--kl-out FILE]
//! ```
//!
//! The text is tokenized by the file's own tokenizer and cut into `windows`
//! windows of `window` tokens, each evaluated from an empty context (all of
//! them together, one token per step, teacher-forced). The last half of each
//! window is scored, as `llama-perplexity --kl-divergence` scores its chunks:
//! each scored token has at least half a window of context. For every scored
//! position the f32 path's next-token distribution (the weights widened to
//! f32, `--cpu-activations f32`: the arithmetic of `transformers` on the
//! dequantized file) is the reference, and the 8-bit path (activations
//! quantized to 8 bits per block, the default) is judged against it:
//!
//! * mean KL divergence KL(f32 ‖ int8), with its standard error, and the
//!   99th percentile and largest;
//! * top-1 agreement: how often both choose the same most likely token;
//! * ln of the perplexity of the text's actual next tokens under each path.
//!
//! `--ids-out` writes the windows' token ids (JSON, a list per window) and
//! `--ref-out` the reference's log-probabilities of the scored positions
//! (little-endian f32, one vocabulary row per position, window by window),
//! so another engine can be judged against the same reference on the same
//! tokens (`benches/llama_cpp/kl.py`, for llama.cpp's 8-bit path), and
//! `--kl-out` the int8 path's KL divergence at each of them (little-endian
//! f64), so that engine's can be compared position by position.

use std::io::Write;
use std::path::PathBuf;

use tokenwire_core::engine::{SeqId, SeqStep, StepPlan};
use tokenwire_core::SamplingParams;
use tokenwire_kernels::{ActivationPrecision, Engine, EngineOptions};

const USAGE: &str = "quant-kl --gguf FILE --text FILE [--window 512] [--windows 8] \
                     [--ids-out FILE] [--ref-out FILE] [--kl-out FILE]";

struct Args {
    gguf: PathBuf,
    text: PathBuf,
    window: usize,
    windows: usize,
    ids_out: Option<PathBuf>,
    ref_out: Option<PathBuf>,
    kl_out: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        gguf: PathBuf::new(),
        text: PathBuf::new(),
        window: 512,
        windows: 8,
        ids_out: None,
        ref_out: None,
        kl_out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: {v:?} is not a count"))
        };
        match flag.as_str() {
            "--gguf" => a.gguf = value()?.into(),
            "--text" => a.text = value()?.into(),
            "--window" => a.window = number(value()?)?,
            "--windows" => a.windows = number(value()?)?,
            "--ids-out" => a.ids_out = Some(value()?.into()),
            "--ref-out" => a.ref_out = Some(value()?.into()),
            "--kl-out" => a.kl_out = Some(value()?.into()),
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
        }
    }
    if a.gguf.as_os_str().is_empty() || a.text.as_os_str().is_empty() {
        return Err(format!("--gguf and --text are required\n{USAGE}"));
    }
    if a.window < 4 || a.windows == 0 {
        return Err("--window must be at least 4 and --windows at least 1".into());
    }
    Ok(a)
}

/// `row` turned into log-probabilities, in place (f64 sums: a vocabulary of
/// 49,152 terms).
fn log_softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    for v in row.iter_mut() {
        *v = (*v as f64 - log_z) as f32;
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Runs every window through `engine`, one token of each per step, and
/// hands `each` the scored positions' log-probability rows in order
/// (window by window, position by position) with the token that follows.
fn evaluate(
    engine: &mut Engine,
    windows: &[Vec<u32>],
    mut each: impl FnMut(usize, &mut [f32], u32),
) -> Result<(), String> {
    let info = engine.model_info();
    let (bs, vocab) = (info.block_size as usize, info.vocab_size as usize);
    let len = windows[0].len();
    let per_seq = len.div_ceil(bs) as u32;
    if per_seq as u64 * windows.len() as u64 > info.num_blocks as u64 {
        return Err(format!(
            "{} windows of {len} tokens need more KV blocks than the pool's {}",
            windows.len(),
            info.num_blocks
        ));
    }
    let scored_from = len / 2;
    // Rows of one step, kept by window until they are handed on in order.
    let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); windows.len()];
    for pos in 0..len - 1 {
        let plan = StepPlan {
            step_id: pos as u64 + 1,
            seqs: windows
                .iter()
                .enumerate()
                .map(|(k, w)| SeqStep {
                    seq: SeqId(k as u64),
                    tokens: vec![w[pos]],
                    start_pos: pos as u32,
                    block_table: (k as u32 * per_seq..(k as u32 + 1) * per_seq).collect(),
                    sampling: SamplingParams::greedy(),
                    sample: true,
                    logprobs: None,
                    cached_prefix: Vec::new(),
                    allowed: None,
                    draft: Vec::new(),
                    embed: None,
                    prompt_logprobs: None,
                })
                .collect(),
            ..Default::default()
        };
        engine
            .step(&plan)
            .map_err(|e| format!("step {pos}: {e:?}"))?;
        if pos < scored_from {
            continue;
        }
        let got: Vec<&[f32]> = engine.last_logits().collect();
        if got.len() != windows.len() || got.iter().any(|r| r.len() != vocab) {
            return Err(format!("step {pos}: {} logits rows back", got.len()));
        }
        for (k, r) in got.into_iter().enumerate() {
            rows[k].push(r.to_vec());
        }
    }
    let mut at = 0;
    for (k, w) in windows.iter().enumerate() {
        for (i, row) in rows[k].iter_mut().enumerate() {
            log_softmax(row);
            each(at, row, w[scored_from + i + 1]);
            at += 1;
        }
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.text).map_err(|e| format!("{:?}: {e}", a.text))?;
    let load = |precision| {
        let opts = EngineOptions {
            cpu_activations: precision,
            ..Default::default()
        };
        Engine::load_gguf(&a.gguf, &opts).map_err(|e| format!("{:?}: {e}", a.gguf))
    };
    let mut reference = load(ActivationPrecision::F32)?;
    let ids = reference.codec().0.encode(&text, false)?;
    let count = a.windows.min(ids.len() / a.window);
    if count == 0 {
        return Err(format!(
            "the text is {} tokens, shorter than one window of {}",
            ids.len(),
            a.window
        ));
    }
    let windows: Vec<Vec<u32>> = ids
        .chunks_exact(a.window)
        .take(count)
        .map(<[u32]>::to_vec)
        .collect();
    let vocab = reference.model_info().vocab_size as usize;
    println!(
        "quant-kl: {} tokens of text, {count} windows of {}, {} scored positions, vocabulary {vocab}",
        ids.len(),
        a.window,
        count * (a.window - 1 - a.window / 2)
    );
    if let Some(path) = &a.ids_out {
        let json = serde_json::to_string(&windows).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{path:?}: {e}"))?;
    }
    let mut ref_rows: Vec<Vec<f32>> = Vec::new();
    let mut ref_nll = 0.0f64;
    evaluate(&mut reference, &windows, |_, row, next| {
        ref_nll -= row[next as usize] as f64;
        ref_rows.push(row.to_vec());
    })?;
    drop(reference);
    if let Some(path) = &a.ref_out {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{path:?}: {e}"))?,
        );
        for row in &ref_rows {
            for v in row {
                f.write_all(&v.to_le_bytes()).map_err(|e| e.to_string())?;
            }
        }
        f.flush().map_err(|e| e.to_string())?;
    }
    let mut int8 = load(ActivationPrecision::Int8)?;
    let kernels = tokenwire_kernels::quant::Kernels::detect().isa.name();
    let mut kls = Vec::with_capacity(ref_rows.len());
    let (mut same_top, mut nll) = (0usize, 0.0f64);
    evaluate(&mut int8, &windows, |at, row, next| {
        let p = &ref_rows[at];
        let kl: f64 = p
            .iter()
            .zip(row.iter())
            .map(|(&lp, &lq)| (lp as f64).exp() * (lp as f64 - lq as f64))
            .sum();
        kls.push(kl.max(0.0));
        same_top += usize::from(argmax(p) == argmax(row));
        nll -= row[next as usize] as f64;
    })?;
    if let Some(path) = &a.kl_out {
        let bytes: Vec<u8> = kls.iter().flat_map(|k| k.to_le_bytes()).collect();
        std::fs::write(path, bytes).map_err(|e| format!("{path:?}: {e}"))?;
    }
    let n = kls.len() as f64;
    let mean = kls.iter().sum::<f64>() / n;
    let var = kls.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    kls.sort_by(f64::total_cmp);
    let p99 = kls[((n * 0.99) as usize).min(kls.len() - 1)];
    println!(
        "tokenwire int8 ({kernels}) vs tokenwire f32: KL mean {mean:.6} ± {:.6}, p99 {p99:.6}, max {:.6}, \
         top-1 agreement {:.2}% ({same_top}/{}), ln PPL {:.4} vs f32 {:.4}",
        (var / n).sqrt(),
        kls[kls.len() - 1],
        100.0 * same_top as f64 / n,
        kls.len(),
        nll / n,
        ref_nll / n,
    );
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("quant-kl: {e}");
        std::process::exit(1);
    }
}
