//! vLLM's structured-output fields on Chat Completions and Completions,
//! which clients written for vLLM send beside (or instead of)
//! `response_format`: `structured_outputs` (vLLM 0.10 and later) and the
//! older top-level `guided_json`, `guided_regex`, `guided_choice` and
//! `guided_grammar`. Each names one [`Grammar`]:
//!
//! | field | grammar |
//! |---|---|
//! | `structured_outputs.json`, `guided_json` | a JSON Schema (an object, or its JSON text) |
//! | `structured_outputs.json_object: true` | any JSON object |
//! | `structured_outputs.regex`, `guided_regex` | text matching a regular expression, whole |
//! | `structured_outputs.choice`, `guided_choice` | exactly one of the strings given |
//! | `structured_outputs.grammar`, `guided_grammar` | a grammar in llguidance's Lark syntax |
//!
//! A request names at most one output format in all (these fields and
//! `response_format` together); a second is refused naming it, as vLLM
//! refuses it. Other `structured_outputs` keys (vLLM's backend options)
//! are ignored, as unknown fields are.

use serde_json::{Map, Value};

use crate::constraint::Grammar;
use crate::json::{type_name, FieldError, Fields};

/// The most strings a choice may list.
pub const MAX_CHOICES: usize = 1024;

/// The grammar vLLM's fields in `obj` ask for, with the field that asked
/// (for errors that name it); `None` when there are none. Errors name the
/// field at fault.
pub fn guided_format(
    obj: &Map<String, Value>,
) -> Result<Option<(Grammar, &'static str)>, FieldError> {
    let f = Fields::new(obj, "");
    let mut found: Option<(Grammar, &'static str)> = None;
    let mut take = |grammar: Option<Grammar>, field: &'static str| match (&found, grammar) {
        (_, None) => Ok(()),
        (Some((_, first)), Some(_)) => Err(FieldError::new(
            field,
            format!("only one output format may be given, and `{first}` already is"),
        )),
        (None, Some(g)) => {
            found = Some((g, field));
            Ok(())
        }
    };
    if let Some(so) = f.obj("structured_outputs")? {
        let s = Fields::new(so, "structured_outputs.");
        take(json_schema(&s, "json")?, "structured_outputs.json")?;
        let object = s.bool("json_object")?.unwrap_or(false);
        take(
            object.then_some(Grammar::JsonObject),
            "structured_outputs.json_object",
        )?;
        take(regex(&s, "regex")?, "structured_outputs.regex")?;
        take(choice(&s, "choice")?, "structured_outputs.choice")?;
        take(grammar(&s, "grammar")?, "structured_outputs.grammar")?;
    }
    take(json_schema(&f, "guided_json")?, "guided_json")?;
    take(regex(&f, "guided_regex")?, "guided_regex")?;
    take(choice(&f, "guided_choice")?, "guided_choice")?;
    take(grammar(&f, "guided_grammar")?, "guided_grammar")?;
    Ok(found)
}

/// A JSON Schema given as an object or as its JSON text (vLLM takes both).
/// Keywords the engine cannot enforce are ignored, as vLLM's fallback does.
fn json_schema(f: &Fields<'_>, field: &str) -> Result<Option<Grammar>, FieldError> {
    let name = || format!("{}{field}", f.prefix());
    let schema = match f.raw(field) {
        None => return Ok(None),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(Value::String(text)) => match crate::json::parse(text) {
            Ok(s @ Value::Object(_)) => s,
            Ok(other) => {
                return Err(FieldError::new(
                    name(),
                    format!("must be a JSON Schema object, got {}", type_name(&other)),
                ))
            }
            Err(e) => return Err(FieldError::new(name(), format!("is not valid JSON: {e}"))),
        },
        Some(other) => {
            return Err(FieldError::new(
                name(),
                format!(
                    "must be a JSON Schema (an object or its JSON text), got {}",
                    type_name(other)
                ),
            ))
        }
    };
    Ok(Some(Grammar::JsonSchema {
        schema,
        strict: false,
    }))
}

/// A non-empty string field.
fn text<'a>(f: &Fields<'a>, field: &str) -> Result<Option<&'a str>, FieldError> {
    match f.str(field)? {
        Some("") => Err(FieldError::new(
            format!("{}{field}", f.prefix()),
            "must not be empty",
        )),
        other => Ok(other),
    }
}

fn regex(f: &Fields<'_>, field: &str) -> Result<Option<Grammar>, FieldError> {
    Ok(text(f, field)?.map(|r| Grammar::Regex(r.to_string())))
}

fn grammar(f: &Fields<'_>, field: &str) -> Result<Option<Grammar>, FieldError> {
    Ok(text(f, field)?.map(|g| Grammar::Lark(g.to_string())))
}

