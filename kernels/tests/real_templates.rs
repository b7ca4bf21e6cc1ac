//! The real chat templates of llama.cpp's collection (70 of them: Qwen,
//! Llama 3.x, Mistral, DeepSeek, Gemma, Granite, GLM, ...; fetched by
//! `scripts/fetch-chat-templates.sh`) through [`ChatTemplate`]: each
//! compiles (transformers' `{% generation %}` tags included) and renders a
//! conversation with tools, an earlier call and its result as transformers
//! gives them (`tool_calls`, `tool_call_id`, `tojson`, `strftime_now`),
//! except the few named here with the reason each fails, which is theirs or
//! a known limit of minijinja. The call formats are known for the families
//! the server parses, and Mistral's get the nine-character ids their
//! templates require. Each continues a final assistant message (a prefill),
//! and renders without tools (Jinja's `iterable` test, as Python has it).

use std::path::PathBuf;

use tokenwire_core::tools::{mistral_call_id, ToolDef, ToolFormat};
use tokenwire_core::{ChatMessage, HistoryCall, Role};
use tokenwire_kernels::ChatTemplate;

/// Templates that do not render this conversation, and a piece of the
/// error each gives. A template that starts to render is a failure here,
/// so the list stays true.
const DO_NOT_RENDER: &[(&str, &str)] = &[
    // Lists are immutable in minijinja: `ns.list.append(x)` has no method.
    ("Kimi-K2-Instruct.jinja", "no method named append"),
    ("Kimi-K2-Thinking.jinja", "no method named append"),
    // Reads a `datetime` variable its callers must pass.
    (
        "fireworks-ai-llama-3-firefunction-v2.jinja",
        "string and undefined",
    ),
    // Wants a call's arguments as a string; transformers gives an object.
    ("meetkai-functionary-medium-v3.2.jinja", "string and map"),
    // Has no tool role.
    ("google-gemma-2-2b-it.jinja", "must alternate"),
];

/// Templates that render the conversation without the call: they write
/// calls only for a turn whose content is `none`, where the server (as
/// vLLM) gives `""`.
const DROP_THE_CALL: &[&str] = &["deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"];

/// The templates' folder, or `None` (with the reason printed) outside CI
/// when it was not fetched; under `CI=true` a missing folder fails.
fn templates_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TOKENWIRE_CHAT_TEMPLATES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/chat-templates"
            ))
        });
    if dir.join(".complete").exists() {
        return Some(dir);
    }
    let msg = format!(
        "{} not found (scripts/fetch-chat-templates.sh fetches it)",
        dir.display()
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg} (required when CI=true)");
    }
    eprintln!("skipping: {msg}");
    None
}

/// The collection's templates in name order (at least 60 of them), or
/// `None` as [`templates_dir`] says.
fn template_paths() -> Option<Vec<PathBuf>> {
    let dir = templates_dir()?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read the templates")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 60, "{} templates", paths.len());
    Some(paths)
}

/// A user asks, the model calls, the tool answers, the model answers, the
/// user asks again: the shape every tool-using template takes.
fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(Role::User, "Weather in Paris?"),
        ChatMessage {
            tool_calls: vec![HistoryCall {
                id: "call_abc".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris"}"#.into(),
            }],
            ..ChatMessage::new(Role::Assistant, "")
        },
        ChatMessage {
            tool_call_id: Some("call_abc".into()),
            ..ChatMessage::new(Role::Tool, "sunny")
        },
        ChatMessage::new(Role::Assistant, "It is sunny."),
        ChatMessage::new(Role::User, "Thanks!"),
    ]
}

fn weather() -> ToolDef {
    ToolDef {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: serde_json::json!({"type": "object", "required": ["city"],
            "properties": {"city": {"type": "string", "description": "The city"}}}),
    }
}

