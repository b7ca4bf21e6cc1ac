//! Small deterministic parts for tests, examples and the simulator: a byte-level
//! tokenizer and a scripted engine that needs no model.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::{ModelInfo, SeqId, StepDone, StepPlan, SeqResult, TokenId, TokenLogprobs};
use crate::text::{SharedCodec, TextCodec};

/// Id of the beginning-of-sequence token in [`ByteCodec`].
pub const BYTE_BOS: TokenId = 1;
/// Id of the end-of-sequence token in [`ByteCodec`].
pub const BYTE_EOS: TokenId = 2;
/// Offset of byte `b`'s token id in [`ByteCodec`] (`id = b + BYTE_OFFSET`).
pub const BYTE_OFFSET: TokenId = 3;
/// Vocabulary size of [`ByteCodec`]: 0 unk, 1 BOS, 2 EOS, then 256 bytes.
pub const BYTE_VOCAB: u32 = 259;

/// A byte-level tokenizer: one token per UTF-8 byte, BOS = 1, EOS = 2.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteCodec;

impl ByteCodec {
    /// The codec as a [`SharedCodec`].
    pub fn shared() -> SharedCodec {
        SharedCodec(Arc::new(ByteCodec))
    }
}

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String> {
        let mut ids = Vec::with_capacity(text.len() + 1);
        if add_special {
            ids.push(BYTE_BOS);
        }
        ids.extend(text.bytes().map(|b| b as TokenId + BYTE_OFFSET));
        Ok(ids)
    }

    fn decode(&self, ids: &[TokenId]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter(|&&id| (BYTE_OFFSET..BYTE_OFFSET + 256).contains(&id))
            .map(|&id| (id - BYTE_OFFSET) as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Model info for a tiny byte-level model: context 512, 64 blocks of 16.
pub fn tiny_model_info() -> ModelInfo {
    ModelInfo {
        name: "tiny".into(),
        version: "test".into(),
        context_len: 512,
        vocab_size: BYTE_VOCAB,
        eos_ids: vec![BYTE_EOS],
        block_size: 16,
        num_blocks: 64,
        dtype: "f32".into(),
    }
}

/// A deterministic engine that needs no model: the token sampled after position
/// `p` is `script[(p + 1) % script.len()]` as a byte token (a `0` byte means EOS).
/// Because the choice depends only on the position, a sequence that is paused,
/// evicted and recomputed continues with the same tokens.
#[derive(Debug, Clone)]
pub struct ScriptEngine {
    script: Vec<u8>,
    /// Tokens fed per sequence, as the engine saw them (checks plan consistency).
    pub history: HashMap<SeqId, Vec<TokenId>>,
    /// Steps run so far.
    pub steps: u64,
}

impl ScriptEngine {
    /// An engine that writes `script` over and over (by position).
    pub fn new(script: &str) -> Self {
        ScriptEngine {
            script: script.as_bytes().to_vec(),
            history: HashMap::new(),
            steps: 0,
        }
    }

    /// Runs one step. Panics if the plan feeds positions out of order: a test
    /// engine should shout about a scheduler bug.
    pub fn step(&mut self, plan: &StepPlan) -> StepDone {
        self.steps += 1;
        for seq in &plan.free {
            self.history.remove(seq);
        }
        let mut results = Vec::new();
        for s in &plan.seqs {
            let h = self.history.entry(s.seq).or_default();
            assert!(
                h.len() >= s.start_pos as usize,
                "seq {:?} fed at {} but engine holds {} tokens",
                s.seq,
                s.start_pos,
                h.len()
            );
            h.truncate(s.start_pos as usize);
            h.extend_from_slice(&s.tokens);
            if s.sample {
                let p = s.start_pos as usize + s.tokens.len() - 1;
                let byte = self.script[(p + 1) % self.script.len()];
                let token = if byte == 0 {
                    BYTE_EOS
                } else {
                    byte as TokenId + BYTE_OFFSET
                };
                let logprobs = s.logprobs.map(|n| TokenLogprobs {
                    logprob: -0.5,
                    top: (0..n as TokenId)
                        .map(|i| (token + i, -0.5 - i as f32))
                        .collect(),
                });
                results.push(SeqResult {
                    seq: s.seq,
                    token,
                    logprobs,
                });
            }
        }
        StepDone {
            step_id: plan.step_id,
            results,
        }
    }
}
