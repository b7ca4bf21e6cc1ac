//! One `cai` request's outbound stream under flow control: its content
//! chunks and sentence boundaries, in order, released only as far as the
//! client's windows allow.
//!
//! Two windows, each off until the client uses it:
//! - the chunk window (`options.window`, or 32 once the client sends any
//!   `AWAIT_MORE`): at most `window` chunks beyond the last acknowledged
//!   index;
//! - the sentence window (`options.sentenceWindow`): at most that many
//!   sentences beyond the last one the client completed.
//!
//! Items leave strictly in order: a boundary waiting for the sentence window
//! keeps the chunks behind it waiting too, so a client never sees a sentence's
//! text before the boundary of the sentence before it. While anything waits,
//! or the next item could not leave, the request is [`Outbox::blocked`], and
//! the dialect holds its generation's compute.

use std::collections::VecDeque;

use crate::gen::sentence::SentenceSplitter;

/// The chunk window a client gets when it sends `AWAIT_MORE` without having
/// set `options.window`.
pub const DEFAULT_WINDOW: u32 = 32;

/// Something ready to be sent, with its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// A `CONTENT_CHUNK`.
    Chunk {
        /// Its index (from 0).
        index: u64,
        /// Its text.
        content: String,
    },
    /// A `SENTENCE_BOUNDARY`.
    Boundary {
        /// The sentence's index (from 0).
        index: u64,
        /// The sentence.
        sentence: String,
    },
    /// Everything before was sent: the stream may end.
    End,
}

#[derive(Debug)]
enum Item {
    Chunk(String),
    Boundary(String),
    End,
}

/// Why an acknowledgement was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckError(pub String);

/// A request's outbound stream.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<Item>,
    splitter: SentenceSplitter,
    chunks_sent: u64,
    /// Chunks acknowledged (the last received index plus one).
    chunks_acked: u64,
    window: Option<u32>,
    sentences_sent: u64,
    /// Sentences completed (the last completed index plus one).
    sentences_done: u64,
    sentence_window: Option<u32>,
}

impl Outbox {
    /// An outbox with the windows the request set (`None`: off).
    pub fn new(window: Option<u32>, sentence_window: Option<u32>) -> Outbox {
        Outbox {
            window,
            sentence_window,
            ..Outbox::default()
        }
    }

