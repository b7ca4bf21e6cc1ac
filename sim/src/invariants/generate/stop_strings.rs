//! `stop_strings`: a stop string never appears in the streamed text. Stop
//! strings changed by a `modify` apply to the text streamed after its ack.

use tokenwire_core::Output;

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct StopStrings;

impl Checker for StopStrings {
    fn name(&self) -> &'static str {
        "stop_strings"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if f.kind() != "token" {
            return Ok(());
        }
        let Some(r) = cx.view.current(*conn) else {
            return Ok(());
        };
        if r.config.stops.is_empty() {
            return Ok(());
        }
        let piece = f.str("token").unwrap_or("");
        let longest = r.config.stops.iter().map(String::len).max().unwrap_or(0);
        // Only a window that the new piece could complete needs looking at.
        let mut from = r
            .streamed
            .len()
            .saturating_sub(longest.saturating_sub(1))
            .max(r.stops_from)
            .min(r.streamed.len());
        while !r.streamed.is_char_boundary(from) {
            from -= 1;
        }
        let window = format!("{}{}", &r.streamed[from..], piece);
        match r.config.stops.iter().find(|s| window.contains(s.as_str())) {
            Some(s) => Err(format!(
                "stop string {s:?} streamed to {conn:?} (text ends {:?})",
                clip(&window)
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_stop_string_split_across_tokens_is_caught() {
        let mut k = kit(Box::new(StopStrings));
        k.start(
            1,
            "gen_a",
            json!({"type": "config", "prompt": "hi", "parameters": {"stop": ["END", "zz"]}}),
        );
        k.token(1, "the E").expect("a prefix is fine");
        let err = k.token(1, "ND").expect_err("stop string completed");
        assert_eq!(err.invariant, "stop_strings");
        assert!(err.detail.contains("END"));
    }
}
