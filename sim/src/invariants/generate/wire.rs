//! `wire_format`: every frame is a JSON object of a known `generate` type with
//! its required fields: `init` a fresh `gen_<uuid7>` request id; `token` a
//! text and a `finish_reason` exactly when finished; `completion` a known
//! `finish_reason` and usage; `error` a known code, a non-empty message, a
//! boolean `recoverable` and a known `recovery_action`; `status` an operation.
//! And the dialect's own codec decodes it (so the codec clients use accepts
//! everything the server sends).

use std::collections::BTreeSet;

use tokenwire_core::dialect::generate::codec;
use tokenwire_core::Output;

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

const ERRORS: [&str; 8] = [
    "invalid_request",
    "context_length_exceeded",
    "content_filter",
    "memory_pressure",
    "timeout",
    "internal_error",
    "model_loading_error",
    "rate_limited",
];
const ACTIONS: [&str; 4] = ["retry", "reduce_max_tokens", "shorten_prompt", "none"];
const FINISH: [&str; 4] = ["length", "stop", "cancelled", "timeout"];

/// A known finish reason; `content_filter` only where the Host has a
/// content filter with stop rules.
fn finish_ok(cx: &Cx<'_>, r: &str) -> bool {
    FINISH.contains(&r) || (r == "content_filter" && filters(cx))
}

/// Whether the Host's content filter can stop a generation.
pub(crate) fn filters(cx: &Cx<'_>) -> bool {
    cx.config
        .content_filter
        .as_ref()
        .is_some_and(|f| f.has_stop_rules())
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct WireFormat {
    ids: BTreeSet<String>,
}

fn check(cx: &Cx<'_>, f: &Frame, text: &str, ids: &mut BTreeSet<String>) -> Result<(), String> {
    let v = &f.v;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    if let Err(e) = codec::decode_server(text) {
        return Err(format!("the generate codec rejects it: {e}"));
    }
    match f.kind() {
        "init" => {
            let id = f.request_id().ok_or("init without request_id")?;
            let uuid = id
                .strip_prefix("gen_")
                .ok_or("request_id without gen_ prefix")?;
            if uuid.len() != 36 || uuid.as_bytes().get(14) != Some(&b'7') {
                return Err(format!("request_id {id} is not a UUID v7"));
            }
            if !ids.insert(id.to_string()) {
                return Err(format!("request_id {id} used twice"));
            }
            if f.str("model").is_none() || !v["model_info"]["max_tokens"].is_u64() {
                return Err("init without model or model_info.max_tokens".into());
            }
        }
        "token" => {
            f.str("token").ok_or("token without text")?;
            let finished = v["finished"].as_bool().ok_or("token without finished")?;
            match (finished, v["finish_reason"].as_str()) {
                (false, None) if v["finish_reason"].is_null() => {}
                (true, Some(r)) if finish_ok(cx, r) => {}
                _ => {
                    return Err(format!(
                        "finished {finished} with finish_reason {}",
                        v["finish_reason"]
                    ))
                }
            }
        }
        "completion" => {
            f.request_id().ok_or("completion without request_id")?;
            f.str("generated_text")
                .ok_or("completion without generated_text")?;
            let r = f.str("finish_reason").unwrap_or("");
            if !finish_ok(cx, r) {
                return Err(format!("finish_reason {r:?}"));
            }
            if !v["usage"]["completion_tokens"].is_u64() {
                return Err("completion without usage".into());
            }
        }
        "error" => {
            let code = f.str("error").unwrap_or("");
            if !ERRORS.contains(&code) {
                return Err(format!("unknown error code {code:?}"));
            }
            if f.str("message").is_none_or(str::is_empty) {
                return Err("error without a message".into());
            }
            if !v["recoverable"].is_boolean() {
                return Err("error without recoverable".into());
            }
            if !ACTIONS.contains(&f.str("recovery_action").unwrap_or("")) {
                return Err(format!("recovery_action {}", v["recovery_action"]));
            }
        }
        "status" => {
            f.str("operation").ok_or("status without operation")?;
        }
        other => return Err(format!("unknown frame type {other:?}")),
    }
    Ok(())
}

impl Checker for WireFormat {
    fn name(&self) -> &'static str {
        "wire_format"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, text }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        check(cx, f, text, &mut self.ids)
            .map_err(|e| format!("{e} in frame to {conn:?}: {}", clip(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn malformed_frames_are_caught() {
        let mut k = kit(Box::new(WireFormat::default()));
        k.open(1);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let id = "gen_01890a5d-ac96-774b-bcce-b302099a8057";
        let init = json!({"type": "init", "request_id": id, "model": "tiny", "model_info": {"version": "1", "max_tokens": 512, "quantization": "f32"}});
        k.send(1, init.clone()).expect("well formed");
        assert!(k.send(1, init).is_err(), "id reused");
        for bad in [
            json!({"type": "token", "token": "a", "finished": true, "finish_reason": null}),
            json!({"type": "error", "error": "oops", "message": "m", "recoverable": true, "recovery_action": "none"}),
            json!({"type": "error", "error": "timeout", "message": "", "recoverable": true, "recovery_action": "none"}),
            json!({"type": "completion", "request_id": id, "generated_text": "", "finish_reason": "done", "usage": {}}),
            json!({"type": "mystery"}),
            json!([1]),
            // What only the codec catches: a field of the wrong type.
            json!({"type": "status", "operation": "queued", "position": "first", "request_id": id}),
        ] {
            let err = k.send(1, bad.clone()).expect_err("malformed");
            assert_eq!(err.invariant, "wire_format", "{bad}");
        }
    }
}