#[test]
fn real_templates_render_a_tool_conversation() {
    let Some(paths) = template_paths() else {
        return;
    };
    let mut rendered = 0;
    for path in &paths {
        let name = path.file_name().expect("a name").to_string_lossy();
        let source = std::fs::read_to_string(path).expect("read a template");
        let t = ChatTemplate::new(&source, "<s>", "</s>")
            .unwrap_or_else(|e| panic!("{name} does not compile: {e}"));
        let result = t.render_with_tools(&conversation(), &[weather()]);
        if let Some((_, why)) = DO_NOT_RENDER.iter().find(|(n, _)| *n == name) {
            let e = result.expect_err(&format!("{name} renders now: take it off the list"));
            assert!(e.contains(why), "{name}: {e}");
            continue;
        }
        let text = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        for piece in ["Weather in Paris?", "sunny", "Thanks!"] {
            assert!(text.contains(piece), "{name} lost {piece:?}:\n{text}");
        }
        // The call's arguments, however the template writes them.
        let with_call = text.matches("Paris").count() >= 2;
        assert_eq!(
            with_call,
            !DROP_THE_CALL.contains(&name.as_ref()),
            "{name}, the call:\n{text}"
        );
        if t.tool_format().is_mistral() {
            // Ids reach a Mistral template as nine letters and digits, where
            // it writes them at all (Ministral 3's does not).
            assert!(!text.contains("call_abc"), "{name}:\n{text}");
            let id = mistral_call_id("call_abc");
            if source.contains("tool_call_id") {
                assert!(
                    text.contains(&id),
                    "{name} lost the call's id {id}:\n{text}"
                );
            }
        }
        rendered += 1;
    }
    assert_eq!(rendered, paths.len() - DO_NOT_RENDER.len());
}

#[test]
fn the_call_formats_of_real_templates_are_known() {
    let Some(dir) = templates_dir() else {
        return;
    };
    for (name, format) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes),
        (
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            ToolFormat::Hermes,
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            ToolFormat::Llama3Json,
        ),
        (
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
            ToolFormat::Llama3Json,
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            ToolFormat::MistralJson,
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            ToolFormat::MistralArgs,
        ),
        (
            "unsloth-mistral-Devstral-Small-2507.jinja",
            ToolFormat::MistralArgs,
        ),
        (
            "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
            ToolFormat::MistralArgs,
        ),
    ] {
        let source = std::fs::read_to_string(dir.join(name)).expect("read a template");
        let t = ChatTemplate::new(&source, "<s>", "</s>").expect("compiles");
        assert_eq!(t.tool_format(), format, "{name}");
    }
    // Mistral Nemo writes earlier calls as its model does: a JSON list
    // after `[TOOL_CALLS]`, with transformers' separators.
    let source = std::fs::read_to_string(dir.join("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
        .expect("read a template");
    let t = ChatTemplate::new(&source, "<s>", "</s>").expect("compiles");
    let text = t
        .render_with_tools(&conversation(), &[weather()])
        .expect("renders");
    let id = mistral_call_id("call_abc");
    assert!(
        text.contains(&format!(
            r#"[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{id}"}}]</s>"#
        )),
        "{text}"
    );
}

/// Templates that do not render a plain conversation ending in a prefill,
/// and a piece of the error each gives.
const NO_PREFILL: &[(&str, &str)] = &[
    // Reads a `datetime` variable its callers must pass.
    (
        "fireworks-ai-llama-3-firefunction-v2.jinja",
        "string and undefined",
    ),
];

/// A prefill (Anthropic's, vLLM's `continue_final_message`) on every real
/// template: the prompt ends with the prefill's text, the assistant's turn
/// left open, everything before it as the template renders it.
#[test]
fn real_templates_continue_a_final_assistant_message() {
    let Some(paths) = template_paths() else {
        return;
    };
    let mut continued = 0;
    for path in &paths {
        let name = path.file_name().expect("a name").to_string_lossy();
        let source = std::fs::read_to_string(path).expect("read a template");
        let t = ChatTemplate::new(&source, "<s>", "</s>").expect("compiles");
        let prefill = ChatMessage {
            prefill: true,
            ..ChatMessage::new(Role::Assistant, "Once upon a time, a cat")
        };
        let msgs = [ChatMessage::new(Role::User, "Tell me a story."), prefill];
        let result = t.render(&msgs);
        if let Some((_, why)) = NO_PREFILL.iter().find(|(n, _)| *n == name) {
            let e = result.expect_err(&format!("{name} continues now: take it off the list"));
            assert!(e.contains(why), "{name}: {e}");
            continue;
        }
        let text = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.ends_with("Once upon a time, a cat"), "{name}:\n{text}");
        assert!(text.contains("Tell me a story."), "{name}:\n{text}");
        continued += 1;
    }
    assert_eq!(continued, paths.len() - NO_PREFILL.len());
}
