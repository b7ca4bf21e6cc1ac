//! `batch_beams`: a beam search's COMPLETE is the best hypothesis of a
//! reference beam search run over the simulated engine's own scripted
//! model (PROTOCOLS.md, `batch`: beam search as Hugging Face `generate`
//! defines it).
//!
//! The scripted model answers each history with the same candidates every
//! time, so the candidates the engine reported (each beam's best next
//! tokens with their log-probabilities, in `StepDone`) are a table from
//! history to candidates. When a beam prompt completes, the checker runs
//! the reference search ([`tokenwire_core::gen::beam::BeamSearch`], the
//! machine held to transformers' own beam search token for token by the
//! kernels' goldens) from the prompt's tokens with the payload's settings,
//! looking every history up in that table: a history the search needs and
//! the engine never computed means the Host ran other beams than the search
//! keeps; a best hypothesis other than the COMPLETE's tokens means it
//! finished on another. The COMPLETE's text is the best hypothesis decoded
//! (EOS left out), after the prompt unless `only_new_tokens`; a content
//! filter may end it early, so with one configured the text need only
//! begin the hypothesis' text. Without a filter, `is_eos` is true exactly
//! when the best hypothesis ends with an end-of-sequence token. Continued
//! batches (which start from cached text) are not judged.

use std::collections::BTreeMap;

use serde_json::Value;
use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::gen::beam::{BeamConfig, BeamSearch, EarlyStopping};
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Input, Output, SeqId, TextCodec, TokenId};

use super::view::{batch_send, BatchConnView};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchBeams {
    /// Every sequence's tokens as the plans fed them.
    histories: BTreeMap<SeqId, Vec<TokenId>>,
    /// Sequences sent to the engine with candidates asked for, and the
    /// history they were at.
    asked: BTreeMap<SeqId, Vec<TokenId>>,
    /// What the engine answered for each history it was asked about.
    candidates: BTreeMap<Vec<TokenId>, Vec<(TokenId, f32)>>,
}

/// The search settings of live prompt `rid`'s payload, and the prompt, when
/// it runs beam search and is judged.
fn search_of(cx: &Cx<'_>, b: &BatchConnView, rid: &str) -> Option<(BeamConfig, String, bool)> {
    let prompt = b.prompts.get(*b.live.get(rid)?)?;
    let pay = b.payloads.get(prompt.payload)?;
    if pay.beams < 2 || pay.continued || pay.uncertain {
        return None;
    }
    let defaults = &cx.config.batch_defaults;
    let early_stopping = match &pay.config["early_stopping"] {
        Value::Bool(true) => EarlyStopping::Yes,
        Value::String(s) if s == "never" => EarlyStopping::Never,
        _ => EarlyStopping::No,
    };
    let length_penalty = pay.config["length_penalty"]
        .as_f64()
        .map_or(defaults.length_penalty, |v| v as f32);
    let cfg = BeamConfig {
        num_beams: pay.beams as usize,
        length_penalty,
        early_stopping,
        max_new_tokens: pay.max_new as usize,
        eos_ids: cx.model.eos_ids.clone(),
    };
    let text = pay.prompts.get(prompt.named_pos)?.clone();
    Some((cfg, text, pay.only_new))
}

impl BatchBeams {
    /// The reference search's best hypothesis from `prompt`, or why it
    /// could not be run.
    fn reference(&self, cfg: BeamConfig, prompt: &[TokenId]) -> Result<Vec<TokenId>, String> {
        let mut search = BeamSearch::new(cfg);
        // Each step adds a token to every beam: the loop is bounded by
        // max_new_tokens, and by the table for anything else.
        while !search.is_done() {
            let mut all = Vec::new();
            for beam in search.running() {
                let mut h = prompt.to_vec();
                h.extend_from_slice(&beam.tokens);
                match self.candidates.get(&h) {
                    Some(c) => all.push(c.clone()),
                    None if beam.score <= -1.0e8 => all.push(Vec::new()),
                    None => {
                        return Err(format!(
                            "the search keeps a beam the engine never computed ({} tokens after the prompt)",
                            beam.tokens.len()
                        ))
                    }
                }
            }
            if search.step(&all).is_none() {
                break;
            }
        }
        Ok(search.best().to_vec())
    }
}