    /// Queues generated text: a chunk, then the sentences it completed.
    pub fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.queue.push_back(Item::Chunk(text.to_string()));
        for s in self.splitter.push(text) {
            self.queue.push_back(Item::Boundary(s));
        }
    }

    /// The text is over: the last sentence (if any text is left), then the end.
    pub fn finish(&mut self) {
        if let Some(rest) = self.splitter.finish() {
            self.queue.push_back(Item::Boundary(rest));
        }
        self.queue.push_back(Item::End);
    }

    fn chunk_room(&self) -> bool {
        self.window
            .is_none_or(|w| self.chunks_sent < self.chunks_acked + u64::from(w))
    }

    fn sentence_room(&self) -> bool {
        self.sentence_window
            .is_none_or(|w| self.sentences_sent < self.sentences_done + u64::from(w))
    }

    /// Takes what may be sent now, in order.
    pub fn release(&mut self) -> Vec<Release> {
        let mut out = Vec::new();
        while let Some(item) = self.queue.front() {
            let ok = match item {
                Item::Chunk(_) => self.chunk_room(),
                Item::Boundary(_) => self.sentence_room(),
                Item::End => true,
            };
            if !ok {
                break;
            }
            match self.queue.pop_front() {
                Some(Item::Chunk(content)) => {
                    out.push(Release::Chunk {
                        index: self.chunks_sent,
                        content,
                    });
                    self.chunks_sent += 1;
                }
                Some(Item::Boundary(sentence)) => {
                    out.push(Release::Boundary {
                        index: self.sentences_sent,
                        sentence,
                    });
                    self.sentences_sent += 1;
                }
                Some(Item::End) => out.push(Release::End),
                None => break,
            }
        }
        out
    }

    /// True when the generation should not be computed: something waits for
    /// a window, or a window is full so that the next chunk or sentence could
    /// not leave.
    pub fn blocked(&self) -> bool {
        !self.queue.is_empty() || !self.chunk_room() || !self.sentence_room()
    }

    /// `AWAIT_MORE`: chunks up to `last` (all sent so far when `None`) were
    /// received. Turns the chunk window on if it was off.
    pub fn ack_chunks(&mut self, last: Option<u64>) -> Result<(), AckError> {
        let acked = match last {
            None => self.chunks_sent,
            Some(i) if i < self.chunks_sent => i + 1,
            Some(i) => {
                return Err(AckError(format!(
                    "`payload.lastReceivedIndex` is {i} but only {} chunks were sent",
                    self.chunks_sent
                )))
            }
        };
        self.chunks_acked = self.chunks_acked.max(acked);
        self.window.get_or_insert(DEFAULT_WINDOW);
        Ok(())
    }

    /// `SENTENCE_COMPLETED`: sentences up to `index` were processed.
    pub fn complete_sentence(&mut self, index: u64) -> Result<(), AckError> {
        if index >= self.sentences_sent {
            return Err(AckError(format!(
                "`payload.sentenceIndex` is {index} but only {} sentences were sent",
                self.sentences_sent
            )));
        }
        self.sentences_done = self.sentences_done.max(index + 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(r: &[Release]) -> Vec<u64> {
        r.iter()
            .filter_map(|x| match x {
                Release::Chunk { index, .. } => Some(*index),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn without_windows_everything_leaves_at_once() {
        let mut o = Outbox::new(None, None);
        o.push("Hi there. ");
        o.push("Bye");
        o.finish();
        let r = o.release();
        assert_eq!(
            r,
            vec![
                Release::Chunk {
                    index: 0,
                    content: "Hi there. ".into()
                },
                Release::Boundary {
                    index: 0,
                    sentence: "Hi there.".into()
                },
                Release::Chunk {
                    index: 1,
                    content: "Bye".into()
                },
                Release::Boundary {
                    index: 1,
                    sentence: " Bye".into()
                },
                Release::End,
            ]
        );
        assert!(!o.blocked());
    }

    #[test]
    fn the_chunk_window_holds_chunks_until_acknowledged() {
        let mut o = Outbox::new(Some(2), None);
        for t in ["a", "b", "c", "d"] {
            o.push(t);
        }
        assert_eq!(chunks(&o.release()), vec![0, 1]);
        assert!(o.blocked());
        assert!(o.ack_chunks(Some(5)).is_err(), "not sent yet");
        assert!(
            o.ack_chunks(Some(2)).is_err(),
            "the first index not sent yet"
        );
        o.ack_chunks(Some(0)).expect("sent");
        assert_eq!(chunks(&o.release()), vec![2]);
        o.ack_chunks(Some(0)).expect("an old ack changes nothing");
        assert!(o.release().is_empty());
        o.ack_chunks(None).expect("everything sent");
        assert_eq!(chunks(&o.release()), vec![3]);
        assert!(!o.blocked(), "one more chunk may leave");
        o.push("e");
        assert_eq!(chunks(&o.release()), vec![4]);
        assert!(o.blocked(), "window full again");
    }

    #[test]
    fn await_more_turns_the_default_window_on() {
        let mut o = Outbox::new(None, None);
        o.push("x");
        o.release();
        o.ack_chunks(Some(0)).expect("ok");
        for _ in 0..40 {
            o.push("y");
        }
        assert_eq!(o.release().len(), DEFAULT_WINDOW as usize);
        assert!(o.blocked());
    }

    #[test]
    fn the_sentence_window_keeps_later_chunks_behind_its_boundary() {
        let mut o = Outbox::new(None, Some(1));
        o.push("One. ");
        o.push("Two. ");
        o.push("Three");
        let r = o.release();
        // The space after "One." shows that it ended; "Two." waits for it to
        // be completed, and "Three" waits behind that boundary.
        assert_eq!(
            r,
            vec![
                Release::Chunk {
                    index: 0,
                    content: "One. ".into()
                },
                Release::Boundary {
                    index: 0,
                    sentence: "One.".into()
                },
                Release::Chunk {
                    index: 1,
                    content: "Two. ".into()
                },
            ]
        );
        assert!(o.blocked());
        assert!(o.complete_sentence(1).is_err(), "not sent yet");
        o.complete_sentence(0).expect("sent");
        let r = o.release();
        assert_eq!(
            r[0],
            Release::Boundary {
                index: 1,
                sentence: " Two.".into()
            }
        );
        assert_eq!(chunks(&r), vec![2]);
        o.finish();
        assert!(o.release().is_empty(), "the last sentence waits too");
        o.complete_sentence(1).expect("sent");
        assert_eq!(
            o.release(),
            vec![
                Release::Boundary {
                    index: 2,
                    sentence: " Three".into()
                },
                Release::End
            ]
        );
    }
}
