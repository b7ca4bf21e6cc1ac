//! `sampling`: every step computes a request with the sampling it asked for:
//! temperature, top-p, top-k, repetition penalty and seed (when the client
//! gave one) as its config and its acknowledged `modify`s set them, and
//! logprobs exactly when it asked for them, with its number of alternatives.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Sampling;

impl Checker for Sampling {
    fn name(&self) -> &'static str {
        "sampling"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::RunStep(plan) = out else {
            return Ok(());
        };
        for s in &plan.seqs {
            let Some(rid) = cx.view.seq_request.get(&s.seq) else {
                continue;
            };
            let Some(r) = cx.view.requests.get(rid) else {
                continue;
            };
            if !r.config.known || r.terminals > 0 || r.superseded {
                continue;
            }
            let want = &r.config.sampling;
            let got = &s.sampling;
            let top_k = u32::try_from(want.top_k).unwrap_or(u32::MAX);
            let same = got.temperature == want.temperature
                && got.top_p == want.top_p
                && got.top_k == top_k
                && got.repetition_penalty == want.repetition_penalty
                && r.config.seed.is_none_or(|seed| got.seed == seed);
            if !same {
                return Err(format!(
                    "step {} computes {rid} with {got:?}, it asked for {want:?} (seed {:?})",
                    plan.step_id, r.config.seed
                ));
            }
            let logprobs = r.config.logprobs.then_some(want.top_logprobs);
            if s.logprobs.map(u64::from) != logprobs {
                return Err(format!(
                    "step {} computes {rid} with logprobs {:?}, it asked for {logprobs:?}",
                    plan.step_id, s.logprobs
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_step_with_other_sampling_is_caught() {
        let mut k = kit(Box::new(Sampling));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        // The kit's step uses the defaults: temperature 1, no seed given.
        k.step(1, 1, 1).expect("defaults match");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "control", "action": "modify", "parameters": {"temperature": 0.5}}),
        )
        .expect("modify");
        k.send(
            1,
            json!({"type": "status", "operation": "modified", "request_id": "gen_a",
                         "parameters": {"temperature": 0.5}}),
        )
        .expect("ack");
        k.end().expect("end");
        let err = k.step(2, 1, 1).expect_err("still temperature 1");
        assert_eq!(err.invariant, "sampling");
    }
}
