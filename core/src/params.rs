//! Sampling parameters, validated in one place for every dialect (PROTOCOLS.md).

use serde_json::{json, Map, Value};

use crate::engine::{LogitBias, SamplingParams, TokenId};
use crate::json::{f32_number, FieldError, Fields};

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 8;
/// Longest stop string in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Most top alternatives reported with logprobs.
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Effective generation parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// 0..=2; 0 = greedy.
    pub temperature: f32,
    /// (0, 1].
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// > 0; 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty, -2..=2; 0 = off.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, -2..=2; 0 = off.
    pub frequency_penalty: f32,
    /// Strings that end the generation; never streamed.
    pub stop: Vec<String>,
    /// Explicit seed, if the client gave one.
    pub seed: Option<u64>,
    /// Alternatives per token when logprobs are asked for.
    pub top_logprobs: u8,
    /// OpenAI `logit_bias` (Chat Completions and Completions); empty = off.
    pub logit_bias: LogitBias,
    /// Min-p (an extension on Chat Completions and Completions); 0 = off.
    pub min_p: f32,
    /// vLLM's `min_tokens`: the end-of-sequence tokens are not sampled
    /// before this many tokens; 0 = off.
    pub min_tokens: u32,
    /// vLLM's `ignore_eos`: an end-of-sequence token does not end the
    /// generation (it adds no text); `max_tokens` or a stop string does.
    pub ignore_eos: bool,
    /// vLLM's `stop_token_ids`: tokens that end the generation as an
    /// end-of-sequence token does (their text left out), `ignore_eos` or
    /// not; `min_tokens` holds them back too.
    pub stop_token_ids: Vec<TokenId>,
    /// vLLM's `include_stop_str_in_output`: the stop string that ends the
    /// generation is part of its text (at its end) instead of cut off.
    pub include_stop_str: bool,
}

impl GenParams {
    /// Defaults: `max_tokens` as configured, temperature 1, no filters, no stops.
    pub fn defaults(default_max_tokens: u32) -> Self {
        GenParams {
            max_tokens: default_max_tokens,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            stop: Vec::new(),
            seed: None,
            top_logprobs: 5,
            logit_bias: LogitBias::default(),
            min_p: 0.0,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            include_stop_str: false,
        }
    }

    /// The engine's view, with the seed actually used; `prompt_tokens` is
    /// where the generated tokens start, `eos_ids` (with `stop_token_ids`)
    /// what `min_tokens` holds back.
    pub fn sampling(&self, seed: u64, prompt_tokens: u32, eos_ids: &[TokenId]) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            generated_from: prompt_tokens,
            logit_bias: self.logit_bias.clone(),
            min_tokens: self.min_tokens,
            stop_ids: if self.min_tokens > 0 {
                eos_ids
                    .iter()
                    .chain(&self.stop_token_ids)
                    .copied()
                    .collect()
            } else {
                Default::default()
            },
            seed,
        }
    }

    /// The effective values as JSON (for `modified` acknowledgements); floats
    /// are the shortest decimals that read back to the stored `f32`s.
    pub fn to_json(&self) -> Value {
        json!({
            "max_tokens": self.max_tokens,
            "temperature": f32_number(self.temperature),
            "top_p": f32_number(self.top_p),
            "top_k": self.top_k,
            "repetition_penalty": f32_number(self.repetition_penalty),
            "stop": self.stop,
            "seed": self.seed,
            "top_logprobs": self.top_logprobs,
        })
    }
}

/// The names a dialect uses for each parameter (they differ between
/// dialects); an empty name is a parameter the dialect does not have.
#[derive(Debug, Clone, Copy)]
pub struct ParamNames {
    /// e.g. `max_tokens`, `max_output_tokens`, `max_new_tokens`.
    pub max_tokens: &'static str,
    /// Usually `temperature`.
    pub temperature: &'static str,
    /// Usually `top_p`.
    pub top_p: &'static str,
    /// Usually `top_k`.
    pub top_k: &'static str,
    /// Usually `repetition_penalty`.
    pub repetition_penalty: &'static str,
    /// Usually `stop`.
    pub stop: &'static str,
    /// Usually `seed`.
    pub seed: &'static str,
    /// Usually `top_logprobs`.
    pub top_logprobs: &'static str,
}

