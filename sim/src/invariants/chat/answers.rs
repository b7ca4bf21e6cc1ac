//! Each `chat` request's answer (an `anthropic` one's too: the same machine
//! sends the same frames, which the shell writes in Anthropic's shapes),
//! assembled from the frames the Host sent
//! (`{"kind": "chunk" | "done" | "reply" | "error", ...}`, which the io
//! shell writes as one JSON reply or as server-sent events), for the
//! checkers that judge whole answers. A request is its connection's first
//! frame (`{"route", "body"}`); its answer is over at its reply, its error,
//! its `done` or an error after its chunks.

use std::collections::BTreeMap;

use serde_json::Value;
use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{ConnId, Dialect, Input, Output, TextCodec, TokenId, Transport};

use crate::invariants::{Check, Checker, Cx, Frame};

/// A request as its frame carried it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `chat`, `completions`, `embeddings`, `tokenize`, `detokenize`,
    /// `tokenizer_info`, or Anthropic's `messages` and `count_tokens`.
    pub route: String,
    /// The body (an object).
    pub body: Value,
}

/// A prompt of a request, as the client gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with BOS.
    Text(String),
    /// Token ids, fed as given.
    Ids(Vec<TokenId>),
}

impl Prompt {
    /// Its token ids under the byte tokenizer the simulator serves.
    pub fn ids(&self) -> Vec<TokenId> {
        match self {
            Prompt::Text(t) => ByteCodec.encode(t, true).unwrap_or_default(),
            Prompt::Ids(ids) => ids.clone(),
        }
    }

    /// Its text (an id prompt's, decoded).
    pub fn text(&self) -> String {
        match self {
            Prompt::Text(t) => t.clone(),
            Prompt::Ids(ids) => ByteCodec.decode(ids),
        }
    }
}

fn prompt_of(v: &Value) -> Option<Prompt> {
    match v {
        Value::String(s) => Some(Prompt::Text(s.clone())),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_u64().and_then(|n| TokenId::try_from(n).ok()))
            .collect::<Option<Vec<_>>>()
            .map(Prompt::Ids),
        _ => None,
    }
}

impl Request {
    /// The request a connection's first frame (`{"route", "body"}`) carries.
    pub fn of_frame(text: &str) -> Request {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        Request {
            route: v["route"].as_str().unwrap_or("").to_string(),
            body: v["body"].clone(),
        }
    }

    /// The prompts of a Completions body (`prompt`) or the inputs of an
    /// Embeddings one (`input`): one string or id array, or a list of them.
    /// `None` when the field is none of these (the request is refused).
    pub fn prompts(&self) -> Option<Vec<Prompt>> {
        let v = match self.route.as_str() {
            "completions" => &self.body["prompt"],
            "embeddings" => &self.body["input"],
            _ => return None,
        };
        match v {
            Value::Array(a) if a.first().is_some_and(|x| !x.is_number()) => {
                a.iter().map(prompt_of).collect()
            }
            other => prompt_of(other).map(|p| vec![p]),
        }
    }

    /// Choices a generating request asks for each prompt (`n`, 1 when
    /// absent).
    pub fn n(&self) -> u64 {
        self.body["n"].as_u64().unwrap_or(1)
    }

    /// Choices a generating request's answer holds: prompts times `n`.
    pub fn choices(&self) -> u64 {
        let prompts = match self.route.as_str() {
            "completions" => self.prompts().map_or(0, |p| p.len() as u64),
            _ => 1,
        };
        prompts.saturating_mul(self.n())
    }

    /// Its `max_completion_tokens`, else its `max_tokens`, when given (the
    /// newer name wins, as the codec reads them).
    pub fn max_tokens(&self) -> Option<u64> {
        match &self.body["max_completion_tokens"] {
            Value::Null => self.body["max_tokens"].as_u64(),
            newer => newer.as_u64(),
        }
    }

    /// A streamed request.
    pub fn stream(&self) -> bool {
        self.body["stream"] == true
    }
}

/// How a request's answer ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A `200` with this body.
    Reply(Value),
    /// An error before anything streamed: its status and body.
    Error(u16, Value),
    /// Chunks, then `done` (`None`) or an error (`Some`, its body).
    Stream(Vec<Value>, Option<Value>),
}

/// A whole answer.
#[derive(Debug)]
pub struct Answer<'a> {
    /// The request's connection.
    pub conn: ConnId,
    /// The request.
    pub request: &'a Request,
    /// How it ended.
    pub outcome: Outcome,
}

#[derive(Debug, Default)]
struct Live {
    request: Option<Request>,
    chunks: Vec<Value>,
    done: bool,
}

/// The `chat` requests in flight (see the module docs).
#[derive(Debug, Default)]
pub struct Answers {
    live: BTreeMap<ConnId, Live>,
}

