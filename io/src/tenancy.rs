//! Who may use the server and how much one client may take: `--auth`,
//! `--metrics-auth`, `--allowed-origins`, `--batch-cache-scope`, and the
//! per-client bounds (PROTOCOLS.md: Keys, Tenancy, Bounds, Browser origins).
//!
//! Declared once, as flags with their environment variables; the defaults
//! are the core's ([`HostConfig::default`]), so the two cannot drift.

use clap::{Args, FromArgMatches, ValueEnum};
use tokenwire_core::config::CacheScope;
use tokenwire_core::principal::AuthScope;
use tokenwire_core::HostConfig;

/// Which routes need a key (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Auth {
    /// Only `cai` (its query-string authentication); other routes are open.
    #[default]
    Cai,
    /// Every dialect route, WebSocket and HTTP (`/health` stays open).
    All,
}

/// Whose `batch` continue-cache entries a payload may continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum BatchCacheScope {
    /// Its own principal's (its key's, or without keys its connection's).
    #[default]
    Principal,
    /// Anyone's who names the same ids (the source's host-wide cache): for
    /// trusted networks only, since ids are all it takes to read a batch.
    Host,
}

/// The tenancy and bounds flags of `tokenwire serve`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct TenancyArgs {
    /// Which routes need an API key from the --keys file: `cai` (only the
    /// `cai` dialect) or `all` (every dialect route, WebSocket and HTTP:
    /// `Authorization: Bearer KEY` or the `authorization` query parameter;
    /// 401 without one). `/health` is always open.
    #[arg(long, env = "TOKENWIRE_AUTH", value_enum, default_value_t = Auth::Cai)]
    pub auth: Auth,

    /// `/metrics` needs a key from the --keys file too.
    #[arg(long, env = "TOKENWIRE_METRICS_AUTH")]
    pub metrics_auth: bool,

    /// Browser origins (`scheme://host[:port]`, comma-separated) whose pages
    /// may open WebSockets here besides the server's own; an upgrade with
    /// any other `Origin` gets 403. Clients that send no `Origin` (SDKs,
    /// tools) are not affected.
    #[arg(
        long,
        env = "TOKENWIRE_ALLOWED_ORIGINS",
        value_name = "ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,

    /// `batch`: whose finished batches a payload may continue: `principal`
    /// (its own key's, or its own connection's without keys) or `host`
    /// (anyone's naming the same ids: trusted networks only).
    #[arg(long, env = "TOKENWIRE_BATCH_CACHE_SCOPE", value_enum,
          default_value_t = BatchCacheScope::Principal)]
    pub batch_cache_scope: BatchCacheScope,

    /// Most connections (WebSocket and HTTP) open at once from one IP address;
    /// more get 503.
    #[arg(long, env = "TOKENWIRE_MAX_CONNECTIONS_PER_IP", value_name = "N",
          default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_ip: u64,

    /// Requests per minute one address may start without a key (on every
    /// dialect but `cai`, which always needs one); past it the dialect's
    /// rate-limit error with a retry hint. No limit when left out.
    #[arg(long, env = "TOKENWIRE_ANON_REQUESTS_PER_MINUTE", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub anon_requests_per_minute: Option<u64>,

    /// Prompt and generated tokens per minute one address may use without a
    /// key. No limit when left out.
    #[arg(long, env = "TOKENWIRE_ANON_TOKENS_PER_MINUTE", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub anon_tokens_per_minute: Option<u64>,

    /// `session`: refuse sessions that bring no `public_key`, so every
    /// prompt must carry a valid secp256k1 ECDSA `signature`.
    #[arg(long, env = "TOKENWIRE_REQUIRE_SIGNATURES")]
    pub require_signatures: bool,

    /// Most requests one connection may have waiting for the engine (its
    /// share of the queue); past it the dialect's rate-limit error.
    #[arg(long, env = "TOKENWIRE_MAX_QUEUED_PER_CONN", value_name = "N",
          default_value_t = HostConfig::default().max_queued_per_conn,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_queued_per_conn: u32,

    /// `batch`: most prompts in one payload; a larger one gets one ERROR.
    #[arg(long, env = "TOKENWIRE_BATCH_MAX_PROMPTS", value_name = "N",
          default_value_t = HostConfig::default().batch_max_prompts as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_max_prompts: u64,

    /// `batch`: most payloads one connection may have queued or running.
    #[arg(long, env = "TOKENWIRE_BATCH_MAX_PAYLOADS", value_name = "N",
          default_value_t = HostConfig::default().batch_max_payloads as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_max_payloads: u64,

    /// `session`: most live sessions one connection may hold.
    #[arg(long, env = "TOKENWIRE_MAX_SESSIONS_PER_CONN", value_name = "N",
          default_value_t = HostConfig::default().max_sessions_per_conn as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions_per_conn: u64,

    /// `session`: most bytes of message text one session keeps.
    #[arg(long, env = "TOKENWIRE_SESSION_MAX_CONTEXT_BYTES", value_name = "BYTES",
          default_value_t = HostConfig::default().session_max_context_bytes as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_max_context_bytes: u64,

    /// `cai`: most conversations one organisation keeps (its least recently
    /// used go first).
    #[arg(long, env = "TOKENWIRE_MAX_CONVERSATIONS_PER_ORG", value_name = "N",
          default_value_t = HostConfig::default().max_conversations_per_org as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_conversations_per_org: u64,

    /// `cai`: most bytes of message text one conversation keeps (the oldest
    /// messages go first).
    #[arg(long, env = "TOKENWIRE_CONVERSATION_MAX_BYTES", value_name = "BYTES",
          default_value_t = HostConfig::default().conversation_max_bytes as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub conversation_max_bytes: u64,

    /// `cai`: most messages one conversation keeps (the oldest non-system
    /// messages go first).
    #[arg(long, env = "TOKENWIRE_CONVERSATION_MAX_MESSAGES", value_name = "N",
          default_value_t = HostConfig::default().conversation_max_messages as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub conversation_max_messages: u64,
}