impl ParamNames {
    /// The common names (`max_tokens`, `temperature`, ...).
    pub const STANDARD: ParamNames = ParamNames {
        max_tokens: "max_tokens",
        temperature: "temperature",
        top_p: "top_p",
        top_k: "top_k",
        repetition_penalty: "repetition_penalty",
        stop: "stop",
        seed: "seed",
        top_logprobs: "top_logprobs",
    };
}

/// Reads field `name` with `read`, unless `name` is empty: a dialect
/// without that field (an empty name in [`ParamNames`]) never reads it,
/// even from a body with an empty key.
fn named<T>(
    name: &str,
    read: impl FnOnce(&str) -> Result<Option<T>, FieldError>,
) -> Result<Option<T>, FieldError> {
    if name.is_empty() {
        Ok(None)
    } else {
        read(name)
    }
}

/// Applies the fields present in `obj` onto `base`, validating each; fields
/// absent keep `base`'s value. `prefix` names the enclosing object in errors
/// (e.g. `"parameters."`). Nothing is applied when any field is invalid.
pub fn apply(
    obj: &Map<String, Value>,
    prefix: &str,
    names: &ParamNames,
    base: &GenParams,
    context_len: u32,
) -> Result<GenParams, FieldError> {
    let f = Fields::new(obj, prefix);
    let name = |n: &str| format!("{prefix}{n}");
    let mut p = base.clone();
    if let Some(v) = named(names.max_tokens, |n| f.u64(n))? {
        if v < 1 || v > context_len as u64 {
            return Err(FieldError::new(
                name(names.max_tokens),
                format!("must be between 1 and the context length {context_len}, got {v}"),
            ));
        }
        p.max_tokens = v as u32;
    }
    // Floats are checked as they will be stored (f32), so a value that passes
    // in f64 but rounds to zero, a subnormal or infinity is refused.
    if let Some(v) = named(names.temperature, |n| f.f64(n))? {
        let t = v as f32;
        if !(0.0..=2.0).contains(&t) {
            return Err(FieldError::new(
                name(names.temperature),
                format!("must be between 0 and 2, got {v}"),
            ));
        }
        p.temperature = t;
    }
    if let Some(v) = named(names.top_p, |n| f.f64(n))? {
        let t = v as f32;
        if !(v > 0.0 && v <= 1.0) {
            return Err(FieldError::new(
                name(names.top_p),
                format!("must be greater than 0 and at most 1, got {v}"),
            ));
        }
        if !t.is_normal() {
            return Err(too_small(&name(names.top_p), v));
        }
        p.top_p = t;
    }
    if let Some(v) = named(names.top_k, |n| f.u64(n))? {
        p.top_k = u32::try_from(v).unwrap_or(u32::MAX);
    }
    if let Some(v) = named(names.repetition_penalty, |n| f.f64(n))? {
        let t = v as f32;
        if !(v > 0.0 && t.is_finite()) {
            return Err(FieldError::new(
                name(names.repetition_penalty),
                format!("must be greater than 0 and at most {}, got {v}", f32::MAX),
            ));
        }
        if !t.is_normal() {
            return Err(too_small(&name(names.repetition_penalty), v));
        }
        p.repetition_penalty = t;
    }
    if let Some(v) = f.raw(names.stop).filter(|_| !names.stop.is_empty()) {
        p.stop = parse_stop(v, &name(names.stop))?;
    }
    if let Some(v) = named(names.seed, |n| f.u64(n))? {
        p.seed = Some(v);
    }
    if let Some(v) = named(names.top_logprobs, |n| f.u64(n))? {
        if v > MAX_TOP_LOGPROBS {
            return Err(FieldError::new(
                name(names.top_logprobs),
                format!("must be at most {MAX_TOP_LOGPROBS}, got {v}"),
            ));
        }
        p.top_logprobs = v as u8;
    }
    Ok(p)
}

/// The error for a positive value too close to 0 to keep as a 32-bit float.
fn too_small(field: &str, v: f64) -> FieldError {
    FieldError::new(
        field,
        format!(
            "must be at least {} (the smallest normal 32-bit float), got {v}",
            f32::MIN_POSITIVE
        ),
    )
}

