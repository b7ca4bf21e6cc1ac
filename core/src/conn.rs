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
}

impl Dialect {
    /// Every dialect, in a fixed order (for metrics and tests).
    pub const ALL: [Dialect; 5] = [
        Dialect::Generate,
        Dialect::Session,
        Dialect::Responses,
        Dialect::Batch,
        Dialect::Cai,
    ];

    /// The name and WebSocket path of each dialect, in one place so that
    /// neither can be added without the other.
    const fn names(self) -> (&'static str, &'static str) {
        match self {
            Dialect::Generate => ("generate", "/generate"),
            Dialect::Session => ("session", "/ws/session"),
            Dialect::Responses => ("responses", "/v1/responses"),
            Dialect::Batch => ("batch", "/ws"),
            Dialect::Cai => ("cai", "/"),
        }
    }

    /// The dialect served at a WebSocket `path`, if any.
    pub fn from_path(path: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.ws_path() == path)
    }

    /// Short lowercase name (`generate`, `session`, ...), used as a metrics label.
    pub const fn name(self) -> &'static str {
        self.names().0
    }

    /// The WebSocket path the dialect is served at.
    pub const fn ws_path(self) -> &'static str {
        self.names().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_has_its_own_name_and_path() {
        for (i, a) in Dialect::ALL.iter().enumerate() {
            assert_eq!(Dialect::from_path(a.ws_path()), Some(*a));
            for b in &Dialect::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.ws_path(), b.ws_path());
            }
        }
        assert_eq!(Dialect::from_path("/nope"), None);
        assert_eq!(Dialect::Session.ws_path(), "/ws/session");
        assert_eq!(Dialect::Cai.name(), "cai");
    }
}
