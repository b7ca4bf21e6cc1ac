//! `content_filter`: no text a content-filter `stop` rule matches is ever
//! streamed, whole or split across token frames (the rules are the Host's
//! own `--content-filter`, the oracle an unanchored search of the text
//! streamed so far).

use tokenwire_core::Output;

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ContentFilter;

impl Checker for ContentFilter {
    fn name(&self) -> &'static str {
        "content_filter"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(filter) = cx.config.content_filter.as_ref() else {
            return Ok(());
        };
        let current = cx.view.current(*conn);
        let text = match (f.kind(), current) {
            ("token", Some(r)) => format!("{}{}", r.streamed, f.str("token").unwrap_or("")),
            ("token", None) => f.str("token").unwrap_or("").to_string(),
            // A completion's text is the whole generation's, after the
            // prompt when the client asked for it echoed (the client's
            // own text, which no rule stops).
            ("completion", _) => {
                let all = f.str("generated_text").unwrap_or("");
                match current.filter(|r| r.config.echo) {
                    Some(r) => all.strip_prefix(r.config.prompt.as_str()).unwrap_or(all),
                    None => all,
                }
                .to_string()
            }
            _ => return Ok(()),
        };
        match filter.stopped(&text) {
            Some(rule) => Err(format!(
                "text content-filter rule `{}` matches was sent to {conn:?} in a {} frame (text ends {:?})",
                rule.name,
                f.kind(),
                clip(&text)
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit_with;
    use serde_json::json;
    use std::sync::Arc;
    use tokenwire_core::filter::{ContentFilter as Rules, FilterAction, FilterRule};
    use tokenwire_core::HostConfig;

    #[test]
    fn a_match_split_across_tokens_is_caught() {
        let rules = Rules::new(vec![FilterRule {
            name: "xy".into(),
            pattern: "x+y".into(),
            action: FilterAction::Stop,
        }])
        .expect("rules");
        let config = HostConfig {
            content_filter: Some(Arc::new(rules)),
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(ContentFilter), config);
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.token(1, "ab x").expect("a prefix is fine");
        let err = k.token(1, "xY").expect_err("the rule's text was sent");
        assert_eq!(err.invariant, "content_filter");
        assert!(err.detail.contains("`xy`"), "{}", err.detail);
    }
}
