//! The shell's part of an HTTP request, replayed for the checkers that
//! judge what an HTTP client gets (`session_http`, `responses_http`,
//! `anthropic_http`).
//!
//! The io shell maps a request's body to frames with the dialect's own
//! [`http_call`], sends them on a [`Transport::Http`] connection, hands
//! every frame the Host sends back to the call's exchange and writes what it
//! gives: one reply, or a stream of events ending with its last one. On a
//! close before that, the exchange gives the last step from the close. So
//! what a client gets is a function of the first frame the connection sent
//! and the Host's outputs: [`Replays`] rebuilds each request's exchange from
//! its first frame (which is the body with its `type`, and maps to the same
//! call) and feeds it the same outputs, and a checker compares each step
//! with what the contract says that frame must give.

use std::collections::BTreeMap;

use serde_json::Value;
use tokenwire_core::dialect::registry::http_call;
use tokenwire_core::http::{HttpExchange, HttpRequest, HttpStep};
use tokenwire_core::{ConnId, Dialect, Input, Output, Transport};

/// One HTTP request of the dialect, from its first frame to its last step.
struct Replay {
    /// Its first frame, parsed (`None` until it arrives).
    request: Option<Value>,
    /// The exchange the shell would hold.
    exchange: Option<Box<dyn HttpExchange>>,
    /// Its reply or its stream's last event was given: the shell is done.
    done: bool,
}

/// A step the exchange gave for an output to an HTTP request of the dialect.
pub struct Step<'a> {
    /// The connection.
    pub conn: ConnId,
    /// The request's first frame (its body, with `type`).
    pub request: &'a Value,
    /// The step.
    pub step: HttpStep,
}

/// The exchanges of one dialect's HTTP requests (see the module docs).
pub struct Replays {
    dialect: Dialect,
    live: BTreeMap<ConnId, Replay>,
}

impl std::fmt::Debug for Replays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replays")
            .field("dialect", &self.dialect)
            .field("live", &self.live.len())
            .finish()
    }
}

/// The request line and body that map to `frame` (its `type` says which
/// route it came from; an `anthropic` frame is `{"route", "body"}`).
fn request_of(dialect: Dialect, frame: &str) -> Option<(String, String, Vec<u8>)> {
    let v: Value = serde_json::from_str(frame).ok()?;
    let whole = || frame.as_bytes().to_vec();
    match (dialect, v["type"].as_str()) {
        (Dialect::Responses, Some("response.retrieve")) => Some((
            "GET".into(),
            format!("/v1/responses/{}", v["response_id"].as_str()?),
            whole(),
        )),
        (Dialect::Responses, _) => Some(("POST".into(), "/v1/responses".into(), whole())),
        (Dialect::Session, _) => Some(("POST".into(), "/v1/inference".into(), whole())),
        (Dialect::Anthropic, _) => {
            let path = match v["route"].as_str()? {
                "count_tokens" => "/v1/messages/count_tokens",
                _ => "/v1/messages",
            };
            Some((
                "POST".into(),
                path.into(),
                v["body"].to_string().into_bytes(),
            ))
        }
        _ => None,
    }
}

impl Replays {
    /// The HTTP requests of `dialect` (`session`, `responses` or
    /// `anthropic`).
    pub fn new(dialect: Dialect) -> Replays {
        Replays {
            dialect,
            live: BTreeMap::new(),
        }
    }

    /// Takes in an input: a request opens, sends its frame, or hangs up.
    /// `model` is the served model's name (the shell hands it to the call).
    pub fn on_input(&mut self, input: &Input, model: &str) {
        match input {
            Input::Open {
                conn,
                dialect,
                transport: Transport::Http,
                ..
            } if *dialect == self.dialect => {
                self.live.insert(
                    *conn,
                    Replay {
                        request: None,
                        exchange: None,
                        done: false,
                    },
                );
            }
            Input::Text { conn, text } => {
                let Some(r) = self.live.get_mut(conn).filter(|r| r.request.is_none()) else {
                    return;
                };
                r.request = Some(serde_json::from_str(text).unwrap_or(Value::Null));
                let Some((method, path, body)) = request_of(self.dialect, text) else {
                    return;
                };
                let req = HttpRequest {
                    method: &method,
                    path: &path,
                    body: &body,
                    model,
                };
                r.exchange = http_call(self.dialect, &req).ok().map(|c| c.exchange);
            }
            Input::Closed { conn } => {
                self.live.remove(conn);
            }
            _ => {}
        }
    }

    /// The step `out` gives a live request's exchange, if it goes to one:
    /// a frame it sent, or its close before the last step.
    pub fn on_output(&mut self, out: &Output) -> Option<Step<'_>> {
        let (conn, step) = match out {
            Output::Send { conn, text } => {
                let r = self.live.get_mut(conn).filter(|r| !r.done)?;
                (*conn, r.exchange.as_mut()?.on_frame(text))
            }
            Output::Close { conn, code, reason } => {
                let r = self.live.get_mut(conn).filter(|r| !r.done)?;
                (*conn, r.exchange.as_mut()?.on_close(*code, reason))
            }
            _ => return None,
        };
        let r = self.live.get_mut(&conn)?;
        if matches!(
            step,
            HttpStep::Reply(_) | HttpStep::LastEvent(_) | HttpStep::Events { last: true, .. }
        ) {
            r.done = true;
        }
        if matches!(out, Output::Close { .. }) {
            r.done = true;
        }
        Some(Step {
            conn,
            request: r.request.as_ref()?,
            step,
        })
    }

    /// The Host crashed: every request is gone.
    pub fn clear(&mut self) {
        self.live.clear();
    }
}