impl Default for TenancyArgs {
    /// Every flag at its default, as the flags declare it (no environment).
    fn default() -> Self {
        let cmd = TenancyArgs::augment_args(clap::Command::new("tenancy"))
            .mut_args(|a| a.env(None::<&'static str>));
        let matches = cmd
            .try_get_matches_from(["tenancy"])
            .expect("every tenancy flag has a default or is optional");
        TenancyArgs::from_arg_matches(&matches).expect("the defaults parse as the flags")
    }
}

impl TenancyArgs {
    /// Writes the settings the Host keeps into `host`.
    pub fn apply(&self, host: &mut HostConfig) {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        host.auth = self.scope();
        host.batch_cache_scope = match self.batch_cache_scope {
            BatchCacheScope::Principal => CacheScope::Principal,
            BatchCacheScope::Host => CacheScope::Host,
        };
        host.max_queued_per_conn = self.max_queued_per_conn;
        host.batch_max_prompts = size(self.batch_max_prompts);
        host.batch_max_payloads = size(self.batch_max_payloads);
        host.max_sessions_per_conn = size(self.max_sessions_per_conn);
        host.session_max_context_bytes = size(self.session_max_context_bytes);
        host.max_conversations_per_org = size(self.max_conversations_per_org);
        host.conversation_max_bytes = size(self.conversation_max_bytes);
        host.conversation_max_messages = size(self.conversation_max_messages);
        host.require_signatures = self.require_signatures;
        host.anon_limits = tokenwire_core::keys::OrgLimits {
            requests_per_minute: self.anon_requests_per_minute,
            tokens_per_minute: self.anon_tokens_per_minute,
        };
    }

    /// The core's name for `--auth`.
    pub fn scope(&self) -> AuthScope {
        match self.auth {
            Auth::Cai => AuthScope::Cai,
            Auth::All => AuthScope::All,
        }
    }

    /// Checks what the flags cannot say alone: keys are needed to require
    /// them, and origins must be `scheme://host[:port]`.
    pub fn check(&self, have_keys: bool) -> Result<(), String> {
        if !have_keys && (self.auth == Auth::All || self.metrics_auth) {
            return Err(
                "--auth all and --metrics-auth need a keys file (--keys FILE) to check keys against"
                    .into(),
            );
        }
        for o in &self.allowed_origins {
            let ok = (o.starts_with("http://") || o.starts_with("https://"))
                && !o.ends_with('/')
                && o.split("://")
                    .nth(1)
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
            if !ok {
                return Err(format!(
                    "--allowed-origins: `{o}` is not an origin (scheme://host[:port], no path)"
                ));
            }
        }
        Ok(())
    }
}

/// True when a WebSocket upgrade carrying `origin` may proceed: no `Origin`
/// (not a browser), the server's own (`http://` + the request's `Host`, or
/// `https://` behind a TLS proxy), or one the operator listed.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let own = host.is_some_and(|h| {
        origin.eq_ignore_ascii_case(&format!("http://{h}"))
            || origin.eq_ignore_ascii_case(&format!("https://{h}"))
    });
    own || allowed.iter().any(|a| a.eq_ignore_ascii_case(origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_the_servers_own_or_listed_and_non_browsers_pass() {
        let listed = vec!["https://app.example".to_string()];
        let host = Some("127.0.0.1:8080");
        assert!(origin_allowed(None, host, &[]), "SDKs send no Origin");
        assert!(origin_allowed(Some("http://127.0.0.1:8080"), host, &[]));
        assert!(origin_allowed(Some("https://app.example"), host, &listed));
        assert!(!origin_allowed(Some("https://evil.example"), host, &listed));
        assert!(!origin_allowed(Some("http://127.0.0.1:9999"), host, &[]));
        assert!(!origin_allowed(Some("null"), host, &listed));
        assert!(!origin_allowed(Some("http://127.0.0.1:8080"), None, &[]));
    }

    #[test]
    fn keys_are_needed_to_require_them_and_origins_must_be_origins() {
        let mut t = TenancyArgs {
            auth: Auth::All,
            ..TenancyArgs::default()
        };
        assert!(t.check(false).is_err());
        assert!(t.check(true).is_ok());
        t.allowed_origins = vec!["https://a.example/path".into()];
        assert!(t.check(true).is_err());
        t.allowed_origins = vec!["a.example".into()];
        assert!(t.check(true).is_err());
        t.allowed_origins = vec!["https://a.example:8443".into()];
        assert!(t.check(true).is_ok());
    }

    #[test]
    fn the_defaults_are_the_cores() {
        let mut h = HostConfig::default();
        let before = h.clone();
        TenancyArgs::default().apply(&mut h);
        assert_eq!(h, before);
    }
}
