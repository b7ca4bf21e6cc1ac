//! The tokenizer and chat template a GGUF file carries in its metadata
//! (`tokenizer.ggml.*`, `tokenizer.chat_template`), built as the
//! `tokenizer.json` document Hugging Face's own converters write for the
//! same model, then loaded by the `tokenizers` crate like any other:
//!
//! * `gpt2`: byte-level BPE from the vocabulary and merges, with the
//!   pre-tokenizer `tokenizer.ggml.pre` names (`smollm`, `gpt2`/`default`,
//!   `llama-bpe`, `qwen2`; any other is refused, since a wrong split gives
//!   wrong tokens silently).
//! * `llama`: SentencePiece BPE with byte fallback, its merges derived from
//!   the pieces' scores as `transformers` derives them.
//!
//! Control tokens (type 3) become special added tokens, user-defined ones
//! (type 4) plain added tokens, as in the original `tokenizer.json`.

use std::path::Path;

use serde_json::{json, Map, Value};
use tokenizers::Tokenizer;

use crate::chat::ChatTemplate;
use crate::error::LoadError;
use crate::gguf::{GgufFile, MetaValue};
use crate::tokenizer::HfCodec;

/// ggml's token types.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Pre-tokenizer regexes of the `gpt2`-type vocabularies whose split is not
/// the plain GPT-2 one (llama.cpp's `tokenizer.ggml.pre` names).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Texts of the tokens that end a chat turn in the families this engine
/// runs, whether or not a file names them (`tokenizer.ggml.eot_token_id`):
/// llama.cpp's converters wrote Phi-3 files, and older Llama 3 and Qwen
/// ones, with only the end-of-text token as EOS, and llama.cpp ends a
/// generation at these by name. (Not `<|endoftext|>`, which llama.cpp
/// also ends at: where it is not a file's EOS, as in SmolLM2's, the
/// Hugging Face checkpoint does not stop at it either.)
const TURN_END_TEXTS: &[&str] = &[
    "<|end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end_of_text|>",
];

