//! The `anthropic` dialect (Anthropic's Messages routes, on the `chat`
//! machine): what its HTTP clients get, replayed through the shell's
//! exchange ([`http`]). The machine's own frames are judged with the `chat`
//! dialect's (`chat_terminal`).

pub mod http;

use super::Checker;

/// The `anthropic` dialect's checkers, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![Box::new(http::AnthropicHttp::default())]
}
