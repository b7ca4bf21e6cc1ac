//! A byte-level codec: one token per UTF-8 byte. The tokenizer of the
//! built-in random tiny model (`--random-model`), of the simulator's swarms,
//! and of tests that need no tokenizer file.

use std::sync::Arc;

use crate::engine::TokenId;
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

    fn max_token_bytes(&self) -> Option<usize> {
        Some(1)
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