/// One to [`MAX_CHOICES`] non-empty strings.
fn choice(f: &Fields<'_>, field: &str) -> Result<Option<Grammar>, FieldError> {
    let Some(items) = f.array(field)? else {
        return Ok(None);
    };
    let name = format!("{}{field}", f.prefix());
    if items.is_empty() || items.len() > MAX_CHOICES {
        return Err(FieldError::new(
            name,
            format!("must list 1 to {MAX_CHOICES} strings"),
        ));
    }
    let mut choices = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) if !s.is_empty() => choices.push(s.clone()),
            Value::String(_) => {
                return Err(FieldError::new(format!("{name}[{i}]"), "must not be empty"))
            }
            other => {
                return Err(FieldError::new(
                    format!("{name}[{i}]"),
                    format!("must be a string, got {}", type_name(other)),
                ))
            }
        }
    }
    Ok(Some(Grammar::Choice(choices)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn guided(body: Value) -> Result<Option<(Grammar, &'static str)>, FieldError> {
        guided_format(body.as_object().expect("an object"))
    }

    fn refused(body: Value) -> FieldError {
        guided(body.clone()).expect_err(&format!("{body} must be refused"))
    }

    #[test]
    fn each_field_names_its_grammar() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let as_schema = Grammar::JsonSchema {
            schema: schema.clone(),
            strict: false,
        };
        let cases = [
            (
                json!({"structured_outputs": {"json": schema}}),
                as_schema.clone(),
                "structured_outputs.json",
            ),
            (
                json!({"guided_json": schema.to_string()}),
                as_schema.clone(),
                "guided_json",
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Grammar::JsonObject,
                "structured_outputs.json_object",
            ),
            (
                json!({"structured_outputs": {"regex": "[0-9]{3}"}}),
                Grammar::Regex("[0-9]{3}".into()),
                "structured_outputs.regex",
            ),
            (
                json!({"guided_regex": "a|b"}),
                Grammar::Regex("a|b".into()),
                "guided_regex",
            ),
            (
                json!({"structured_outputs": {"choice": ["yes", "no"]}}),
                Grammar::Choice(vec!["yes".into(), "no".into()]),
                "structured_outputs.choice",
            ),
            (
                json!({"guided_choice": ["a \"b\""]}),
                Grammar::Choice(vec!["a \"b\"".into()]),
                "guided_choice",
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"x\""}}),
                Grammar::Lark("start: \"x\"".into()),
                "structured_outputs.grammar",
            ),
            (
                json!({"guided_grammar": "start: \"x\""}),
                Grammar::Lark("start: \"x\"".into()),
                "guided_grammar",
            ),
        ];
        for (body, grammar, field) in cases {
            assert_eq!(guided(body.clone()), Ok(Some((grammar, field))), "{body}");
        }
    }

    #[test]
    fn absent_null_and_false_ask_for_nothing_and_backend_options_are_ignored() {
        for body in [
            json!({}),
            json!({"guided_regex": null, "structured_outputs": null}),
            json!({"structured_outputs": {"json_object": false, "disable_any_whitespace": true}}),
            json!({"guided_decoding_backend": "xgrammar"}),
        ] {
            assert_eq!(guided(body.clone()), Ok(None), "{body}");
        }
    }

    #[test]
    fn a_second_format_is_refused_naming_it() {
        let e = refused(json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}));
        assert_eq!(e.field, "structured_outputs.choice");
        assert!(
            e.message.contains("`structured_outputs.regex`"),
            "{}",
            e.message
        );
        let e = refused(json!({"structured_outputs": {"json_object": true}, "guided_regex": "a"}));
        assert_eq!(e.field, "guided_regex");
        let e = refused(json!({"guided_choice": ["a"], "guided_grammar": "start: \"a\""}));
        assert_eq!(e.field, "guided_grammar");
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        for (body, field) in [
            (json!({"structured_outputs": "regex"}), "structured_outputs"),
            (
                json!({"structured_outputs": {"regex": 5}}),
                "structured_outputs.regex",
            ),
            (json!({"guided_regex": ""}), "guided_regex"),
            (json!({"guided_grammar": ""}), "guided_grammar"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": "yes"}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice[1]"),
            (json!({"guided_choice": ["a", ""]}), "guided_choice[1]"),
            (
                json!({"structured_outputs": {"choice": vec!["a"; MAX_CHOICES + 1]}}),
                "structured_outputs.choice",
            ),
            (json!({"guided_json": "{not json"}), "guided_json"),
            (json!({"guided_json": "[1]"}), "guided_json"),
            (json!({"guided_json": 3}), "guided_json"),
            (
                json!({"structured_outputs": {"json_object": "yes"}}),
                "structured_outputs.json_object",
            ),
        ] {
            assert_eq!(refused(body.clone()).field, field, "{body}");
        }
    }
}
