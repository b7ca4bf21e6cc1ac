//! What a client of Anthropic's Messages routes asks: `POST /v1/messages`
//! (streamed or not, with a system prompt, a few turns, stop sequences) and
//! `POST /v1/messages/count_tokens`, each body drawn from the client's own
//! stream. [`super::HttpClient`] sends them, one request per connection.
//! The system prompt starts with the connection's tag (see [`super`]). Now
//! and then a body names another model, leaves out the required
//! `max_tokens`, or gets one field wrong.

use serde_json::{json, Map, Value};
use tokenwire_core::rng::Rng;

use super::chat::Request;
use super::{chance, text};
use crate::swarm::Swarm;

/// A request of the Messages routes, tagged with `tag`, most tokens `cap`.
pub fn request(rng: &mut Rng, swarm: &Swarm, tag: &str, cap: u64) -> Request {
    let counting = chance(rng, 0.15);
    let mut body = Map::new();
    if chance(rng, 0.05) {
        body.insert("model".into(), json!(format!("not-{}", swarm.model.name)));
    } else {
        body.insert("model".into(), json!(swarm.model.name));
    }
    body.insert("system".into(), json!(format!("{tag}{}", text(rng, 12))));
    let mut messages = Vec::new();
    for _ in 0..rng.below(3) {
        messages.push(json!({"role": "user", "content": text(rng, 12)}));
        messages.push(json!({"role": "assistant", "content": text(rng, 12)}));
    }
    messages.push(json!({"role": "user", "content": text(rng, 16)}));
    body.insert("messages".into(), Value::Array(messages));
    let path = if counting {
        "/v1/messages/count_tokens"
    } else {
        if !chance(rng, 0.03) {
            body.insert("max_tokens".into(), json!(1 + rng.below(cap)));
        }
        if chance(rng, 0.5) {
            body.insert("stream".into(), json!(true));
        }
        if chance(rng, 0.4) {
            body.insert("temperature".into(), json!(rng.below(2)));
        }
        if chance(rng, 0.15) {
            body.insert("stop_sequences".into(), json!([text(rng, 2)]));
        }
        if chance(rng, 0.04) {
            let (field, value) = match rng.below(4) {
                0 => ("temperature", json!(3)),
                1 => ("max_tokens", json!("many")),
                2 => ("messages", json!([])),
                _ => ("stream", json!(1)),
            };
            body.insert(field.into(), value);
        }
        "/v1/messages"
    };
    ("POST".into(), path.into(), Value::Object(body))
}
