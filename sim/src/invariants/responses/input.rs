//! `responses_input`: a create's messages reach the tokenizer as the
//! client wrote them. Each message of its `input` (a string input, a
//! message's string content, or its content parts' texts joined, read from
//! the frame itself) is the content of a message of the conversation the
//! Host asks to tokenize for it.

use tokenwire_core::{Output, TextWork};

use super::view::{RKind, RMsg, RStage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesInput;

impl Checker for ResponsesInput {
    fn name(&self) -> &'static str {
        "responses_input"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::Tokenize(job) = out else {
            return Ok(());
        };
        let Some(r) = cx.view.responses(&job.conn) else {
            return Ok(());
        };
        let Some(RMsg {
            kind: RKind::Create { texts, .. },
            stage: RStage::Sent,
            ..
        }) = r.head()
        else {
            return Ok(());
        };
        let TextWork::Chat { messages, .. } = &job.work else {
            return Err(format!(
                "a create on {:?} was tokenized as a raw prompt, not a conversation",
                job.conn
            ));
        };
        match texts
            .iter()
            .find(|t| !messages.iter().any(|m| m.content == **t))
        {
            Some(t) => Err(format!(
                "a create on {:?} said {t:?}, which no message of the conversation to tokenize holds",
                job.conn
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
    use tokenwire_core::text::byte::ByteCodec;
    use tokenwire_core::{ChatMessage, ConnId, Dialect, Role, TextJob, TextJobId};

    fn chat(contents: &[&str]) -> Output {
        Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages: contents
                    .iter()
                    .map(|c| ChatMessage::new(Role::User, *c))
                    .collect(),
                max_messages: usize::MAX,
                max_tokens: 100,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        })
    }

    #[test]
    fn content_parts_lost_on_the_way_to_the_tokenizer_are_caught() {
        let create = json!({"type": "response.create", "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "one "}, {"type": "input_text", "text": "two"}]},
            {"role": "developer", "content": "three"}]});
        let mut k = kit(Box::new(ResponsesInput));
        k.open_as(1, Dialect::Responses);
        k.text(1, create.clone()).expect("create");
        let e = k
            .out(chat(&["xyzzyxyzzy", "three"]))
            .expect_err("the parts' texts replaced");
        assert_eq!(e.invariant, "responses_input");
        assert!(e.detail.contains("one two"), "{}", e.detail);

        let mut k = kit(Box::new(ResponsesInput));
        k.open_as(1, Dialect::Responses);
        k.text(1, create).expect("create");
        k.out(chat(&["earlier turn", "one two", "three"]))
            .expect("every message as written");
    }
}
