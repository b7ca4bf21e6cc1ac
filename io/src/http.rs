//! HTTP routing: WebSocket upgrades on the dialects' paths, and the HTTP
//! endpoints (`/health`, `/metrics`, `/v1/models`, `POST /v1/generate`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::Instrument;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokenwire_core::http::Route;
use tokenwire_core::{ConnId, Dialect};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

use crate::conn::{self, ConnMeta};
use crate::driver::{DriverHandle, Snapshot};
use crate::metrics::Metrics;
use crate::sync::{ConnectionLimiter, ConnectionPermit, KeyPermit, PerKeyLimiter};
use tokenwire_core::dialect::cai::auth::KeyRing;
use tokenwire_core::dialect::registry::http_failure;
use tokenwire_core::http::HttpFailure;
use tokenwire_core::principal::{AuthScope, Presented, Principal};

/// Response body type of every endpoint.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

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
    /// WebSocket settings.
    pub ws_config: WebSocketConfig,
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
    fn take(&self) -> Option<Permits> {
        match self.0.lock() {
            Ok(mut p) => p.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }
}

/// The `Authorization` header's value, if any (UTF-8 only: anything else is
/// no key).
pub(crate) fn authorization<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The refusal of a request that needs a key and presented none this server
/// accepts (`--auth all`), in `dialect`'s error shape; `None` when it may go
/// on. `cai` answers for itself (its 4001-4003 closes).
pub(crate) fn unauthorized<B>(
    state: &AppState,
    dialect: Dialect,
    transport: tokenwire_core::Transport,
    req: &Request<B>,
) -> Option<Response<Body>> {
    if dialect == Dialect::Cai || state.auth == AuthScope::Cai {
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

/// hyper's service function: routes one request.
pub(crate) async fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    slot: PermitSlot,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let started = std::time::Instant::now();
    let resp = route(state, peer, slot, req).await;
    // Path only: query strings may carry credentials.
    tracing::debug!(
        %peer,
        %method,
        path = %path,
        status = resp.status().as_u16(),
        duration_us = started.elapsed().as_micros() as u64,
        "http request"
    );
    Ok(resp)
}

async fn route(
    state: Arc<AppState>,
    peer: SocketAddr,
    slot: PermitSlot,
    req: Request<Incoming>,
) -> Response<Body> {
    if is_websocket_upgrade(&req) {
        return upgrade(state, peer, slot, req);
    }
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    match req.uri().path() {
        "/" if is_get => playground(),
        "/health" if is_get => health(&state),
        "/metrics" if is_get => {
            if state.metrics_auth && !has_valid_key(&state, &req) {
                let mut resp = error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "/metrics needs an API key (--metrics-auth): send `Authorization: Bearer KEY`",
                );
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return resp;
            }
            metrics(&state)
        }
        "/v1/models" if is_get => models(&state),
        "/health" | "/metrics" | "/v1/models" => method_not_allowed("GET, HEAD"),
        path => match tokenwire_core::dialect::registry::route(req.method().as_str(), path) {
            Route::Dialect(dialect) => crate::http_dialect::handle(state, peer, dialect, req).await,
            Route::WrongMethod(allow) => method_not_allowed(allow),
            Route::NotFound => error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("no endpoint at {path}"),
            ),
        },
    }
}

/// The playground: one self-contained page (no build step, nothing fetched
/// from elsewhere: its policy only lets it talk to this server).
fn playground() -> Response<Body> {
    const PAGE: &str = include_str!("playground.html");
    let mut resp = Response::new(full(PAGE));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// True when `req` presents a key of the keys file.
fn has_valid_key<B>(state: &AppState, req: &Request<B>) -> bool {
    let header = authorization(req);
    let presented = Presented {
        header: header.as_deref(),
        query: req.uri().query().unwrap_or_default(),
    };
    Principal::of(
        state.keys.as_deref(),
        AuthScope::All,
        ConnId(0),
        tokenwire_core::Transport::Http,
        presented,
    )
    .is_ok()
}

fn health(state: &AppState) -> Response<Body> {
    let snap = state.snapshot.borrow().clone();
    if snap.loaded {
        json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
    } else {
        with_retry_after(
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "loading", "progress": snap.load_progress}),
            ),
            1,
        )
    }
}

fn metrics(state: &AppState) -> Response<Body> {
    let mut resp = Response::new(full(state.metrics.encode()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    resp
}

fn models(state: &AppState) -> Response<Body> {
    let model = state.snapshot.borrow().model.clone();
    let data: Vec<serde_json::Value> = model
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.name,
                "object": "model",
                "created": state.started_unix_s,
                "owned_by": "tokenwire",
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// True for a request asking to switch to the WebSocket protocol.
fn is_websocket_upgrade<B>(req: &Request<B>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
                .unwrap_or(false)
        })
    };
    has_token(header::UPGRADE, "websocket") && has_token(header::CONNECTION, "upgrade")
}

