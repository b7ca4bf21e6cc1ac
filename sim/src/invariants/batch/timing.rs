//! `batch_timing`: a COMPLETE's `execution_time` is the seconds from when
//! its prompt was picked up to the COMPLETE itself, in the Host's time,
//! rounded to the millisecond (PROTOCOLS.md, `batch`): at least the time
//! since its STARTED frame (the Host notes the start when the scheduler
//! picks the prompt, which may be before that frame goes out) and at most
//! the time since its ACCEPTED.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::prompt_events;
use crate::invariants::{Check, Checker, Cx, Frame};

/// Rounding to the millisecond, and a float's error on top.
const TOLERANCE_S: f64 = 0.000_5 + 1e-9;

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchTiming;

impl Checker for BatchTiming {
    fn name(&self) -> &'static str {
        "batch_timing"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, events)) = prompt_events(cx.view, out) else {
            return Ok(());
        };
        for (e, i) in events {
            let (EventKind::Complete { execution_time, .. }, Some(i)) = (&e.kind, i) else {
                continue;
            };
            let pr = &b.prompts[i];
            let (Some(accepted), Some(started)) = (pr.accepted_at, pr.started_at) else {
                continue;
            };
            let least = (cx.now - started).as_secs_f64() - TOLERANCE_S;
            let most = (cx.now - accepted).as_secs_f64() + TOLERANCE_S;
            if !(least..=most).contains(execution_time) {
                return Err(format!(
                    "COMPLETE for {:?} on {conn:?} says execution_time {execution_time} s; {} s passed since its STARTED, {} s since its ACCEPTED",
                    pr.rid,
                    (cx.now - started).as_secs_f64(),
                    (cx.now - accepted).as_secs_f64()
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
    use tokenwire_core::{Dialect, Input};

    /// A prompt STARTED, then 1.5 s later its COMPLETE says `seconds`.
    fn completed_after(seconds: f64) -> Check {
        let mut k = kit(Box::new(BatchTiming));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "a", "prompt": "<c1>x"}]}),
        )
        .map_err(|v| v.detail)?;
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .map_err(|v| v.detail)?;
        k.send(1, json!([{"request_id": "a", "type": "STARTED"}]))
            .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        let later = k.t + 1_500;
        k.at(later).input(Input::Timeout).map_err(|v| v.detail)?;
        k.send(
            1,
            json!([{"request_id": "a", "type": "COMPLETE", "text": "x", "is_eos": false,
                    "new_tokens_count": 1, "execution_time": seconds}]),
        )
        .map_err(|v| v.detail)
    }

    #[test]
    fn an_execution_time_other_than_the_time_since_started_is_caught() {
        completed_after(1.5).expect("the time that passed");
        let e = completed_after(1500.0).expect_err("milliseconds as seconds");
        assert!(e.contains("1.5 s passed since its STARTED"), "{e}");
        completed_after(1.502).expect_err("two milliseconds more than since ACCEPTED");
        completed_after(1.498).expect_err("two milliseconds less than since STARTED");
    }
}
