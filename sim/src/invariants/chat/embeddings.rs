//! `chat_embeddings`: what a client of `POST /v1/embeddings` gets when it
//! asks nothing the API refuses (those are `chat_refusals`'). With the
//! route off (`--pooling off`), never an answer; refused only as a request
//! the API allows may be (a full queue, a long input, a fault); otherwise a `list` of the served model whose `data[i]` is input
//! `i`'s `embedding` (floats, or base64 of little-endian f32s when asked),
//! equal to the engine's vector of exactly that input's tokens pooled as
//! the server pools ([`embedding_of`]: the simulated engine's function of
//! the prompt), cut to `dimensions` and scaled to unit length; its usage
//! counts every input's tokens.

use base64::Engine as _;
use serde_json::Value;
use tokenwire_core::{HostConfig, ModelInfo, Pooling};

use super::answers::{JudgeAnswer, Outcome, Request};
use super::refusals::bad_fields;
use super::replies::judge_refusal;
use crate::engine::embedding_of;
use crate::invariants::{clip, Check, Cx};

/// How far a written value may be from the expected one (f32 rounding).
const TOLERANCE: f64 = 1e-5;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatEmbeddings;

/// The values of an `embedding` as written.
fn values(v: &Value) -> Option<Vec<f64>> {
    match v {
        Value::Array(a) => a.iter().map(Value::as_f64).collect(),
        Value::String(s) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
            if bytes.len() % 4 != 0 {
                return None;
            }
            Some(
                bytes
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// The vector the server must write for `ids`: the engine's, cut, scaled.
fn expected(config: &HostConfig, model: &ModelInfo, ids: &[u32], dims: Option<u64>) -> Vec<f64> {
    let pooling = config.embed_pooling.resolve(model).unwrap_or(Pooling::Mean);
    let mut v: Vec<f64> = embedding_of(pooling, ids, model.embedding_size as usize)
        .into_iter()
        .map(f64::from)
        .collect();
    if let Some(d) = dims {
        v.truncate(d as usize);
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

fn judge(cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
    let dims = r.body["dimensions"].as_u64();
    let off = cx.config.embed_pooling.resolve(cx.model).is_none();
    let v = match outcome {
        Outcome::Error(status, body) => return judge_refusal(*status, body),
        Outcome::Stream(..) => return Err("an embeddings request streamed".into()),
        Outcome::Reply(v) => v,
    };
    if off {
        return Err("answered with the route off".into());
    }
    let Some(prompts) = r.prompts() else {
        return Err("answered an input that is no input".into());
    };
    let data = v["data"].as_array().cloned().unwrap_or_default();
    if v["object"] != "list" || v["model"] != cx.model.name.as_str() || data.len() != prompts.len()
    {
        return Err(format!(
            "a reply of object {}, model {} and {} vectors for {} inputs",
            v["object"],
            v["model"],
            data.len(),
            prompts.len()
        ));
    }
    let mut tokens = 0;
    for (i, (d, p)) in data.iter().zip(&prompts).enumerate() {
        let ids = p.ids();
        tokens += ids.len() as u64;
        let want = expected(cx.config, cx.model, &ids, dims);
        let got = values(&d["embedding"]).unwrap_or_default();
        let close = got.len() == want.len()
            && got
                .iter()
                .zip(&want)
                .all(|(a, b)| (a - b).abs() <= TOLERANCE);
        if d["index"].as_u64() != Some(i as u64) || !close {
            return Err(format!(
                "data[{i}] is index {} with {} (the engine's vector of input {i}: {want:?})",
                d["index"],
                clip(&d["embedding"].to_string())
            ));
        }
    }
    let u = &v["usage"];
    if u["prompt_tokens"].as_u64() != Some(tokens) || u["total_tokens"].as_u64() != Some(tokens) {
        return Err(format!("usage {u} (the inputs hold {tokens} tokens)"));
    }
    Ok(())
}

impl JudgeAnswer for ChatEmbeddings {
    fn name(&self) -> &'static str {
        "chat_embeddings"
    }

    fn judges(&self, cx: &Cx<'_>, r: &Request) -> bool {
        r.route == "embeddings" && bad_fields(r, cx.model).is_empty()
    }

    fn judge(&self, cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
        judge(cx, r, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_read_as_floats_or_base64() {
        let v = [0.5f32, -0.25];
        let b64: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let s = base64::engine::general_purpose::STANDARD.encode(b64);
        assert_eq!(values(&Value::String(s)), Some(vec![0.5, -0.25]));
        assert_eq!(
            values(&serde_json::json!([0.5, -0.25])),
            Some(vec![0.5, -0.25])
        );
        assert_eq!(values(&Value::String("AAA".into())), None);
    }

    #[test]
    fn the_engines_vector_passes_and_another_inputs_is_caught() {
        use crate::invariants::chat::answers::OnAnswers;
        use crate::invariants::testkit::kit;
        use serde_json::json;
        use tokenwire_core::testing::tiny_model_info;
        use tokenwire_core::{ConnId, Dialect, Input};
        let model = tiny_model_info();
        let config = HostConfig::default();
        let reply = |input: &str| {
            let ids = super::super::answers::Prompt::Text(input.into()).ids();
            let v = expected(&config, &model, &ids, None);
            json!({"kind": "reply", "data": {"object": "list", "model": model.name,
                   "data": [{"object": "embedding", "index": 0, "embedding": v}],
                   "usage": {"prompt_tokens": ids.len(), "total_tokens": ids.len()}}})
        };
        for (answer, ok) in [("<c1>ab", true), ("<c1>ba", false)] {
            let mut k = kit(OnAnswers::checker(ChatEmbeddings));
            k.open_http(1, Dialect::Chat);
            k.input(Input::Text {
                conn: ConnId(1),
                text: json!({"route": "embeddings",
                             "body": {"model": model.name, "input": "<c1>ab"}})
                .to_string(),
            })
            .expect("request");
            let r = k.send(1, reply(answer));
            assert_eq!(r.is_ok(), ok, "{answer}: {r:?}");
        }
    }
}
