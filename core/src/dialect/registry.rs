//! The table of dialects: what each one is, in one row. A row names the
//! dialect's connection machine, its HTTP routes (if it has any) and the
//! host-wide state it keeps (if any); the Host and the shell find all three
//! here and nowhere else. Adding a dialect is writing its module and adding
//! its row (and its variant in [`Dialect`], which names its path).
//!
//! This is the one module that imports every dialect; no dialect imports it.

use super::state::{DialectState, HostWide};
use super::{anthropic, batch, cai, chat, generate, responses, session, DialectConn};
use crate::config::HostConfig;
use crate::conn::Dialect;
use crate::http::{
    describe, HttpCall, HttpFailure, HttpReply, HttpRequest, HttpSpec, PathMatch, Route,
};

/// Makes a dialect's host-wide state from the Host's settings.
pub type MakeState = fn(&HostConfig) -> Box<dyn HostWide>;

/// One dialect: everything the Host and the shell need to serve it.
pub struct DialectSpec {
    /// Which dialect the row describes.
    pub dialect: Dialect,
    /// A fresh machine for one connection.
    pub machine: fn() -> Box<dyn DialectConn>,
    /// Its HTTP routes, if it is served over HTTP too.
    pub http: Option<&'static HttpSpec>,
    /// Its host-wide state, made once per Host from the Host's settings,
    /// if it keeps anything beyond one connection.
    pub state: Option<MakeState>,
    /// It checks keys and charges rate limits itself, with its own
    /// refusals (`cai`'s query-string keys and 4001-4003 closes), so the
    /// Host and the shell leave both to it.
    pub own_auth: bool,
}

/// Every dialect this build serves, in [`Dialect::ALL`]'s order.
pub static DIALECTS: [DialectSpec; 7] = [
    DialectSpec {
        dialect: Dialect::Generate,
        machine: || Box::new(generate::GenerateConn::default()),
        http: Some(&generate::http::SPEC),
        state: None,
        own_auth: false,
    },
    DialectSpec {
        dialect: Dialect::Session,
        machine: || Box::new(session::SessionConn::default()),
        http: Some(&session::http::SPEC),
        state: Some(|c| Box::new(session::state::SessionState::new(c))),
        own_auth: false,
    },
    DialectSpec {
        dialect: Dialect::Responses,
        machine: || Box::new(responses::ResponsesConn::default()),
        http: Some(&responses::http::SPEC),
        state: Some(|c| Box::new(responses::store::ResponseStore::new(c.response_store_size))),
        own_auth: false,
    },
    DialectSpec {
        dialect: Dialect::Batch,
        machine: || Box::new(batch::BatchConn::default()),
        http: None,
        state: Some(|c| Box::new(batch::cache::ContinueCache::new(c.batch_cache_entries))),
        own_auth: false,
    },
    DialectSpec {
        dialect: Dialect::Cai,
        machine: || Box::new(cai::CaiConn::default()),
        http: None,
        state: Some(|c| Box::new(cai::state::CaiState::for_host(c))),
        own_auth: true,
    },
    DialectSpec {
        dialect: Dialect::Chat,
        machine: || Box::new(chat::ChatConn::default()),
        http: Some(&chat::http::SPEC),
        state: None,
        own_auth: false,
    },
    DialectSpec {
        dialect: Dialect::Anthropic,
        // Anthropic's requests are the chat machine's `messages` route;
        // the dialect's own part is its HTTP mapping.
        machine: || Box::new(chat::ChatConn::default()),
        http: Some(&anthropic::http::SPEC),
        state: None,
        own_auth: false,
    },
];

/// `dialect`'s row.
pub fn spec(dialect: Dialect) -> &'static DialectSpec {
    // The rows follow `Dialect::ALL`, whose order is the enum's (tested).
    &DIALECTS[dialect as usize]
}

/// The machine for a dialect, if this build serves it.
pub fn machine_for(dialect: Dialect) -> Option<Box<dyn DialectConn>> {
    Some((spec(dialect).machine)())
}

/// The dialects' host-wide state for a Host with `config`: each part as
/// its row makes it.
pub fn dialect_state(config: &HostConfig) -> DialectState {
    DialectState::new(
        DIALECTS
            .iter()
            .filter_map(|row| Some((row.dialect, (row.state?)(config)))),
    )
}