impl Answers {
    /// Takes in an input: a request's connection opens, sends its frame,
    /// or hangs up.
    pub fn on_input(&mut self, input: &Input) {
        match input {
            Input::Open {
                conn,
                dialect: Dialect::Chat | Dialect::Anthropic,
                transport: Transport::Http,
                ..
            } => {
                self.live.insert(*conn, Live::default());
            }
            Input::Text { conn, text } => {
                if let Some(l) = self.live.get_mut(conn).filter(|l| l.request.is_none()) {
                    l.request = Some(Request::of_frame(text));
                }
            }
            Input::Closed { conn } => {
                self.live.remove(conn);
            }
            _ => {}
        }
    }

    /// The answer `out` ends, if it ends one.
    pub fn on_output(&mut self, out: &Output, frame: Option<&Frame>) -> Option<Answer<'_>> {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return None;
        };
        let l = self.live.get_mut(conn).filter(|l| !l.done)?;
        let data = f.v["data"].clone();
        let outcome = match f.v["kind"].as_str()? {
            "chunk" => {
                l.chunks.push(data);
                return None;
            }
            "done" => Outcome::Stream(std::mem::take(&mut l.chunks), None),
            "error" if !l.chunks.is_empty() => {
                Outcome::Stream(std::mem::take(&mut l.chunks), Some(data))
            }
            "error" => {
                let status = f.v["status"].as_u64().unwrap_or(0);
                Outcome::Error(u16::try_from(status).unwrap_or(0), data)
            }
            "reply" => Outcome::Reply(data),
            _ => return None,
        };
        l.done = true;
        Some(Answer {
            conn: *conn,
            request: l.request.as_ref()?,
            outcome,
        })
    }

    /// The Host crashed: every request is gone.
    pub fn clear(&mut self) {
        self.live.clear();
    }
}

/// One `chat` checker's judgement of whole answers: the requests it
/// judges, and how. [`OnAnswers`] runs it on every answer.
pub trait JudgeAnswer {
    /// The checker's name.
    fn name(&self) -> &'static str;
    /// Whether it judges `r` (a request with a field the API refuses is
    /// `chat_refusals`' alone).
    fn judges(&self, cx: &Cx<'_>, r: &Request) -> bool;
    /// Judges the answer `outcome` to `r`.
    fn judge(&self, cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check;
}

/// The [`Checker`] that runs a [`JudgeAnswer`] on every answer [`Answers`]
/// assembles, naming the request's route and connection on a violation.
#[derive(Debug)]
pub struct OnAnswers<J> {
    answers: Answers,
    judge: J,
}

impl<J: JudgeAnswer + 'static> OnAnswers<J> {
    /// `judge`, as a checker.
    pub fn checker(judge: J) -> Box<dyn Checker> {
        Box::new(OnAnswers {
            answers: Answers::default(),
            judge,
        })
    }
}

impl<J: JudgeAnswer> Checker for OnAnswers<J> {
    fn name(&self) -> &'static str {
        self.judge.name()
    }

    fn on_input(&mut self, _cx: &Cx<'_>, input: &Input) -> Check {
        self.answers.on_input(input);
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let Some(a) = self.answers.on_output(out, frame) else {
            return Ok(());
        };
        if !self.judge.judges(cx, a.request) {
            return Ok(());
        }
        self.judge
            .judge(cx, a.request, &a.outcome)
            .map_err(|e| format!("{} request on {:?}: {e}", a.request.route, a.conn))
    }

    fn on_crash(&mut self) {
        self.answers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(route: &str, body: Value) -> Request {
        Request {
            route: route.into(),
            body,
        }
    }

    #[test]
    fn prompts_are_read_as_the_api_lists_them() {
        let one = req("completions", json!({"prompt": "<c1>a"}));
        assert_eq!(one.prompts(), Some(vec![Prompt::Text("<c1>a".into())]));
        let ids = req("completions", json!({"prompt": [1, 66], "n": 2}));
        assert_eq!(ids.prompts(), Some(vec![Prompt::Ids(vec![1, 66])]));
        assert_eq!(ids.choices(), 2);
        let batch = req("completions", json!({"prompt": ["a", [1, 2]], "n": 3}));
        assert_eq!(batch.choices(), 6);
        assert_eq!(batch.prompts().map(|p| p[1].ids()), Some(vec![1, 2]));
        assert_eq!(Prompt::Text("ab".into()).ids(), vec![1, 100, 101]);
        assert_eq!(Prompt::Ids(vec![1, 100, 101]).text(), "ab");
        assert_eq!(req("completions", json!({"prompt": 5})).prompts(), None);
        assert_eq!(req("chat", json!({"n": 2})).choices(), 2);
    }
}
