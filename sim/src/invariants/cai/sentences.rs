//! `cai_sentences`: nothing of a streamed reply is lost, doubled or out of
//! order. Per request, `CONTENT_CHUNK` indices run 0, 1, 2, ... and every
//! chunk has text; `SENTENCE_BOUNDARY` indices run 0, 1, 2, ..., every
//! sentence has text, and the sentences so far always concatenate to a
//! prefix of the chunks so far (a boundary comes after the chunk that ends
//! its sentence). At `STREAM_COMPLETE` the chunks concatenate to
//! `fullContent` and the sentences to `fullContent` without its trailing
//! whitespace. An `INTERRUPTED_ACK`'s `partialContent` starts with the
//! chunks sent (it may hold more: text generated but still waiting for the
//! client's window is part of what was generated).

use tokenwire_core::Output;

use super::view::rid_of;
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiSentences;

impl Checker for CaiSentences {
    fn name(&self) -> &'static str {
        "cai_sentences"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(a) = cx.view.cai(conn) else {
            return Ok(());
        };
        let rid = rid_of(f).unwrap_or("");
        let Some(r) = a.requests.get(rid) else {
            return Ok(());
        };
        let p = &f.v["payload"];
        match f.kind() {
            "CONTENT_CHUNK" => {
                let index = p["index"].as_u64();
                if index != Some(r.chunks) {
                    return Err(format!(
                        "chunk {index:?} of {rid:?} on {conn:?}; {} chunks came before",
                        r.chunks
                    ));
                }
                if p["content"].as_str().is_none_or(str::is_empty) {
                    return Err(format!("empty chunk {} of {rid:?} on {conn:?}", r.chunks));
                }
            }
            "SENTENCE_BOUNDARY" => {
                let index = p["sentenceIndex"].as_u64();
                if index != Some(r.sentences) {
                    return Err(format!(
                        "sentence {index:?} of {rid:?} on {conn:?}; {} sentences came before",
                        r.sentences
                    ));
                }
                let sentence = p["sentence"].as_str().unwrap_or("");
                if sentence.is_empty() {
                    return Err(format!(
                        "empty sentence {} of {rid:?} on {conn:?}",
                        r.sentences
                    ));
                }
                let so_far = format!("{}{sentence}", r.sentence_text);
                if !r.text.starts_with(&so_far) {
                    return Err(format!(
                        "sentences of {rid:?} on {conn:?} make {:?}, which the chunks so far {:?} do not start with",
                        clip(&so_far),
                        clip(&r.text)
                    ));
                }
            }
            "STREAM_COMPLETE" if r.stream => {
                let full = p["fullContent"].as_str().unwrap_or("");
                if full != r.text {
                    return Err(format!(
                        "fullContent of {rid:?} on {conn:?} is {:?}, its {} chunks make {:?}",
                        clip(full),
                        r.chunks,
                        clip(&r.text)
                    ));
                }
                if r.sentence_text != full.trim_end() {
                    return Err(format!(
                        "the {} sentences of {rid:?} on {conn:?} make {:?}, not its fullContent {:?} (trailing whitespace trimmed)",
                        r.sentences,
                        clip(&r.sentence_text),
                        clip(full.trim_end())
                    ));
                }
            }
            "INTERRUPTED_ACK" => {
                let partial = p["partialContent"].as_str().unwrap_or("");
                if !partial.starts_with(&r.text) {
                    return Err(format!(
                        "partialContent of {rid:?} on {conn:?} is {:?}, which does not start with the chunks sent {:?}",
                        clip(partial),
                        clip(&r.text)
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{cai_kit, Kit};
    use serde_json::{json, Value};

    fn chunk(i: u64, c: &str) -> Value {
        json!({"type": "CONTENT_CHUNK", "requestId": "r1", "payload": {"content": c, "index": i}})
    }

    fn sentence(i: u64, s: &str) -> Value {
        json!({"type": "SENTENCE_BOUNDARY", "requestId": "r1",
               "payload": {"sentence": s, "sentenceIndex": i}})
    }

    fn complete(full: &str) -> Value {
        json!({"type": "STREAM_COMPLETE", "requestId": "r1", "payload": {"fullContent": full}})
    }

    fn streaming() -> Kit {
        let mut k = cai_kit(Box::new(CaiSentences));
        k.open_cai(1);
        k.completion(1, "r1", json!({})).expect("accepted");
        k.tokenized(1).expect("tokenized");
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r1", "timestamp": "t"}),
        )
        .expect("start");
        k.end().expect("end");
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k
    }

    #[test]
    fn skipped_indices_are_caught() {
        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        let e = k.send(1, chunk(2, "x")).expect_err("skipped");
        assert_eq!(e.invariant, "cai_sentences");
        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        let e = k.send(1, sentence(1, "Hi.")).expect_err("skipped");
        assert!(e.detail.contains("sentence Some(1)"), "{}", e.detail);
    }

    #[test]
    fn texts_that_do_not_add_up_are_caught() {
        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        let e = k.send(1, sentence(0, "Ho.")).expect_err("not the text");
        assert!(e.detail.contains("do not start with"), "{}", e.detail);

        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        k.send(1, sentence(0, "Hi.")).expect("sentence");
        k.send(1, chunk(1, "Yo ")).expect("chunk");
        let e = k.send(1, complete("Hi. Yo")).expect_err("chunks differ");
        assert!(e.detail.contains("fullContent"), "{}", e.detail);

        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        k.send(1, sentence(0, "Hi.")).expect("sentence");
        k.send(1, chunk(1, "Yo ")).expect("chunk");
        let e = k
            .send(1, complete("Hi. Yo "))
            .expect_err("last sentence lost");
        assert!(e.detail.contains("sentences"), "{}", e.detail);

        let mut k = streaming();
        k.send(1, chunk(0, "Hi. ")).expect("chunk");
        k.send(1, sentence(0, "Hi.")).expect("sentence");
        k.send(1, chunk(1, "Yo ")).expect("chunk");
        k.send(1, sentence(1, " Yo")).expect("sentence");
        k.send(1, complete("Hi. Yo ")).expect("all adds up");
    }
}
