//! HTTP routing: WebSocket upgrades on the dialects' paths, the server's own
//! endpoints (`/health`, `/metrics`, `/v1/models` and `/v1/models/{id}`, the
//! playground), and each dialect's HTTP routes as its row in the core's
//! registry names them ([`dialect`] carries them out). [`state`] is what the
//! handlers share, [`reply`] how responses are built.

mod dialect;
pub(crate) mod reply;
pub(crate) mod state;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::Instrument;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokenwire_core::http::Route;
use tokenwire_core::Dialect;

use self::reply::{empty, error_response, full, json_response, with_retry_after, Body};
use self::state::{authorization, unauthorized, AppState, PermitSlot};
use crate::conn::{self, ConnMeta};
use crate::ws::Socket;
use tokenwire_core::principal::{AuthScope, Presented, Principal};
use tokenwire_core::ConnId;

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
    let label = route_label(&path, is_websocket_upgrade(&req));
    let metrics = Arc::clone(&state.metrics);
    let resp = route(state, peer, slot, req).await;
    metrics.http_request(label, resp.status().as_u16());
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

/// The metrics label of a request's route: its pattern, never the raw path
/// (a bounded set, and ids stay out of the metrics).
fn route_label(path: &str, upgrade: bool) -> String {
    match path {
        "/" | "/health" | "/metrics" | "/v1/models" => path.to_string(),
        _ if path.starts_with(MODEL_PREFIX) => format!("{MODEL_PREFIX}{{id}}"),
        _ if upgrade => tokenwire_core::Dialect::ALL
            .iter()
            .filter_map(|d| d.ws_path())
            .find(|p| *p == path)
            .unwrap_or("other")
            .to_string(),
        _ => tokenwire_core::dialect::registry::route_pattern(path)
            .unwrap_or_else(|| "other".to_string()),
    }
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
        path if path.starts_with(MODEL_PREFIX) && is_get => {
            model(&state, &path[MODEL_PREFIX.len()..])
        }
        path if path.starts_with(MODEL_PREFIX) => method_not_allowed("GET, HEAD"),
        path => match tokenwire_core::dialect::registry::route(req.method().as_str(), path) {
            Route::Dialect(dialect) => dialect::handle(state, peer, dialect, req).await,
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
    const PAGE: &str = include_str!("../playground.html");
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

/// `GET /v1/models/{id}`: one model (the OpenAI SDK's `models.retrieve`).
const MODEL_PREFIX: &str = "/v1/models/";

/// The OpenAI model object of the served model `name`.
fn model_object(state: &AppState, name: &str) -> serde_json::Value {
    serde_json::json!({
        "id": name,
        "object": "model",
        "created": state.started_unix_s,
        "owned_by": "tokenwire",
    })
}

fn models(state: &AppState) -> Response<Body> {
    let model = state.snapshot.borrow().model.clone();
    let data: Vec<serde_json::Value> = model.iter().map(|m| model_object(state, &m.name)).collect();
    json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// `GET /v1/models/{id}`: the served model when `id` (percent-decoded:
/// Hugging Face ids hold a `/`) names it, else the API's 404; a 503 with
/// `Retry-After` while it loads.
fn model(state: &AppState, id: &str) -> Response<Body> {
    let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
    let snap = state.snapshot.borrow().clone();
    if !snap.loaded {
        // Not "no such model" while it loads: the client should wait.
        let body = tokenwire_core::dialect::chat::codec::error_body(
            503,
            "server_error",
            "the model is loading",
            None,
        );
        return with_retry_after(json_response(StatusCode::SERVICE_UNAVAILABLE, &body), 1);
    }
    let served = snap.model.as_ref().map(|m| m.name.clone());
    match served {
        Some(name) if name == id => json_response(StatusCode::OK, &model_object(state, &name)),
        _ => {
            let message = format!("the model `{id}` does not exist on this server");
            json_response(
                StatusCode::NOT_FOUND,
                &tokenwire_core::dialect::chat::codec::error_body(
                    404,
                    "model_not_found",
                    &message,
                    Some("model"),
                ),
            )
        }
    }
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
    // The accept key and the permessage-deflate agreement (RFC 7692: the
    // client's offer, within our options) come from the WebSocket layer; the
    // upgraded connection is taken here first, so the layer's own upgrade
    // future (which would find none) is not used.
    let on_upgrade = hyper::upgrade::on(&mut req);
    let handshake = match yawc::WebSocket::upgrade_with_options(&mut req, state.ws_options.clone())
    {
        Ok((handshake, _unused)) => handshake,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("bad WebSocket upgrade: {e}"),
            )
        }
    };
    let extensions = handshake
        .headers()
        .get(header::SEC_WEBSOCKET_EXTENSIONS)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let span = tracing::info_span!("conn", id = meta.conn.0, dialect = dialect.name());
    tokio::spawn(
        async move {
            let socket = match on_upgrade.await {
                Ok(upgraded) => Socket::server(
                    upgraded,
                    extensions.as_deref(),
                    state.ws_options.clone(),
                    state.max_frame_bytes,
                ),
                Err(e) => {
                    tracing::debug!(conn = meta.conn.0, %peer, error = %e, "upgrade failed");
                    return;
                }
            };
            match socket {
                Ok(socket) => {
                    conn::run(
                        socket,
                        meta,
                        state.driver.clone(),
                        state.max_queued_frames,
                        permit,
                    )
                    .await
                }
                Err(e) => {
                    tracing::info!(conn = meta.conn.0, %peer, error = %e, "websocket setup failed");
                }
            }
            drop(state);
        }
        .instrument(span),
    );
    handshake.map(|_| empty())
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