/// Where `method` and `path` go: the dialect whose route it is, a known path
/// asked with another method, or nowhere.
pub fn route(method: &str, path: &str) -> Route {
    let method = if method == "HEAD" { "GET" } else { method };
    let mut allowed = None;
    for row in &DIALECTS {
        for r in row.http.map_or(&[][..], |h| h.routes) {
            if r.path.matches(path) {
                if r.method == method {
                    return Route::Dialect(row.dialect);
                }
                allowed.get_or_insert(r.method);
            }
        }
    }
    allowed.map_or(Route::NotFound, Route::WrongMethod)
}

/// The route pattern `path` belongs to, for metrics: the path of an exact
/// route, `prefix{id}` for an id route (`/v1/responses/{id}`), `None` when
/// no dialect serves it. A bounded set, whatever clients send.
pub fn route_pattern(path: &str) -> Option<String> {
    DIALECTS
        .iter()
        .flat_map(|row| row.http.map_or(&[][..], |h| h.routes))
        .find(|r| r.path.matches(path))
        .map(|r| match r.path {
            PathMatch::Exact(p) => p.to_string(),
            PathMatch::Id(prefix) => format!("{prefix}{{id}}"),
        })
}

/// Maps a request for `dialect`'s HTTP route to its frames, or the error
/// reply (in the dialect's error shape) when the request is not valid.
pub fn http_call(dialect: Dialect, req: &HttpRequest<'_>) -> Result<HttpCall, HttpReply> {
    match spec(dialect).http {
        Some(h) => (h.call)(req),
        None => Err(failure_json(
            404,
            &format!("the {} dialect has no HTTP route", dialect.name()),
        )),
    }
}

/// The reply for a failure the shell met on `dialect`'s HTTP route, in that
/// dialect's error shape.
pub fn http_failure(dialect: Dialect, failure: &HttpFailure) -> HttpReply {
    match spec(dialect).http {
        Some(h) => (h.failure)(failure),
        None => {
            let (status, message, retry_after) = describe(failure);
            HttpReply {
                retry_after,
                ..failure_json(status, &message)
            }
        }
    }
}

/// A plain error object for routes outside any dialect.
fn failure_json(status: u16, message: &str) -> HttpReply {
    let body = serde_json::json!({
        "type": "error",
        "error": if status >= 500 { "unavailable" } else { "invalid_request" },
        "message": message,
        "recoverable": true,
    })
    .to_string();
    HttpReply::new(status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_follow_the_dialects_order() {
        for (row, d) in DIALECTS.iter().zip(Dialect::ALL) {
            assert_eq!(row.dialect, d);
            assert_eq!(spec(d).dialect, d);
        }
        assert_eq!(DIALECTS.len(), Dialect::ALL.len());
    }

    #[test]
    fn routes_go_to_their_dialect_or_say_which_method_they_take() {
        let cases = [
            ("POST", "/v1/generate", Route::Dialect(Dialect::Generate)),
            ("POST", "/v1/inference", Route::Dialect(Dialect::Session)),
            ("POST", "/v1/responses", Route::Dialect(Dialect::Responses)),
            (
                "GET",
                "/v1/responses/r1",
                Route::Dialect(Dialect::Responses),
            ),
            (
                "HEAD",
                "/v1/responses/r1",
                Route::Dialect(Dialect::Responses),
            ),
            ("GET", "/v1/generate", Route::WrongMethod("POST")),
            ("GET", "/v1/responses", Route::WrongMethod("POST")),
            ("POST", "/v1/responses/r1", Route::WrongMethod("GET")),
            ("GET", "/v1/responses/", Route::NotFound),
            ("GET", "/v1/responses/a/b", Route::NotFound),
            ("POST", "/v1/nothing", Route::NotFound),
            ("POST", "/v1/messages", Route::Dialect(Dialect::Anthropic)),
            (
                "POST",
                "/v1/messages/count_tokens",
                Route::Dialect(Dialect::Anthropic),
            ),
            ("GET", "/v1/messages", Route::WrongMethod("POST")),
        ];
        for (method, path, want) in cases {
            assert_eq!(route(method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn a_dialect_without_http_answers_in_the_plain_error_shape() {
        let req = HttpRequest {
            method: "POST",
            path: "/x",
            body: b"{}",
            model: "m",
        };
        let reply = http_call(Dialect::Batch, &req).expect_err("no HTTP route");
        assert_eq!(reply.status, 404);
        assert!(reply.body.contains("batch dialect has no HTTP route"));
        let reply = http_failure(Dialect::Cai, &HttpFailure::BodyTimeout);
        assert_eq!(reply.status, 408);
    }
}
