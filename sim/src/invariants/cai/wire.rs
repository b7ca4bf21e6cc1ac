//! `cai_wire`: every frame to a `cai` connection is a server message of the
//! contract: it decodes with the dialect's own decoder
//! (`codec::decode_server`: a known type with every field of its type,
//! `totalTokens` the sum of the other two, an `ERROR` with a known code and
//! a `details` object). Beyond the decoder: a `STREAM_START`'s timestamp is
//! the Host's clock (`epoch_unix_ms` plus its time) in ISO 8601 UTC with
//! milliseconds, a `STREAM_COMPLETE` names the served model and ends with
//! `stop`, `length` or `interrupted`, and an `ERROR` says what was wrong.

use tokenwire_core::dialect::cai::codec::{decode_server, ServerMessage};
use tokenwire_core::Output;

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiWire;

/// The day `z` days after 1970-01-01 as (year, month, day).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `unix_ms` in ISO 8601 UTC with milliseconds.
pub fn iso_millis(unix_ms: u64) -> String {
    let secs = unix_ms / 1_000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3_600,
        s / 60 % 60,
        s % 60,
        unix_ms % 1_000
    )
}

impl Checker for CaiWire {
    fn name(&self) -> &'static str {
        "cai_wire"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::Send { conn, text } = out else {
            return Ok(());
        };
        if cx.view.cai(conn).is_none() {
            return Ok(());
        }
        let msg = decode_server(text).map_err(|e| {
            format!(
                "frame to {conn:?} is not a cai server message ({e}): {}",
                clip(text)
            )
        })?;
        match msg {
            ServerMessage::StreamStart { timestamp, .. } => {
                let want = iso_millis(cx.config.epoch_unix_ms + cx.now.as_millis());
                if timestamp != want {
                    return Err(format!(
                        "STREAM_START to {conn:?} stamped {timestamp:?}; the Host's clock says {want:?}"
                    ));
                }
            }
            ServerMessage::StreamComplete {
                model,
                finish_reason,
                ..
            } => {
                if model != cx.model.name {
                    return Err(format!(
                        "STREAM_COMPLETE to {conn:?} names model {model:?}, the Host serves {:?}",
                        cx.model.name
                    ));
                }
                let filtered = finish_reason == "content_filter"
                    && crate::invariants::generate::wire::filters(cx);
                if !matches!(finish_reason.as_str(), "stop" | "length" | "interrupted") && !filtered
                {
                    return Err(format!(
                        "STREAM_COMPLETE to {conn:?} ends with {finish_reason:?}"
                    ));
                }
            }
            ServerMessage::Error { message, .. } if message.trim().is_empty() => {
                return Err(format!("ERROR to {conn:?} says nothing: {}", clip(text)));
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::cai_kit;
    use serde_json::json;

    #[test]
    fn timestamps_are_iso_8601_with_milliseconds() {
        assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_millis(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn frames_that_do_not_decode_or_lie_are_caught() {
        let mut k = cai_kit(Box::new(CaiWire));
        k.open_cai(1);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let e = k
            .send(
                1,
                json!({"type": "CONTENT_CHUNK", "requestId": "r", "payload": {"index": 0}}),
            )
            .expect_err("no content");
        assert_eq!(e.invariant, "cai_wire");
        let e = k
            .send(
                1,
                json!({"type": "ERROR", "requestId": null,
                            "error": {"code": "OOPS", "message": "m", "details": {}}}),
            )
            .expect_err("unknown code");
        assert!(e.detail.contains("OOPS"), "{}", e.detail);
        k.send(
            1,
            json!({"type": "ERROR", "requestId": null,
                         "error": {"code": "INVALID_REQUEST", "message": "m", "details": {}}}),
        )
        .expect("fine");
        k.at(1_500);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let e = k
            .send(
                1,
                json!({"type": "STREAM_START", "requestId": "r",
                            "timestamp": "1970-01-01T00:00:01.000Z"}),
            )
            .expect_err("another time");
        assert!(e.detail.contains("00:00:01.500Z"), "{}", e.detail);
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r",
                         "timestamp": "1970-01-01T00:00:01.500Z"}),
        )
        .expect("the Host's clock");
    }
}
