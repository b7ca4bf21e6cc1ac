//! Who a frame belongs to: the connection's id, the dialect its path names,
//! and how it is carried. A leaf module: everything else imports it, it
//! imports nothing.

/// Identifies one client connection; chosen by the caller, unique while open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// How a connection reached the Host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// A WebSocket: the Host may ping it and close it with a code.
    WebSocket,
    /// One HTTP request translated by the shell into the dialect's frames; it ends
    /// when the request's response ends. No pings, no idle timeout.
    Http,
}

/// The five wire dialects, each at its own path (PROTOCOLS.md). What each
/// one does is its row in [`crate::dialect::registry::DIALECTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dialect {
    /// `/generate`: config / control / feedback; init / token / completion.
    Generate,
    /// `/ws/session`: client-held conversations.
    Session,
    /// `/v1/responses`: OpenAI Responses API WebSocket mode.
    Responses,
    /// `/ws`: batch queue with event arrays.
    Batch,
    /// `/`: cai-service with query-string auth.
    Cai,
    /// `POST /v1/chat/completions` and `POST /v1/completions` (HTTP only):
    /// the OpenAI Chat Completions and Completions routes.
    Chat,
    /// `POST /v1/messages` (HTTP only): Anthropic's Messages API, on the
    /// `chat` machine.
    Anthropic,
}

impl Dialect {
    /// Every dialect, in a fixed order (for metrics and tests).
    pub const ALL: [Dialect; 7] = [
        Dialect::Generate,
        Dialect::Session,
        Dialect::Responses,
        Dialect::Batch,
        Dialect::Cai,
        Dialect::Chat,
        Dialect::Anthropic,
    ];

    /// The name and WebSocket path (if it has one) of each dialect, in one
    /// place so that neither can be added without the other.
    const fn names(self) -> (&'static str, Option<&'static str>) {
        match self {
            Dialect::Generate => ("generate", Some("/generate")),
            Dialect::Session => ("session", Some("/ws/session")),
            Dialect::Responses => ("responses", Some("/v1/responses")),
            Dialect::Batch => ("batch", Some("/ws")),
            Dialect::Cai => ("cai", Some("/")),
            Dialect::Chat => ("chat", None),
            Dialect::Anthropic => ("anthropic", None),
        }
    }

    /// The dialect served at a WebSocket `path`, if any.
    pub fn from_path(path: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.ws_path() == Some(path))
    }

    /// Short lowercase name (`generate`, `session`, ...), used as a metrics label.
    pub const fn name(self) -> &'static str {
        self.names().0
    }

    /// The WebSocket path the dialect is served at (none: HTTP only).
    pub const fn ws_path(self) -> Option<&'static str> {
        self.names().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_has_its_own_name_and_path() {
        for (i, a) in Dialect::ALL.iter().enumerate() {
            if let Some(path) = a.ws_path() {
                assert_eq!(Dialect::from_path(path), Some(*a));
            }
            for b in &Dialect::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
                if a.ws_path().is_some() {
                    assert_ne!(a.ws_path(), b.ws_path());
                }
            }
        }
        assert_eq!(Dialect::from_path("/nope"), None);
        assert_eq!(Dialect::Session.ws_path(), Some("/ws/session"));
        assert_eq!(Dialect::Chat.ws_path(), None, "chat is HTTP only");
        assert_eq!(Dialect::Anthropic.ws_path(), None, "so is anthropic");
        assert_eq!(Dialect::Cai.name(), "cai");
    }
}
