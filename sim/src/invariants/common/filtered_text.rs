//! `filtered_text`: no reply of `session`, `responses`, `cai` or `batch`
//! carries text a content-filter `stop` rule matches. Each reply's final
//! text is judged (`response.content`, the Response's output text,
//! `STREAM_COMPLETE.fullContent`, a `COMPLETE`'s text after the text its run
//! started from); the dialects' own checkers hold their streamed pieces to
//! that final text, so a match streamed in pieces cannot pass either.
//! (`generate`'s tokens are judged one by one by `content_filter`.)

use serde_json::Value;
use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::{Dialect, Output};

use crate::invariants::batch::view::{batch_send, Reading};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct FilteredText;

/// The generated text of a reply frame, for the dialects judged here.
fn reply_text(dialect: Dialect, v: &Value) -> Option<String> {
    match dialect {
        Dialect::Session if v["type"] == "response" => v["content"].as_str().map(str::to_string),
        Dialect::Responses
            if matches!(
                v["type"].as_str(),
                Some("response.completed" | "response.incomplete")
            ) =>
        {
            let items = v["response"]["output"].as_array()?;
            Some(
                items
                    .iter()
                    .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
                    .filter_map(|c| c["text"].as_str().map(str::to_string))
                    .collect(),
            )
        }
        Dialect::Cai if v["type"] == "STREAM_COMPLETE" => {
            v["payload"]["fullContent"].as_str().map(str::to_string)
        }
        _ => None,
    }
}

impl Checker for FilteredText {
    fn name(&self) -> &'static str {
        "filtered_text"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let Some(filter) = cx.config.content_filter.as_ref() else {
            return Ok(());
        };
        let Output::Send { conn, .. } = out else {
            return Ok(());
        };
        let texts: Vec<String> = match cx.view.dialect_of(*conn) {
            Some(Dialect::Batch) => {
                let Some((_, b, Ok(events))) = batch_send(cx.view, out) else {
                    return Ok(());
                };
                let Reading::Prompts(idx) = b.read(&events) else {
                    return Ok(());
                };
                events
                    .iter()
                    .zip(idx)
                    .filter_map(|(e, i)| {
                        let EventKind::Complete { text, .. } = &e.kind else {
                            return None;
                        };
                        let pr = &b.prompts[i?];
                        let pay = &b.payloads[pr.payload];
                        if pay.only_new {
                            return Some(text.clone());
                        }
                        // What the run started from is the client's prompt
                        // (or, uncertain, not known here).
                        let before = pay.before.get(pr.pos)?;
                        (!pay.uncertain)
                            .then(|| text.strip_prefix(before.as_str()).map(str::to_string))
                            .flatten()
                    })
                    .collect()
            }
            Some(d) => frame
                .and_then(|f| reply_text(d, &f.v))
                .into_iter()
                .collect(),
            None => return Ok(()),
        };
        for text in texts {
            if let Some(rule) = filter.stopped(&text) {
                return Err(format!(
                    "a reply to {conn:?} carries text content-filter rule `{}` matches ({:?})",
                    rule.name,
                    clip(&text)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_dialects_reply_text_is_found() {
        let t = |d, v: Value| reply_text(d, &v);
        assert_eq!(
            t(
                Dialect::Session,
                json!({"type": "response", "content": "abc"})
            )
            .as_deref(),
            Some("abc")
        );
        assert_eq!(
            t(
                Dialect::Responses,
                json!({"type": "response.incomplete", "response": {"output": [{"content": [{"text": "x"}, {"text": "y"}]}]}})
            )
            .as_deref(),
            Some("xy")
        );
        assert_eq!(
            t(
                Dialect::Cai,
                json!({"type": "STREAM_COMPLETE", "payload": {"fullContent": "z"}})
            )
            .as_deref(),
            Some("z")
        );
        assert_eq!(
            t(
                Dialect::Session,
                json!({"type": "stream_chunk", "content": "abc"})
            ),
            None
        );
    }

    #[test]
    fn a_session_reply_with_filtered_text_is_caught() {
        use crate::invariants::testkit::kit_with;
        use std::sync::Arc;
        use tokenwire_core::filter::{ContentFilter, FilterAction, FilterRule};
        use tokenwire_core::HostConfig;
        let rules = ContentFilter::new(vec![FilterRule {
            name: "qq".into(),
            pattern: "qq".into(),
            action: FilterAction::Stop,
        }])
        .expect("rules");
        let config = HostConfig {
            content_filter: Some(Arc::new(rules)),
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(FilteredText), config);
        k.open_as(7, Dialect::Session);
        k.send(7, json!({"type": "response", "session_id": "s", "content": "fine", "message_index": 1, "finish_reason": "stop", "tokens_used": 2, "timestamp": 0}))
            .expect("fine");
        let err = k
            .send(7, json!({"type": "response", "session_id": "s", "content": "a QQ b", "message_index": 3, "finish_reason": "stop", "tokens_used": 2, "timestamp": 0}))
            .expect_err("filtered text sent");
        assert_eq!(err.invariant, "filtered_text");
    }
}