/// The ids a generation from `file`'s model ends at besides its EOS: the
/// end of a turn and Llama 3.1's end of a message that calls a tool
/// (`tokenizer.ggml.eot_token_id`, `eom_token_id`), and any token whose
/// text is one of [`TURN_END_TEXTS`]; each below `vocab_size`.
pub fn turn_end_ids(file: &GgufFile, vocab_size: usize) -> Vec<u32> {
    let mut ids = Vec::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Ok(Some(id)) = file.uint(key) {
            ids.extend(u32::try_from(id).ok());
        }
    }
    if let Ok(Some(tokens)) = file.array("tokenizer.ggml.tokens") {
        let named = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| t.as_str().is_some_and(|t| TURN_END_TEXTS.contains(&t)));
        ids.extend(named.filter_map(|(i, _)| u32::try_from(i).ok()));
    }
    ids.retain(|&id| (id as usize) < vocab_size);
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The codec (tokenizer plus chat template) of the GGUF file at `path`.
pub fn codec_from_gguf(path: &Path, file: &GgufFile) -> Result<HfCodec, LoadError> {
    let err = |msg: String| LoadError::Gguf {
        path: path.to_path_buf(),
        msg,
    };
    let doc = tokenizer_json(file).map_err(err)?;
    let tokenizer =
        Tokenizer::from_bytes(doc.to_string().as_bytes()).map_err(|e| LoadError::Tokenizer {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
    let template = match file.str("tokenizer.chat_template").map_err(err)? {
        None => None,
        Some(src) => {
            let tokens = file.array("tokenizer.ggml.tokens").map_err(err)?;
            let text = |key: &str| -> Result<String, LoadError> {
                let id = file.uint(key).map_err(err)?;
                Ok(id
                    .and_then(|id| tokens?.get(id as usize)?.as_str())
                    .unwrap_or("")
                    .to_owned())
            };
            let (bos, eos) = (
                text("tokenizer.ggml.bos_token_id")?,
                text("tokenizer.ggml.eos_token_id")?,
            );
            Some(
                ChatTemplate::new(src, &bos, &eos).map_err(|msg| LoadError::ChatTemplate {
                    path: path.to_path_buf(),
                    msg,
                })?,
            )
        }
    };
    Ok(HfCodec::new(tokenizer, template))
}

/// The `tokenizer.json` document of `file`'s vocabulary.
fn tokenizer_json(file: &GgufFile) -> Result<Value, String> {
    let kind = file
        .str("tokenizer.ggml.model")?
        .ok_or("no `tokenizer.ggml.model` in the metadata: the file carries no tokenizer")?;
    let tokens: Vec<&str> = file
        .array("tokenizer.ggml.tokens")?
        .ok_or("no `tokenizer.ggml.tokens` in the metadata")?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .ok_or_else(|| format!("`tokenizer.ggml.tokens`[{i}] is not a string"))
        })
        .collect::<Result<_, _>>()?;
    if tokens.is_empty() {
        return Err("`tokenizer.ggml.tokens` is empty".into());
    }
    let types: Vec<i64> = match file.array("tokenizer.ggml.token_type")? {
        None => vec![1; tokens.len()],
        Some(a) if a.len() == tokens.len() => a
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or("`tokenizer.ggml.token_type` holds a non-integer")
            })
            .collect::<Result<_, _>>()?,
        Some(a) => {
            return Err(format!(
                "`tokenizer.ggml.token_type` has {} entries for {} tokens",
                a.len(),
                tokens.len()
            ))
        }
    };
    let id_of = |key: &str| -> Result<Option<usize>, String> {
        match file.uint(key)? {
            Some(id) if (id as usize) < tokens.len() => Ok(Some(id as usize)),
            Some(id) => Err(format!(
                "`{key}` is {id}, outside the {}-token vocabulary",
                tokens.len()
            )),
            None => Ok(None),
        }
    };
    let bos = id_of("tokenizer.ggml.bos_token_id")?;
    let unk = id_of("tokenizer.ggml.unknown_token_id")?;
    let eos = id_of("tokenizer.ggml.eos_token_id")?;
    let add_bos = file
        .get("tokenizer.ggml.add_bos_token")
        .and_then(MetaValue::as_bool);
    // Embedding models (Qwen3-Embedding) end every input with their
    // end-of-text token, as llama.cpp adds it with the special tokens.
    let add_eos = file
        .get("tokenizer.ggml.add_eos_token")
        .and_then(MetaValue::as_bool)
        .unwrap_or(false);

    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        // A duplicate piece keeps its first id, as the HF converters do.
        vocab.entry(t.to_string()).or_insert(json!(i));
    }
    let added: Vec<Value> = types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == CONTROL || t == USER_DEFINED)
        .map(|(i, &t)| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": t != CONTROL, "special": t == CONTROL})
        })
        .collect();

    let (model, normalizer, pre_tokenizer, decoder, default_bos) = match kind {
        "gpt2" => {
            let merges: Vec<&str> = file
                .array("tokenizer.ggml.merges")?
                .ok_or("a `gpt2` tokenizer without `tokenizer.ggml.merges`")?
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or("`tokenizer.ggml.merges` holds a non-string")
                })
                .collect::<Result<_, _>>()?;
            let pre = file.str("tokenizer.ggml.pre")?.unwrap_or("default");
            let byte_level = |use_regex: bool| {
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                       "use_regex": use_regex})
            };
            let split = |regex: &str| {
                json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
                       "invert": false})
            };
            let pre_tokenizer = match pre {
                "default" | "gpt2" => byte_level(true),
                "smollm" => json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
                    split(LLAMA3_SPLIT), byte_level(false)]}),
                "qwen2" => json!({"type": "Sequence", "pretokenizers": [
                    split(QWEN2_SPLIT), byte_level(false)]}),
                other => {
                    return Err(format!(
                        "pre-tokenizer `{other}` (`tokenizer.ggml.pre`) is not supported \
                         (default, gpt2, smollm, llama-bpe, qwen2 are)"
                    ))
                }
            };
            let model = json!({"type": "BPE", "dropout": null,
                "unk_token": unk.map(|u| tokens[u]), "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": pre == "llama-bpe" || pre == "llama3",
                "vocab": vocab, "merges": merges});
            let decoder = json!({"type": "ByteLevel", "add_prefix_space": true,
                                 "trim_offsets": true, "use_regex": true});
            (model, Value::Null, pre_tokenizer, decoder, false)
        }
        "llama" => {
            let scores: Vec<f64> = file
                .array("tokenizer.ggml.scores")?
                .ok_or("a `llama` tokenizer without `tokenizer.ggml.scores`")?
                .iter()
                .map(|v| {
                    v.as_f64()
                        .ok_or("`tokenizer.ggml.scores` holds a non-number")
                })
                .collect::<Result<_, _>>()?;
            if scores.len() != tokens.len() {
                return Err(format!(
                    "`tokenizer.ggml.scores` has {} entries for {} tokens",
                    scores.len(),
                    tokens.len()
                ));
            }
            let merges = sentencepiece_merges(&tokens, &types, &scores);
            let model = json!({"type": "BPE", "dropout": null,
                "unk_token": unk.map(|u| tokens[u]), "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                "ignore_merges": false, "vocab": vocab, "merges": merges});
            let add_space = file
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(MetaValue::as_bool)
                .unwrap_or(true);
            let mut norms = Vec::new();
            if add_space {
                norms.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
            }
            norms.push(json!({"type": "Replace", "pattern": {"String": " "},
                              "content": "\u{2581}"}));
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if add_space {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            (
                model,
                json!({"type": "Sequence", "normalizers": norms}),
                Value::Null,
                json!({"type": "Sequence", "decoders": decoders}),
                true,
            )
        }
        other => {
            return Err(format!(
            "tokenizer model `{other}` (`tokenizer.ggml.model`) is not supported (gpt2, llama are)"
        ))
        }
    };
    let first = bos.filter(|_| add_bos.unwrap_or(default_bos));
    let last = eos.filter(|_| add_eos);
    let post_processor = special_tokens_around(&tokens, first, last);
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor, "decoder": decoder, "model": model,
    }))
}