/// Answers a WebSocket upgrade with 101 and runs the connection on its own
/// task, which takes over the connection's slot in the connection limit.
fn upgrade(
    state: Arc<AppState>,
    peer: SocketAddr,
    slot: PermitSlot,
    req: Request<Incoming>,
) -> Response<Body> {
    let mut resp = upgrade_or_refuse(state, peer, slot, req);
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The client asked for a protocol switch and will not reuse this
        // connection for plain HTTP: end it rather than wait for its timeout.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

fn upgrade_or_refuse(
    state: Arc<AppState>,
    peer: SocketAddr,
    slot: PermitSlot,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let Some(dialect) = Dialect::from_path(req.uri().path()) else {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no WebSocket endpoint at {}", req.uri().path()),
        );
    };
    if req.method() != Method::GET {
        return method_not_allowed("GET");
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .map(|v| v.to_str().unwrap_or("(not UTF-8)"));
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if !crate::tenancy::origin_allowed(origin, host, &state.allowed_origins) {
        tracing::info!(%peer, dialect = dialect.name(), "upgrade from another origin refused");
        return error_response(
            StatusCode::FORBIDDEN,
            "forbidden",
            "WebSocket upgrades from this page's origin are not allowed (--allowed-origins)",
        );
    }
    if let Some(resp) = unauthorized(&state, dialect, tokenwire_core::Transport::WebSocket, &req) {
        return resp;
    }
    if req.version() < http::Version::HTTP_11 {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "a WebSocket upgrade needs HTTP/1.1",
        );
    }
    let version_ok = req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() == b"13");
    if !version_ok {
        let mut resp = error_response(
            StatusCode::UPGRADE_REQUIRED,
            "invalid_request",
            "only WebSocket version 13 is supported",
        );
        resp.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return resp;
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "missing Sec-WebSocket-Key",
        );
    };
    if !is_websocket_key(key.as_bytes()) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Sec-WebSocket-Key must be 16 bytes in base64 (24 characters)",
        );
    }
    let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "bad Sec-WebSocket-Key",
        );
    };
    let Some(permit) = slot.take() else {
        // A second upgrade on one connection cannot happen (the first one
        // ends HTTP on it); answer rather than assume.
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "this connection was already upgraded",
        );
    };

    let meta = ConnMeta {
        conn: state.next_conn_id(),
        dialect,
        query: req.uri().query().unwrap_or_default().to_owned(),
        authorization: authorization(&req),
        peer,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let span = tracing::info_span!("conn", id = meta.conn.0, dialect = dialect.name());
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let ws = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(state.ws_config),
                    )
                    .await;
                    conn::run(
                        ws,
                        meta,
                        state.driver.clone(),
                        state.max_queued_frames,
                        permit,
                    )
                    .await;
                }
                Err(e) => {
                    tracing::debug!(conn = meta.conn.0, %peer, error = %e, "upgrade failed");
                }
            }
            drop(state);
        }
        .instrument(span),
    );

    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    resp
}

/// A body holding `data`.
pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed()
}

/// An empty body.
pub(crate) fn empty() -> Body {
    full(Bytes::new())
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    json_text_response(status, value.to_string())
}

/// A response whose body is already JSON text.
pub(crate) fn json_text_response(status: StatusCode, json: String) -> Response<Body> {
    let mut resp = Response::new(full(json));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `{"type": "error", "error": code, "message": message, "recoverable": true}`
/// with `status` (and `Retry-After` on a 503).
pub(crate) fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let resp = json_response(
        status,
        &serde_json::json!({"type": "error", "error": code, "message": message, "recoverable": true}),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        with_retry_after(resp, 1)
    } else {
        resp
    }
}

/// Adds `Retry-After: seconds`.
pub(crate) fn with_retry_after(mut resp: Response<Body>, seconds: u32) -> Response<Body> {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    resp
}

/// True for a `Sec-WebSocket-Key` that decodes to 16 bytes: 22 base64
/// characters and `==` (RFC 6455, 4.2.1).
fn is_websocket_key(key: &[u8]) -> bool {
    let b64 = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
    key.len() == 24 && key[..22].iter().all(b64) && &key[22..] == b"=="
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut resp = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("allowed methods: {allow}"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_keys_are_16_bytes_of_base64() {
        assert!(is_websocket_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        for bad in [
            &b"abc"[..],
            b"",
            b"dGhlIHNhbXBsZSBub25jZQ",
            b"dGhlIHNhbXBsZSBub25jZQ=!",
            b"dGhlIHNhbXBsZSBub25jZ$==",
            b"dGhlIHNhbXBsZSBub25jZQ===",
        ] {
            assert!(!is_websocket_key(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn upgrade_detection_reads_header_tokens() {
        let req = Request::builder()
            .header("Upgrade", "WebSocket")
            .header("Connection", "keep-alive, Upgrade")
            .body(())
            .expect("request");
        assert!(is_websocket_upgrade(&req));
        let req = Request::builder()
            .header("Connection", "Upgrade")
            .body(())
            .expect("request");
        assert!(!is_websocket_upgrade(&req));
        let req = Request::builder()
            .header("Upgrade", "h2c")
            .header("Connection", "Upgrade")
            .body(())
            .expect("request");
        assert!(!is_websocket_upgrade(&req));
    }
}
