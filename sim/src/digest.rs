//! SHA-256 digests of everything the Host was given and everything it
//! produced: two runs (or a run and its replay) are the same when both match.

use sha2::{Digest as _, Sha256};
use tokenwire_core::{Input, Output};

/// A running SHA-256 over a stream of inputs or outputs.
#[derive(Clone, Default)]
pub struct Digest {
    h: Sha256,
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest")
    }
}

impl Digest {
    fn u64(&mut self, v: u64) {
        self.h.update(v.to_le_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.h.update(b);
    }

    /// Adds a marker (a crash, for instance).
    pub fn mark(&mut self, tag: &str, v: u64) {
        self.bytes(tag.as_bytes());
        self.u64(v);
    }

    /// Adds one input.
    pub fn input(&mut self, input: &Input) {
        match input {
            Input::Text { conn, text } => {
                self.u64(1);
                self.u64(conn.0);
                self.bytes(text.as_bytes());
            }
            other => self.bytes(format!("{other:?}").as_bytes()),
        }
    }

    /// Adds one output.
    pub fn output(&mut self, out: &Output) {
        match out {
            Output::Send { conn, text } => {
                self.u64(1);
                self.u64(conn.0);
                self.bytes(text.as_bytes());
            }
            Output::RunStep(p) => {
                self.u64(2);
                self.u64(p.step_id);
                for s in &p.seqs {
                    self.u64(s.seq.0);
                    self.u64(u64::from(s.start_pos));
                    self.u64(s.tokens.len() as u64);
                    for t in &s.tokens {
                        self.h.update(t.to_le_bytes());
                    }
                    for b in &s.block_table {
                        self.h.update(b.to_le_bytes());
                    }
                    for t in &s.draft {
                        self.h.update(t.to_le_bytes());
                    }
                    self.u64(s.sampling.seed);
                    self.h.update(s.sampling.temperature.to_le_bytes());
                    self.h.update(s.sampling.top_p.to_le_bytes());
                    self.h.update(s.sampling.top_k.to_le_bytes());
                    self.h.update(s.sampling.repetition_penalty.to_le_bytes());
                    self.u64(u64::from(s.sample));
                    self.u64(s.logprobs.map_or(u64::MAX, u64::from));
                }
                for f in &p.free {
                    self.u64(f.0);
                }
                for (a, b) in &p.copy_blocks {
                    self.u64(u64::from(*a) << 32 | u64::from(*b));
                }
            }
            other => self.bytes(format!("{other:?}").as_bytes()),
        }
    }

    /// The digest so far, as hex.
    pub fn hex(&self) -> String {
        self.h
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