/// A stop value: one string or an array of up to 8 non-empty strings of at most 256 bytes.
fn parse_stop(v: &Value, field: &str) -> Result<Vec<String>, FieldError> {
    let items: Vec<&Value> = match v {
        Value::String(_) => vec![v],
        Value::Array(a) => a.iter().collect(),
        other => {
            return Err(FieldError::new(
                field,
                format!(
                    "must be a string or an array of strings, got {}",
                    crate::json::type_name(other)
                ),
            ))
        }
    };
    if items.len() > MAX_STOP_STRINGS {
        return Err(FieldError::new(
            field,
            format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                items.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(s) = item else {
            return Err(FieldError::new(field, "every stop entry must be a string"));
        };
        if s.is_empty() {
            return Err(FieldError::new(field, "stop strings must not be empty"));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(FieldError::new(
                field,
                format!(
                    "stop strings are at most {MAX_STOP_BYTES} bytes, got {}",
                    s.len()
                ),
            ));
        }
        out.push(s.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn applies_present_fields_and_keeps_the_rest() {
        let base = GenParams::defaults(256);
        let p = apply(
            &obj(json!({"temperature": 0.5, "stop": "END", "max_tokens": 10})),
            "",
            &ParamNames::STANDARD,
            &base,
            512,
        )
        .expect("valid");
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.stop, vec!["END".to_string()]);
        assert_eq!(p.max_tokens, 10);
        assert_eq!(p.top_p, 1.0);
    }

    #[test]
    fn floats_are_checked_as_stored_and_echoed_as_sent() {
        let base = GenParams::defaults(256);
        let names = &ParamNames::STANDARD;
        for (v, field) in [
            (json!({"repetition_penalty": 1e-40}), "repetition_penalty"),
            (json!({"repetition_penalty": 1e39}), "repetition_penalty"),
            (json!({"top_p": 1e-50}), "top_p"),
            (json!({"top_p": 1e-40}), "top_p"),
        ] {
            let err = apply(&obj(v.clone()), "", names, &base, 512).expect_err("refused");
            assert_eq!(err.field, field, "{v}");
        }
        let p = apply(
            &obj(json!({"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1})),
            "",
            names,
            &base,
            512,
        )
        .expect("valid");
        let echoed = p.to_json().to_string();
        assert!(echoed.contains(r#""temperature":0.7,"#), "{echoed}");
        assert!(echoed.contains(r#""top_p":0.9,"#), "{echoed}");
        assert!(echoed.contains(r#""repetition_penalty":1.1,"#), "{echoed}");
        // The smallest values that are kept still read back to what is held.
        let p = apply(
            &obj(json!({"top_p": 1.2e-38, "temperature": 1e-40})),
            "",
            names,
            &base,
            512,
        )
        .expect("valid");
        let v = p.to_json();
        assert_eq!(v["top_p"].as_f64().map(|x| x as f32), Some(p.top_p));
        assert_eq!(
            v["temperature"].as_f64().map(|x| x as f32),
            Some(p.temperature)
        );
    }

    #[test]
    fn every_bound_is_checked_and_named() {
        let base = GenParams::defaults(256);
        let cases = [
            (json!({"max_tokens": 0}), "parameters.max_tokens"),
            (json!({"max_tokens": 513}), "parameters.max_tokens"),
            (json!({"temperature": 2.5}), "parameters.temperature"),
            (json!({"temperature": "hot"}), "parameters.temperature"),
            (json!({"top_p": 0}), "parameters.top_p"),
            (json!({"top_k": -1}), "parameters.top_k"),
            (
                json!({"repetition_penalty": 0}),
                "parameters.repetition_penalty",
            ),
            (
                json!({"stop": ["a","b","c","d","e","f","g","h","i"]}),
                "parameters.stop",
            ),
            (json!({"stop": ["x".repeat(257)]}), "parameters.stop"),
            (json!({"stop": [1]}), "parameters.stop"),
            (json!({"seed": 1.5}), "parameters.seed"),
            (json!({"top_logprobs": 21}), "parameters.top_logprobs"),
        ];
        for (v, field) in cases {
            let err = apply(
                &obj(v.clone()),
                "parameters.",
                &ParamNames::STANDARD,
                &base,
                512,
            )
            .expect_err("must be rejected");
            assert_eq!(err.field, field, "for {v}");
        }
    }

    #[test]
    fn a_parameter_a_dialect_does_not_have_is_never_read() {
        let names = ParamNames {
            seed: "",
            stop: "",
            ..ParamNames::STANDARD
        };
        let base = GenParams::defaults(16);
        let p = apply(&obj(json!({"": 3, "seed": 4})), "", &names, &base, 512).expect("ignored");
        assert_eq!((p.seed, p.stop.clone()), (None, Vec::<String>::new()));
        let p = apply(&obj(json!({"": ["x"]})), "", &names, &base, 512).expect("ignored");
        assert!(p.stop.is_empty());
    }
}
