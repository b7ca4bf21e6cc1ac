//! The CPU backend samples a step's rows itself, across its pool: the
//! tokens (and logprobs) must be exactly what the shared sampler picks from
//! the rows `forward` gives, for every kind of sampling; a row without a
//! spec is left to the caller, and every row comes back as well.

use std::sync::Arc;

use tokenwire_core::{SamplingParams, TokenMask};
use tokenwire_kernels::tiny::tiny_model;
use tokenwire_kernels::{Backend, CpuBackend, ForwardOutput, SampleSpec, Sampler, SeqBatch};

const SEQS: usize = 9;
/// A sequence that wants no logits (a prompt chunk), and one whose row the
/// caller samples itself.
const NO_LOGITS: usize = 2;
const NO_SPEC: usize = 5;

#[test]
fn rows_sampled_across_the_pool_are_the_shared_samplers_picks() {
    let model = Arc::new(tiny_model(3));
    let mut select = CpuBackend::new(model.clone(), 16, 64).expect("backend");
    let mut plain = CpuBackend::new(model, 16, 64).expect("backend");
    let prompts: Vec<Vec<u32>> = (0..SEQS)
        .map(|i| {
            (0..5 + i as u32)
                .map(|t| 3 + (t * 7 + i as u32) % 250)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..SEQS as u32).map(|i| vec![2 * i, 2 * i + 1]).collect();
    let mut mask = TokenMask::none(259);
    for id in [40, 41, 97, 200] {
        mask.allow(id);
    }
    // Greedy, drawn at several temperatures, top-k, top-p, penalised, with
    // logprobs, and masked to a few ids.
    let params = |i: usize| SamplingParams {
        temperature: [0.0, 0.7, 1.3, 0.0, 1.0, 0.9, 0.0, 0.0, 0.8][i],
        top_p: if i == 4 { 0.8 } else { 1.0 },
        top_k: if i == 8 { 20 } else { 0 },
        repetition_penalty: if i == 3 { 1.3 } else { 1.0 },
        seed: 11 + i as u64,
        ..SamplingParams::default()
    };
    let params: Vec<SamplingParams> = (0..SEQS).map(params).collect();
    let batch: Vec<SeqBatch<'_>> = (0..SEQS)
        .map(|i| SeqBatch {
            tokens: &prompts[i],
            start_pos: 0,
            block_table: &tables[i],
            want_logits: i != NO_LOGITS,
            sample: (i != NO_SPEC && i != NO_LOGITS).then(|| SampleSpec {
                params: &params[i],
                position: prompts[i].len() as u32,
                history: &prompts[i],
                logprobs: (i == 1 || i == 3).then_some(3),
                allowed: (i == 6).then_some(&mask),
            }),
            keep_row: false,
            hidden: None,
        })
        .collect();
    let mut out = ForwardOutput::default();
    select.forward_select(&batch, &mut out).expect("select");
    let mut rows = Vec::new();
    plain.forward(&batch, &mut rows).expect("forward");
    assert_eq!(
        out.logits, rows,
        "every row handed back, as forward gives it"
    );
    let wanted: Vec<&SeqBatch<'_>> = batch.iter().filter(|b| b.want_logits).collect();
    assert_eq!(out.sampled.len(), SEQS - 1);
    assert_eq!(out.has_row, vec![true; SEQS - 1]);
    let vocab = rows.len() / wanted.len();
    let mut sampler = Sampler::new();
    for (j, (b, row)) in wanted.iter().zip(rows.chunks_exact(vocab)).enumerate() {
        match b.sample.as_ref() {
            Some(sp) => {
                let want = sp.sample(&mut sampler, row);
                let got = out.sampled[j].as_ref().expect("sampled here");
                assert_eq!((got.token, got.logprobs.clone()), want, "row {j}");
            }
            None => assert_eq!(out.sampled[j], None, "row {j} is the caller's"),
        }
    }
}