impl Checker for BatchBeams {
    fn name(&self) -> &'static str {
        "batch_beams"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, input: &Input) -> Check {
        if let Input::StepDone(done) = input {
            for r in &done.results {
                let (Some(h), Some(l)) = (self.asked.remove(&r.seq), r.logprobs.as_ref()) else {
                    continue;
                };
                self.candidates.insert(h, l.top.clone());
            }
            self.asked.clear();
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        if let Output::RunStep(plan) = out {
            // As the engine applies them: a fork whose copy exists already
            // (a plan sent again after an engine fault) changes nothing.
            for f in &plan.forks {
                if self.histories.contains_key(&f.dst) {
                    continue;
                }
                if let Some(src) = self.histories.get(&f.src) {
                    let len = (f.len as usize).min(src.len());
                    let copy = src[..len].to_vec();
                    self.histories.insert(f.dst, copy);
                }
            }
            for seq in &plan.free {
                self.histories.remove(seq);
            }
            for s in &plan.seqs {
                let h = self.histories.entry(s.seq).or_default();
                if !s.cached_prefix.is_empty() {
                    *h = s.cached_prefix.clone();
                }
                h.truncate(s.start_pos as usize);
                h.extend_from_slice(&s.tokens);
                if s.sample && s.logprobs.is_some() {
                    self.asked.insert(s.seq, h.clone());
                }
            }
            return Ok(());
        }
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        for e in &events {
            let EventKind::Complete {
                text,
                new_tokens_count,
                is_eos,
                ..
            } = &e.kind
            else {
                continue;
            };
            let Some(rid) = e.request_id.as_deref() else {
                continue;
            };
            let Some((cfg, prompt, only_new)) = search_of(cx, b, rid) else {
                continue;
            };
            let Ok(ids) = ByteCodec.encode(&prompt, true) else {
                continue;
            };
            let eos = cfg.eos_ids.clone();
            let best = self
                .reference(cfg, &ids)
                .map_err(|why| format!("beam prompt {rid:?} on {conn:?}: {why}"))?;
            let shown: Vec<TokenId> = best.iter().copied().filter(|t| !eos.contains(t)).collect();
            let generated = ByteCodec.decode(&shown);
            let want = if only_new {
                generated
            } else {
                format!("{prompt}{generated}")
            };
            let filtered = cx.config.content_filter.is_some();
            let agrees = if filtered {
                want.starts_with(text.as_str())
            } else {
                &want == text
            };
            if !agrees || u64::from(*new_tokens_count) != best.len() as u64 {
                return Err(format!(
                    "beam prompt {rid:?} on {conn:?} completed with {text:?} ({new_tokens_count} tokens); the reference search's best is {want:?} ({} tokens)",
                    best.len()
                ));
            }
            // Unfiltered, the search ended on EOS exactly when its best
            // hypothesis ends with an EOS token (a filter's cut ends it
            // otherwise, and says nothing either way).
            let ended_on_eos = best.last().is_some_and(|t| eos.contains(t));
            if !filtered && *is_eos != ended_on_eos {
                return Err(format!(
                    "beam prompt {rid:?} on {conn:?} completed with is_eos {is_eos}; the reference search's best {} with an end-of-sequence token",
                    if ended_on_eos { "ends" } else { "does not end" }
                ));
            }
        }
        Ok(())
    }

    fn on_crash(&mut self) {
        self.histories.clear();
        self.asked.clear();
        self.candidates.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::testing::BYTE_OFFSET;
    use tokenwire_core::{
        Dialect, SamplingParams, SeqResult, SeqStep, StepDone, StepPlan, TokenLogprobs,
    };

    fn tok(c: char) -> TokenId {
        BYTE_OFFSET + c as u32
    }

    /// A one-token beam search of "<c1>p" whose candidates are x, y, z, w
    /// (best first), then its COMPLETE with `text`.
    fn search_completing_with(text: &str) -> Check {
        search_of_length(1, text, false)
    }

    /// The same search with `max_new` tokens, the engine having computed
    /// only the prompt's candidates.
    fn search_of_length(max_new: u64, text: &str, is_eos: bool) -> Check {
        let mut k = kit(Box::new(BatchBeams::default()));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "r", "prompt": "<c1>p"}], "stream_response": false,
                   "generation_config": {"num_beams": 2, "max_new_tokens": max_new, "do_sample": false}}),
        )
        .map_err(|v| v.detail)?;
        k.send(1, json!([{"request_id": "r", "type": "ACCEPTED"}]))
            .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        let prompt = ByteCodec.encode("<c1>p", true).expect("encode");
        let n = prompt.len() as u32;
        k.out(Output::RunStep(StepPlan {
            step_id: 1,
            seqs: vec![SeqStep {
                seq: SeqId(1),
                tokens: prompt,
                start_pos: 0,
                block_table: (0..n.div_ceil(16)).collect(),
                sampling: SamplingParams::default(),
                sample: true,
                logprobs: Some(4),
                cached_prefix: Vec::new(),
                allowed: None,
                draft: Vec::new(),
                embed: None,
                prompt_logprobs: None,
            }],
            free: vec![],
            copy_blocks: vec![],
            forks: vec![],
        }))
        .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        let top = vec![
            (tok('x'), -0.1),
            (tok('y'), -1.0),
            (tok('z'), -2.0),
            (tok('w'), -3.0),
        ];
        k.input(Input::StepDone(StepDone {
            step_id: 1,
            results: vec![SeqResult {
                seq: SeqId(1),
                token: tok('x'),
                logprobs: Some(TokenLogprobs { logprob: -0.1, top }),
                embedding: None,
                prompt_logprobs: None,
            }],
        }))
        .map_err(|v| v.detail)?;
        k.send(
            1,
            json!([{"request_id": "r", "type": "COMPLETE", "text": text, "is_eos": is_eos,
                    "new_tokens_count": max_new, "execution_time": 0.1}]),
        )
        .map_err(|v| v.detail)
    }

    #[test]
    fn the_reference_searchs_best_passes() {
        search_completing_with("x").expect("the best candidate");
    }

    /// A fabricated violation: the search finished on another hypothesis.
    #[test]
    fn another_hypothesis_is_caught() {
        let e = search_completing_with("y").expect_err("not the best");
        assert!(e.contains("reference search's best is \"x\""), "{e}");
    }

    /// A fabricated violation: a two-token search whose second round the
    /// engine never computed (the Host ran other beams, or none).
    #[test]
    fn a_kept_beam_never_computed_is_caught() {
        let e = search_of_length(2, "xy", false).expect_err("no second round");
        assert!(e.contains("never computed"), "{e}");
    }

    /// A fabricated violation: the search stopped at `max_new_tokens`, on
    /// a hypothesis without EOS, but its COMPLETE says `is_eos`.
    #[test]
    fn is_eos_for_a_search_cut_by_length_is_caught() {
        let e = search_of_length(1, "x", true).expect_err("no EOS in x");
        assert!(e.contains("is_eos true"), "{e}");
    }
}
