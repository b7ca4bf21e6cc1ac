//! A `responses` connection as the checkers see it.
//!
//! The dialect answers a connection's frames one at a time, in order (the
//! Host holds later frames while a create's input is tokenized): an `error`
//! event, or for a create its `response.created` once its input is
//! tokenized, or for a cancel the terminal event of the response it ends.
//! `connection_expiring` (a timer) and `websocket_connection_limit_reached`
//! (the opening refused) answer nothing. Every event of a response carries
//! its `sequence_number`, and at most one response is in flight, so an event
//! with one belongs to the connection's response in flight.

use std::collections::{BTreeSet, VecDeque};

use serde_json::Value;

use tokenwire_core::dialect::responses::codec::{self, ClientEvent};
use tokenwire_core::{Instant, TextJobId};

use crate::invariants::Frame;

/// The three terminal event types.
pub const TERMINALS: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// True for a response's terminal event.
pub fn is_terminal(f: &Frame) -> bool {
    TERMINALS.contains(&f.kind())
}

/// The `error.code` of an error event.
pub fn code(f: &Frame) -> &str {
    f.v["error"]["code"].as_str().unwrap_or("")
}

/// What a client frame asks.
#[derive(Debug, Clone, PartialEq)]
pub enum RKind {
    /// `response.create`.
    Create {
        /// Its `previous_response_id`.
        prev: Option<String>,
        /// False for a warm-up.
        generate: bool,
        /// Its `model`, if it names one.
        model: Option<String>,
        /// The text of each message of its `input`, read from the frame
        /// itself rather than through the dialect's decoder (which the
        /// checkers judge): a string input, a message's string content, or
        /// its content parts' texts joined.
        texts: Vec<String>,
    },
    /// `response.cancel`.
    Cancel {
        /// Its `response_id`.
        id: Option<String>,
    },
    /// `response.retrieve` (the body of `GET /v1/responses/{id}`; over a
    /// WebSocket an unknown event, answered with an error event).
    Retrieve {
        /// The stored response it names.
        id: String,
    },
    /// Anything else: answered with an error event.
    Other,
}

/// Where a client frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RStage {
    /// Not handled yet.
    Sent,
    /// A create's input is being tokenized.
    Tokenizing(TextJobId),
    /// Its tokens came back in this event.
    Tokenized,
}

/// A client frame not yet answered.
#[derive(Debug, Clone, PartialEq)]
pub struct RMsg {
    /// What it asks.
    pub kind: RKind,
    /// Where it is.
    pub stage: RStage,
    /// A `response.create`'s `metadata` as the frame holds it (nested under
    /// `response` or not), read without the dialect's decoder, which the
    /// checkers judge: a create it refuses is `Other`, but its metadata is
    /// still here.
    pub metadata: Option<Value>,
}

/// The response in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Resp {
    /// Its id.
    pub id: String,
    /// The next `sequence_number` due.
    pub next_seq: u64,
    /// `response.in_progress` was sent (a warm-up has none).
    pub in_progress: bool,
    /// Output items added and not yet done.
    pub items_open: i64,
    /// When it was created.
    pub created_at: Instant,
}

