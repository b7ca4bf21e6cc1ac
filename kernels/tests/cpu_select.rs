//! The CPU backend samples a step's rows itself, across its pool: the
//! tokens (and logprobs) must be exactly what the shared sampler picks from
//! the rows `forward` gives, for every kind of sampling, and a step where
//! a row must be kept is left to the caller whole.

use std::sync::Arc;

use tokenwire_core::{SamplingParams, TokenMask};
use tokenwire_kernels::tiny::tiny_model;
use tokenwire_kernels::{Backend, CpuBackend, ForwardOutput, SampleSpec, Sampler, SeqBatch};

const SEQS: usize = 7;

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
    let params = |i: usize| SamplingParams {
        temperature: [0.0, 0.7, 1.3, 0.0, 1.0, 0.9, 0.0][i],
        top_p: if i == 5 { 0.8 } else { 1.0 },
        top_k: if i == 4 { 20 } else { 0 },
        repetition_penalty: if i == 3 { 1.3 } else { 1.0 },
        seed: 11 + i as u64,
        ..SamplingParams::default()
    };
    for keep_last in [false, true] {
        let batch: Vec<SeqBatch<'_>> = (0..SEQS)
            .map(|i| SeqBatch {
                tokens: &prompts[i],
                start_pos: 0,
                block_table: &tables[i],
                want_logits: true,
                sample: Some(SampleSpec {
                    params: params(i),
                    position: prompts[i].len() as u32,
                    history: &prompts[i],
                    logprobs: (i == 1 || i == 3).then_some(3),
                    allowed: (i == 6).then_some(&mask),
                }),
                keep_row: keep_last && i == SEQS - 1,
            })
            .collect();
        let mut out = ForwardOutput::default();
        select.forward_select(&batch, &mut out).expect("select");
        let mut rows = Vec::new();
        plain.forward(&batch, &mut rows).expect("forward");
        let vocab = rows.len() / SEQS;
        let mut sampler = Sampler::new();
        for (i, (b, row)) in batch.iter().zip(rows.chunks_exact(vocab)).enumerate() {
            let sp = b.sample.as_ref().expect("spec");
            let want = sampler.sample_masked(
                row,
                &sp.params,
                sp.position,
                sp.history,
                sp.logprobs,
                sp.allowed,
            );
            if keep_last {
                // A row to keep: the whole step is the caller's to sample.
                assert_eq!(out.sampled[i], None, "row {i}");
                assert!(out.has_row[i], "row {i}");
            } else {
                let got = out.sampled[i].as_ref().expect("sampled here");
                assert_eq!((got.token, got.logprobs.clone()), want, "row {i}");
                assert!(!out.has_row[i], "row {i}");
            }
        }
        if keep_last {
            assert_eq!(out.logits, rows, "every row handed back");
        } else {
            assert!(out.logits.is_empty(), "no row handed back");
        }
    }
}
