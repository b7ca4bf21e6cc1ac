//! Chat messages as the dialects that carry a conversation write them on the
//! wire (`session`'s `conversation_context`, `cai`'s `context`): a JSON array
//! of `{role, content}` objects with roles `system`, `user` and `assistant`.

use serde_json::Value;

use crate::json::{self, FieldError, Fields};
use crate::text::{ChatMessage, Role};

/// Decodes the array at `field` of `f` (absent: no messages); errors name
/// the element and field that is wrong.
pub fn decode(f: &Fields<'_>, field: &str) -> Result<Vec<ChatMessage>, FieldError> {
    let Some(items) = f.array(field)? else {
        return Ok(Vec::new());
    };
    let full = format!("{}{field}", f.prefix());
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let name = format!("{full}[{i}]");
            let Value::Object(m) = item else {
                return Err(FieldError::new(
                    name,
                    format!("must be an object, got {}", json::type_name(item)),
                ));
            };
            let prefix = format!("{name}.");
            let f = Fields::new(m, &prefix);
            let role = f.req_str("role")?;
            let role = match Role::parse(role) {
                Some(r @ (Role::User | Role::Assistant | Role::System)) => r,
                _ => {
                    return Err(FieldError::new(
                        format!("{name}.role"),
                        format!("must be user, assistant or system, got `{role}`"),
                    ))
                }
            };
            Ok(ChatMessage::new(role, f.req_str("content")?.to_string()))
        })
        .collect()
}

/// The messages as a JSON array (the inverse of [`decode`]).
pub fn encode(messages: &[ChatMessage]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content}))
            .collect(),
    )
}