/// The post-processor that puts token `first` before a text's ids and
/// `last` after them (each when given), as the file's `add_bos_token` and
/// `add_eos_token` say; `null` when neither.
fn special_tokens_around(tokens: &[&str], first: Option<usize>, last: Option<usize>) -> Value {
    if first.is_none() && last.is_none() {
        return Value::Null;
    }
    let around = |seq: &str, type_id: u32| {
        let mut items = Vec::new();
        if let Some(b) = first {
            items.push(json!({"SpecialToken": {"id": tokens[b], "type_id": type_id}}));
        }
        items.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some(e) = last {
            items.push(json!({"SpecialToken": {"id": tokens[e], "type_id": type_id}}));
        }
        items
    };
    let mut pair = around("A", 0);
    pair.extend(around("B", 1));
    let mut special = Map::new();
    for id in [first, last].into_iter().flatten() {
        let t = tokens[id];
        special.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": around("A", 0), "pair": pair,
           "special_tokens": special})
}

/// Merges of a SentencePiece BPE vocabulary: every split of a normal piece
/// into two pieces of the vocabulary, best-scored merged piece first (ties
/// by the ids of the two halves), as `transformers`' converter orders them.
fn sentencepiece_merges(tokens: &[&str], types: &[i64], scores: &[f64]) -> Vec<[String; 2]> {
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, &t)| (t, i))
        .collect();
    let mut found = Vec::new();
    for (i, &piece) in tokens.iter().enumerate() {
        if types[i] != 1 {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                found.push((scores[i], li, ri));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    found
        .into_iter()
        .map(|(_, l, r)| [tokens[l].to_owned(), tokens[r].to_owned()])
        .collect()
}
