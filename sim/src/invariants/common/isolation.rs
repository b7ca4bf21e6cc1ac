//! `isolation`: text that came from one principal's prompt never reaches
//! another principal (PROTOCOLS.md, Tenancy).
//!
//! Every simulated prompt carries its connection's tag `<c{conn}>` (see
//! [`crate::client`]), and no random text can spell one (prompt characters
//! hold no `<` or `>`). A frame to connection C that holds the tag of
//! another connection D is text derived from D's prompt: a leak, unless C
//! and D are one principal. The simulated clients present no key outside
//! `cai`, so the principals are each WebSocket connection on its own, and
//! all HTTP requests together (the anonymous principal); with
//! `--batch-cache-scope host` any two `batch` connections share the cache
//! by the operator's choice.

use std::collections::BTreeMap;

use tokenwire_core::config::CacheScope;
use tokenwire_core::{ConnId, Dialect, Input, Output, Transport};

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Isolation {
    /// Every connection ever opened (kept after it ends: its tag may still
    /// come back through what the Host kept).
    opened: BTreeMap<ConnId, (Dialect, Transport)>,
}

/// The connection tags `<c{digits}>` in `text`.
fn tags(text: &str) -> Vec<ConnId> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("<c") {
        let after = &rest[i + 2..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && after[digits.len()..].starts_with('>') {
            if let Ok(n) = digits.parse() {
                out.push(ConnId(n));
            }
        }
        rest = after;
    }
    out
}

impl Isolation {
    /// True when `a` and `b` are one principal, or share by the operator's
    /// choice.
    fn shared(&self, cx: &Cx<'_>, a: ConnId, b: ConnId) -> bool {
        let (Some(&(da, ta)), Some(&(db, tb))) = (self.opened.get(&a), self.opened.get(&b)) else {
            return false;
        };
        let anonymous_http = ta == Transport::Http && tb == Transport::Http;
        let shared_batch = cx.config.batch_cache_scope == CacheScope::Host
            && da == Dialect::Batch
            && db == Dialect::Batch;
        anonymous_http || shared_batch
    }
}

impl Checker for Isolation {
    fn name(&self) -> &'static str {
        "isolation"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, input: &Input) -> Check {
        if let Input::Open {
            conn,
            dialect,
            transport,
            ..
        } = input
        {
            self.opened.insert(*conn, (*dialect, *transport));
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::Send { conn, text } = out else {
            return Ok(());
        };
        for from in tags(text) {
            if from != *conn && self.opened.contains_key(&from) && !self.shared(cx, *conn, from) {
                return Err(format!(
                    "a frame to {conn:?} holds text of {from:?}'s prompt: {}",
                    crate::invariants::clip(text)
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
    fn tags_are_read_anywhere_in_a_frame() {
        assert_eq!(
            tags(r#"[{"text":"<c12>abc <c3>x <c> <cx> <c4"}]"#),
            vec![ConnId(12), ConnId(3)]
        );
    }

    #[test]
    fn another_connections_prompt_text_is_caught_and_ones_own_is_not() {
        let mut k = kit(Box::new(Isolation::default()));
        k.open_as(1, Dialect::Batch);
        k.open_as(2, Dialect::Batch);
        k.send(
            1,
            json!([{"type": "COMPLETE", "request_id": "1", "text": "<c1>mine"}]),
        )
        .expect("its own text");
        // The batch-id leak: connection 2 continues connection 1's batch.
        let e = k
            .send(
                2,
                json!([{"type": "COMPLETE", "request_id": "1", "text": "<c1>secret"}]),
            )
            .expect_err("a leak");
        assert_eq!(e.invariant, "isolation");
        assert!(e.detail.contains("ConnId(1)'s prompt"), "{}", e.detail);
    }
}
