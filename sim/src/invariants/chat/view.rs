//! The `chat` dialect's part of the view: each connection's one request,
//! from its frame to its answer, and how many generations it may hold in
//! the Host's queue at once (its choices, or its embedding inputs), which
//! the queue-bound checkers of other dialects count as requests in flight.

use tokenwire_core::dialect::chat::embeddings::WINDOW;

use super::answers::Request;
use crate::invariants::Frame;

/// The most generations counted for one request: more than any simulated
/// client's request holds (4 prompts of 2 choices, 4 embedding inputs),
/// so a body with a huge `n` costs no more than that.
const MOST_COUNTED: u64 = 64;

/// One `chat` connection's request (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatConnView {
    /// Its frame arrived.
    pub sent: bool,
    /// Its answer ended (a reply, an error, or `done`).
    pub answered: bool,
    /// The most generations it may hold at once.
    pub weight: u64,
    /// Its request's route, and what it asks that a tally tells apart.
    pub kind: String,
}

impl ChatConnView {
    /// Its request's frame arrived.
    pub fn on_text(&mut self, text: &str) {
        if self.sent {
            return;
        }
        self.sent = true;
        let r = Request::of_frame(text);
        let mut kind = r.route.clone();
        for (flag, set) in [
            ("stream", r.stream()),
            ("echo", r.body["echo"] == true),
            ("logprobs", !r.body["logprobs"].is_null()),
            ("batch", r.prompts().is_some_and(|p| p.len() > 1)),
            ("n", r.n() > 1),
        ] {
            if set {
                kind.push('+');
                kind.push_str(flag);
            }
        }
        self.kind = kind;
        // At least one, so that the run waits for its answer (a tokenizer
        // route holds no generation).
        self.weight = match r.route.as_str() {
            "chat" | "completions" | "messages" => r.choices(),
            "embeddings" => r.prompts().map_or(0, |p| p.len() as u64).min(WINDOW as u64),
            _ => 0,
        }
        .clamp(1, MOST_COUNTED);
    }

    /// A frame the Host sent it.
    pub fn on_frame(&mut self, f: &Frame) {
        if matches!(f.v["kind"].as_str(), Some("reply" | "error" | "done")) {
            self.answered = true;
        }
    }

    /// The tally key of an answer's end (`chat:{kind}:{how}`), if `f` ends
    /// it: how many answers of each kind the run saw, and how they ended.
    pub fn tally_key(&self, f: &Frame) -> Option<String> {
        let how = match f.v["kind"].as_str()? {
            "reply" | "done" => "answered".to_string(),
            "error" => format!(
                "error:{}",
                f.v["data"]["error"]["code"].as_str().unwrap_or("")
            ),
            _ => return None,
        };
        Some(format!("chat:{}:{how}", self.kind))
    }

    /// What is outstanding on it: its request, once sent until answered,
    /// counted once per generation it may hold (at least once).
    pub fn outstanding(&self, conn: u64) -> Vec<String> {
        if !self.sent || self.answered {
            return Vec::new();
        }
        (0..self.weight)
            .map(|k| format!("chat request on c{conn} ({k})"))
            .collect()
    }
}
