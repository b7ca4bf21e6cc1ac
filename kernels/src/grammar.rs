//! Structured output: the core's [`Grammar`]s compiled with llguidance over
//! the served model's vocabulary into [`TokenConstraint`]s.
//!
//! [`GrammarEngine::new`] builds llguidance's token trie once per model, from
//! the bytes each token stands for (read from the tokenizer's own
//! `tokenizer.json` form, so byte-level and SentencePiece vocabularies both
//! work); compiling a grammar is then milliseconds, and each mask
//! llguidance's usual tens of microseconds. JSON is compact (`,` and `:`,
//! no whitespace between tokens): the fewest tokens, and a small model
//! cannot wander off into whitespace until `max_tokens` cuts it short.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use tokenizers::Tokenizer;
use tokenwire_core::{Grammar, TokenConstraint, TokenId, TokenMask};

/// `text` as a Lark string literal that matches exactly it. llguidance
/// reads a literal's inside as a JSON string, and its lexer refuses control
/// characters and DEL raw (which JSON does not escape); every character
/// outside printable ASCII is written as `\uXXXX` (UTF-16 units, surrogate
/// pairs past the BMP), which covers them.
fn lark_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// Compiles grammars for one model's vocabulary.
pub struct GrammarEngine {
    factory: Arc<ParserFactory>,
    eos_ids: Arc<[TokenId]>,
    vocab: u32,
}

impl std::fmt::Debug for GrammarEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEngine")
            .field("vocab", &self.vocab)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

impl GrammarEngine {
    /// Builds the token trie of `tokenizer` for a model whose logits have
    /// `vocab_size` entries and whose generations end with any of
    /// `eos_ids`. Fails (a message for operators) when the tokenizer's
    /// token bytes cannot be read or there is no end-of-sequence token.
    pub fn new(
        tokenizer: &Tokenizer,
        vocab_size: u32,
        eos_ids: &[TokenId],
    ) -> Result<GrammarEngine, String> {
        let eos: Vec<TokenId> = eos_ids
            .iter()
            .copied()
            .filter(|&e| e < vocab_size)
            .collect();
        let Some(&first_eos) = eos.first() else {
            return Err("the model has no end-of-sequence token in its vocabulary, which structured output needs to end a generation".into());
        };
        let tokenizer_json: Value = serde_json::from_str(
            &tokenizer
                .to_string(false)
                .map_err(|e| format!("serializing the tokenizer: {e}"))?,
        )
        .map_err(|e| format!("reading the tokenizer's JSON: {e}"))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&tokenizer_json)
            .map_err(|e| format!("reading the tokenizer's token bytes: {e}"))?;
        // Logit rows past the tokenizer's ids (padding) are tokens that
        // stand for nothing: never allowed.
        words.resize(vocab_size as usize, Vec::new());
        words.truncate(vocab_size as usize);
        let info = TokRxInfo::new(vocab_size, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        // Text a grammar forces is tokenized greedily over the trie, not by
        // the model's tokenizer: a SentencePiece normalizer would prepend a
        // space to every piece it is given.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| format!("building the grammar engine: {e}"))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits::default();
        Ok(GrammarEngine {
            factory: Arc::new(factory),
            eos_ids: eos.into(),
            vocab: vocab_size,
        })
    }

    /// Compiles `grammar` into a constraint that has taken no token yet.
    /// Errors name what the grammar asks that cannot be enforced.
    pub fn compile(&self, grammar: &Grammar) -> Result<Box<dyn TokenConstraint>, String> {
        let top = match grammar {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(json!({"type": "object"}), false))
            }
            Grammar::JsonSchema { schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err("the JSON schema must be an object".into());
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone(), !strict))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Choice(choices) => {
                let alternatives: Vec<String> = choices.iter().map(|c| lark_literal(c)).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
        };
        let what = match grammar {
            Grammar::JsonObject | Grammar::JsonSchema { .. } => "the schema",
            Grammar::Lark(_) => "the grammar",
            Grammar::Regex(_) => "the regular expression",
            Grammar::Choice(_) => "the choice",
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| format!("{what} cannot be enforced: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("{what} cannot be enforced: {e}"));
        }
        Ok(Box::new(LlgConstraint {
            matcher,
            eos_ids: Arc::clone(&self.eos_ids),
            ended: false,
        }))
    }

    /// The vocabulary size masks cover.
    pub fn vocab_size(&self) -> u32 {
        self.vocab
    }
}

/// The schema with llguidance's layout options: compact separators, and
/// with `lenient` unknown keywords ignored rather than refused.
fn compact(mut schema: Value, lenient: bool) -> Value {
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ",",
                "key_separator": ":",
                "lenient": lenient,
            }),
        );
    }
    schema
}

/// One generation's llguidance matcher.
struct LlgConstraint {
    matcher: Matcher,
    eos_ids: Arc<[TokenId]>,
    /// An end-of-sequence token was taken: nothing more may come.
    ended: bool,
}

impl TokenConstraint for LlgConstraint {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        mask.clear();
        if self.ended || self.matcher.is_stopped() {
            for &e in self.eos_ids.iter() {
                mask.allow(e);
            }
            return Ok(());
        }
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        for (dst, src) in mask.words_mut().iter_mut().zip(allowed.as_slice()) {
            *dst = *src;
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<(), String> {
        if self.ended {
            return Err("the output already ended".into());
        }
        if self.eos_ids.contains(&token) {
            // Every end-of-sequence id ends it, where the grammar allows an end.
            if self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false) {
                self.ended = true;
                return Ok(());
            }
            return Err("the output cannot end here".into());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(LlgConstraint {
            matcher: self.matcher.deep_clone(),
            eos_ids: Arc::clone(&self.eos_ids),
            ended: self.ended,
        })
    }
}