/// The texts of a create's messages (see [`RKind::Create`]).
fn message_texts(v: &Value) -> Vec<String> {
    let part_text = |p: &Value| p["text"].as_str().map(str::to_owned);
    match &v["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter(|it| it.get("type").is_none_or(|t| t == "message"))
            .filter_map(|it| match &it["content"] {
                Value::String(s) => Some(s.clone()),
                Value::Array(parts) => parts.iter().map(part_text).collect(),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// One `responses` connection.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResponsesConnView {
    /// A WebSocket connection counted against the connection limit (not
    /// refused at its opening).
    pub accepted: bool,
    /// A WebSocket connection (not an HTTP request).
    pub websocket: bool,
    /// When `connection_expiring` came.
    pub warned_at: Option<Instant>,
    /// Frames sent and not yet answered, oldest first.
    pub queue: VecDeque<RMsg>,
    /// The response in flight (created, no terminal event yet).
    pub current: Option<Resp>,
    /// The one response a `previous_response_id` may name here: the last
    /// that ended completed or incomplete (not cancelled), unless one
    /// failed since.
    pub latest: Option<String>,
    /// Responses of this connection that ended.
    pub ended: BTreeSet<String>,
    /// Responses created on this connection.
    pub created: u64,
    /// The last create's `store` (an HTTP request's response is kept in
    /// the host's store unless it says `false`; a socket ignores it).
    pub store: bool,
}

impl ResponsesConnView {
    /// A connection just opened (over a WebSocket or not).
    pub fn opened(websocket: bool) -> ResponsesConnView {
        ResponsesConnView {
            accepted: websocket,
            websocket,
            ..ResponsesConnView::default()
        }
    }

    /// A text frame arrived (one over `max_frame` closes the connection).
    pub fn on_text(&mut self, text: &str, max_frame: usize) {
        if text.len() > max_frame {
            return;
        }
        let raw: Option<Value> = serde_json::from_str(text).ok();
        let metadata = raw.as_ref().and_then(|v| {
            let body = if v.get("response").is_some() {
                &v["response"]
            } else {
                v
            };
            body.get("metadata").cloned()
        });
        let kind = match codec::decode_client(text) {
            Ok(ClientEvent::Create(req)) => {
                self.store = req.store;
                RKind::Create {
                    prev: req.previous_response_id,
                    generate: req.generate,
                    model: req.model,
                    texts: raw.as_ref().map(message_texts).unwrap_or_default(),
                }
            }
            Ok(ClientEvent::Cancel { response_id }) => RKind::Cancel { id: response_id },
            Ok(ClientEvent::Retrieve { response_id }) => RKind::Retrieve { id: response_id },
            _ => RKind::Other,
        };
        self.queue.push_back(RMsg {
            kind,
            stage: RStage::Sent,
            metadata,
        });
    }

    /// A binary frame arrived.
    pub fn on_binary(&mut self) {
        self.queue.push_back(RMsg {
            kind: RKind::Other,
            stage: RStage::Sent,
            metadata: None,
        });
    }

    /// The Host asked to tokenize: the oldest frame, a create, was accepted.
    pub fn on_tokenize(&mut self, job: TextJobId) {
        if let Some(m) = self.queue.front_mut() {
            if matches!(m.kind, RKind::Create { .. }) && m.stage == RStage::Sent {
                m.stage = RStage::Tokenizing(job);
            }
        }
    }

    /// A text job came back.
    pub fn on_tokenized(&mut self, job: TextJobId) {
        if let Some(m) = self.queue.front_mut() {
            if m.stage == RStage::Tokenizing(job) {
                m.stage = RStage::Tokenized;
            }
        }
    }

    /// True when the Host's store must still hold `id`: an HTTP request
    /// stored it since the Host last started, and no more have been stored
    /// than the store holds (`response_store_size`), so none was forgotten.
    pub fn store_holds(view: &crate::invariants::view::View, capacity: usize, id: &str) -> bool {
        view.responses_kept.len() <= capacity && view.responses_kept.contains(id)
    }

    /// The oldest frame not yet answered.
    pub fn head(&self) -> Option<&RMsg> {
        self.queue.front()
    }

    /// True for an error event that answers no client frame.
    pub fn is_unprompted_error(f: &Frame) -> bool {
        f.kind() == "error"
            && matches!(
                code(f),
                "connection_expiring" | "websocket_connection_limit_reached"
            )
    }

    /// True when terminal event `f` ends the response in flight because of
    /// the cancel at the head, handled now (`handling`: this input hands the
    /// connection's frames over). A warm-up ends on its own.
    pub fn cancel_answered_by(&self, f: &Frame, handling: bool) -> bool {
        handling
            && is_terminal(f)
            && self.current.as_ref().is_some_and(|r| r.in_progress)
            && self
                .queue
                .front()
                .is_some_and(|m| matches!(m.kind, RKind::Cancel { .. }) && m.stage == RStage::Sent)
    }

    /// The server sent `f` on this connection.
    pub fn on_frame(&mut self, now: Instant, f: &Frame, handling: bool) {
        let kind = f.kind();
        if kind == "error" {
            match code(f) {
                "connection_expiring" => {
                    self.warned_at.get_or_insert(now);
                }
                "websocket_connection_limit_reached" => self.accepted = false,
                _ => {
                    self.queue.pop_front();
                }
            }
            return;
        }
        let Some(seq) = f.v["sequence_number"].as_u64() else {
            return;
        };
        if kind == "response.created" {
            if self
                .queue
                .front()
                .is_some_and(|m| matches!(m.kind, RKind::Create { .. }))
            {
                self.queue.pop_front();
            }
            self.created += 1;
            self.current = Some(Resp {
                id: f.v["response"]["id"].as_str().unwrap_or("").to_string(),
                next_seq: seq + 1,
                in_progress: false,
                items_open: 0,
                created_at: now,
            });
            return;
        }
        if self.cancel_answered_by(f, handling) {
            self.queue.pop_front();
        }
        if let Some(r) = self.current.as_mut() {
            r.next_seq = seq + 1;
            match kind {
                "response.in_progress" => r.in_progress = true,
                "response.output_item.added" => r.items_open += 1,
                "response.output_item.done" => r.items_open -= 1,
                _ => {}
            }
        }
        if !is_terminal(f) {
            return;
        }
        let id = f.v["response"]["id"].as_str().unwrap_or("").to_string();
        if self.current.as_ref().is_some_and(|r| r.id == id) {
            self.current = None;
        }
        match (kind, f.v["response"]["status"].as_str()) {
            ("response.completed", _) | ("response.incomplete", Some("incomplete")) => {
                self.latest = Some(id.clone());
            }
            ("response.failed", _) => self.latest = None,
            _ => {}
        }
        self.ended.insert(id);
    }

    /// True while the Host counts the connection busy: a create is being
    /// tokenized or a response is in flight.
    pub fn busy(&self) -> bool {
        self.current.is_some()
            || self
                .queue
                .front()
                .is_some_and(|m| matches!(m.stage, RStage::Tokenizing(_)))
    }

    /// Frames without their answer, and the response without its end.
    pub fn outstanding(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .queue
            .iter()
            .map(|m| format!("responses frame {:?} unanswered ({:?})", m.kind, m.stage))
            .collect();
        if let Some(r) = &self.current {
            v.push(format!(
                "response {} in flight since {:?} (next sequence number {})",
                r.id, r.created_at, r.next_seq
            ));
        }
        v
    }
}

/// Coverage key of a server frame.
pub fn tally_key(f: &Frame) -> Option<String> {
    Some(match f.kind() {
        "error" => format!("responses:error:{}", code(f)),
        "response.completed" if f.v["response"]["output"] == serde_json::json!([]) => {
            "responses:warm_up".into()
        }
        "response.incomplete" => format!(
            "responses:incomplete:{}",
            f.v["response"]["status"].as_str().unwrap_or("?")
        ),
        "response.completed" | "response.failed" => format!("responses:{}", &f.kind()[9..]),
        _ => return None,
    })
}
