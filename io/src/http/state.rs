//! What the HTTP handlers share: the server's state ([`AppState`]), the
//! connection-limit permits a connection holds, and the key check every
//! route makes before any work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use tokenwire_core::dialect::registry::{self, http_failure};
use tokenwire_core::http::HttpFailure;
use tokenwire_core::keys::KeyRing;
use tokenwire_core::principal::{AuthScope, Presented, Principal};
use tokenwire_core::{ConnId, Dialect};
use tokio::sync::{mpsc, watch};

use super::reply::{json_text_response, Body};
use crate::channel::{DriverHandle, Snapshot};
use crate::metrics::Metrics;
use crate::sync::{ConnectionLimiter, ConnectionPermit, KeyPermit, PerKeyLimiter};

/// What the request handlers share.
pub(crate) struct AppState {
    /// The driver's channel.
    pub driver: DriverHandle,
    /// The driver's latest snapshot.
    pub snapshot: watch::Receiver<Snapshot>,
    /// Metrics, for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Cap on open connections (HTTP and WebSocket alike).
    pub limiter: Arc<ConnectionLimiter>,
    /// Cap on open connections per peer address.
    pub per_ip: Arc<PerKeyLimiter<std::net::IpAddr>>,
    /// The keys file, to check keys before any work.
    pub keys: Option<Arc<KeyRing>>,
    /// Which routes need a key.
    pub auth: AuthScope,
    /// `/metrics` needs a key.
    pub metrics_auth: bool,
    /// Browser origins allowed besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Next connection id.
    pub next_conn: AtomicU64,
    /// Server start, unix seconds (the model's `created`).
    pub started_unix_s: u64,
    /// Largest frame / request body.
    pub max_frame_bytes: usize,
    /// How long a request body may take before the rate extension.
    pub body_timeout: std::time::Duration,
    /// Bytes per second a body must keep up beyond `body_timeout`.
    pub body_min_rate: u64,
    /// How long a client may take to send a request's headers.
    pub header_timeout: std::time::Duration,
    /// Kernel send buffer per connection (0: the OS's sizing).
    pub send_buffer_bytes: usize,
    /// Outbound queue capacity per connection.
    pub max_queued_frames: usize,
    /// WebSocket settings: limits, and permessage-deflate if accepted.
    pub ws_options: yawc::Options,
    /// Never sent on: it is dropped with the last task holding the state, which
    /// is how the server knows every connection task has ended.
    pub _tasks: mpsc::Sender<()>,
}

impl AppState {
    /// A fresh connection id.
    pub(crate) fn next_conn_id(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed))
    }
}

/// What a connection holds while it is open: its slot in the connection
/// limit and in its address's. Held only to be dropped together.
#[derive(Debug)]
pub(crate) struct Permits {
    /// The server-wide slot.
    pub _conn: ConnectionPermit,
    /// The peer address's slot.
    pub _ip: KeyPermit<std::net::IpAddr>,
}

/// A connection's slots in the connection limits, shared by its requests: an
/// upgrade takes them over for the WebSocket's life.
#[derive(Clone)]
pub(crate) struct PermitSlot(Arc<std::sync::Mutex<Option<Permits>>>);

impl PermitSlot {
    /// A slot holding `permits`.
    pub(crate) fn new(permits: Permits) -> PermitSlot {
        PermitSlot(Arc::new(std::sync::Mutex::new(Some(permits))))
    }

    /// Takes the permits (once).
    pub(crate) fn take(&self) -> Option<Permits> {
        match self.0.lock() {
            Ok(mut p) => p.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }
}

/// The key a request presents: its `Authorization` header's value, or
/// else its `x-api-key` header's (the bare key, as Anthropic's clients
/// send it), if any (UTF-8 only: anything else is no key).
pub(crate) fn authorization<B>(req: &Request<B>) -> Option<String> {
    let value = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    value(header::AUTHORIZATION).or_else(|| value(HeaderName::from_static("x-api-key")))
}

/// The refusal of a request that needs a key and presented none this server
/// accepts (`--auth all`), in `dialect`'s error shape; `None` when it may go
/// on. A dialect with `own_auth` (`cai`) answers for itself (its 4001-4003
/// closes).
pub(crate) fn unauthorized<B>(
    state: &AppState,
    dialect: Dialect,
    transport: tokenwire_core::Transport,
    req: &Request<B>,
) -> Option<Response<Body>> {
    if registry::spec(dialect).own_auth || state.auth == AuthScope::Cai {
        return None;
    }
    let header = authorization(req);
    let presented = Presented {
        header: header.as_deref(),
        query: req.uri().query().unwrap_or_default(),
    };
    let refused = Principal::of(
        state.keys.as_deref(),
        state.auth,
        ConnId(0),
        transport,
        presented,
    )
    .err()?;
    let reply = http_failure(
        dialect,
        &HttpFailure::Unauthorized {
            message: refused.message(),
        },
    );
    let mut resp = json_text_response(StatusCode::UNAUTHORIZED, reply.body);
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(resp)
}
