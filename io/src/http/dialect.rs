//! A dialect's HTTP route (`POST /v1/generate`, ...): one request as a virtual
//! connection on the Host (`Transport::Http`).
//!
//! The body is read within its deadline and size limit, then the dialect's own
//! mapping in the core ([`tokenwire_core::dialect::registry`]) turns it into
//! frames and turns the frames the Host sends back into one JSON response or
//! a `text/event-stream`. If the client goes away, the virtual connection is
//! reported `Closed`, which cancels its generation. Nothing here looks inside
//! a frame: that is the mapping's job.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant as StdInstant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use tokenwire_core::dialect::registry::{http_call, http_failure};
use tokenwire_core::http::{HttpExchange, HttpFailure, HttpReply, HttpRequest, HttpStep, SseEvent};
use tokenwire_core::{ConnId, Dialect, Input, Transport};

use super::reply::{full, Body};
use super::state::{authorization, unauthorized, AppState};
use crate::channel::{read_gate, ConnQueue, DriverHandle, DriverMsg, OutFrame};
use crate::sync::OutboundQueue;

/// Seconds a client is told to wait when the server cannot take the request.
const RETRY_AFTER_S: u32 = 1;

/// Handles one request on `dialect`'s HTTP route.
pub(crate) async fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    dialect: Dialect,
    req: Request<Incoming>,
) -> Response<Body> {
    if let Some(resp) = unauthorized(&state, dialect, Transport::Http, &req) {
        return resp;
    }
    let authorization = authorization(&req);
    let query = req.uri().query().unwrap_or_default().to_owned();
    let max = state.max_frame_bytes;
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return failed(dialect, &HttpFailure::BodyTooLarge { max });
    }
    let encoding = req.headers().get(header::CONTENT_ENCODING).map(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .trim()
            .to_ascii_lowercase()
    });
    let body = match read_body(
        req.into_body(),
        max,
        state.body_timeout,
        state.body_min_rate,
    )
    .await
    {
        Ok(b) => b,
        Err(f) => {
            tracing::info!(%peer, dialect = dialect.name(), failure = ?f, "request body refused");
            return failed(dialect, &f);
        }
    };
    let body = match inflate(body, encoding.as_deref(), max) {
        Ok(b) => b,
        Err(f) => {
            tracing::info!(%peer, dialect = dialect.name(), failure = ?f, "request body refused");
            return failed(dialect, &f);
        }
    };
    let model = state
        .snapshot
        .borrow()
        .model
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let request = HttpRequest {
        method: &method,
        path: &path,
        body: &body,
        model: &model,
    };
    let call = match http_call(dialect, &request) {
        Ok(c) => c,
        Err(reply) => return response(reply),
    };

    let conn = state.next_conn_id();
    let queue: ConnQueue = Arc::new(OutboundQueue::new(state.max_queued_frames));
    let mut guard = VirtualConn {
        conn,
        dialect,
        driver: state.driver.clone(),
        open: false,
        started: StdInstant::now(),
        stream: call.stream,
        frames_out: 0,
        bytes_out: 0,
        request_id: None,
    };
    let opened = state
        .driver
        .send(DriverMsg::Open {
            conn,
            dialect,
            transport: Transport::Http,
            query,
            authorization,
            peer,
            queue: queue.clone(),
            // All of a request's frames are sent at once: nothing to pause.
            gate: read_gate().0,
        })
        .await;
    if opened.is_err() {
        return shutting_down(dialect);
    }
    guard.open = true;
    tracing::info!(
        conn = conn.0,
        %peer,
        dialect = dialect.name(),
        stream = call.stream,
        body_bytes = body.len(),
        "http request opened"
    );
    for text in call.frames {
        let sent = state
            .driver
            .send(DriverMsg::Input(Input::Text { conn, text }))
            .await;
        if sent.is_err() {
            return shutting_down(dialect);
        }
    }

    if call.stream {
        // The first step decides: an error before anything streams is an
        // HTTP error with its status; otherwise the event stream starts.
        let mut exchange = call.exchange;
        let first = match next_step(&queue, &mut guard, &mut exchange).await {
            HttpStep::Reply(r) => return response(r),
            HttpStep::Event(e) => (e.encode(), false),
            HttpStep::LastEvent(e) => (e.encode(), true),
            HttpStep::Events { events, last } => (encode_all(&events), last),
            HttpStep::Wait => return shutting_down(dialect),
        };
        let mut resp = Response::new(BodyExt::boxed(SseBody {
            queue,
            guard,
            exchange,
            first: Some(first.0),
            done: first.1,
        }));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        // nginx then passes the events on as they come even where
        // proxy_buffering is on (docs/deploy.md).
        h.insert(
            header::HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
        resp
    } else {
        collect(&queue, &mut guard, call.exchange).await
    }
}

/// Reads a body of at most `max` bytes that must arrive within `timeout`,
/// extended by one second for every `min_rate` bytes received: a client that
/// trickles its body holds the connection no longer than that.
async fn read_body<B: hyper::body::Body<Data = Bytes> + Unpin>(
    mut body: B,
    max: usize,
    timeout: Duration,
    min_rate: u64,
) -> Result<Bytes, HttpFailure> {
    let start = tokio::time::Instant::now();
    let mut buf = BytesMut::new();
    loop {
        let earned = Duration::from_secs_f64(buf.len() as f64 / min_rate.max(1) as f64);
        let deadline = start + timeout + earned;
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(HttpFailure::BodyTimeout),
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(_))) => return Err(HttpFailure::BodyUnreadable),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(HttpFailure::BodyTooLarge { max });
            }
            buf.extend_from_slice(&data);
        }
    }
}

/// The body as sent, without its `Content-Encoding`: `gzip` is inflated
/// with the same limit as a plain body (a compression bomb stops at
/// `max + 1` bytes and is answered 413), `identity` or none is kept; any
/// other encoding is refused.
fn inflate(body: Bytes, encoding: Option<&str>, max: usize) -> Result<Bytes, HttpFailure> {
    use std::io::Read;
    match encoding {
        None | Some("" | "identity") => Ok(body),
        Some("gzip" | "x-gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .take(max as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|_| HttpFailure::BodyUnreadable)?;
            if out.len() > max {
                return Err(HttpFailure::BodyTooLarge { max });
            }
            Ok(Bytes::from(out))
        }
        Some(other) => Err(HttpFailure::BodyEncoding {
            encoding: other.chars().take(40).collect(),
        }),
    }
}

/// A reply as a response.
fn response(reply: HttpReply) -> Response<Body> {
    let mut resp = Response::new(full(reply.body));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(s) = reply.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

/// The reply for a failure before the Host saw the request. A body that was
/// not read to its end leaves the connection unusable: it is closed after.
fn failed(dialect: Dialect, f: &HttpFailure) -> Response<Body> {
    let mut resp = response(http_failure(dialect, f));
    if matches!(
        f,
        HttpFailure::BodyTooLarge { .. } | HttpFailure::BodyTimeout | HttpFailure::BodyUnreadable
    ) {
        // (A refused encoding was read whole: its connection stays.)
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

fn shutting_down(dialect: Dialect) -> Response<Body> {
    failed(
        dialect,
        &HttpFailure::ShuttingDown {
            retry_after: RETRY_AFTER_S,
        },
    )
}

/// Waits for the exchange's reply (JSON mode).
async fn collect(
    queue: &ConnQueue,
    guard: &mut VirtualConn,
    mut exchange: Box<dyn HttpExchange>,
) -> Response<Body> {
    match next_step(queue, guard, &mut exchange).await {
        HttpStep::Reply(r) => response(r),
        // A JSON exchange never ends with an event; answer rather than hang.
        _ => shutting_down(guard.dialect),
    }
}

/// The exchange's next step that is not `Wait`.
async fn next_step(
    queue: &ConnQueue,
    guard: &mut VirtualConn,
    exchange: &mut Box<dyn HttpExchange>,
) -> HttpStep {
    loop {
        let Some(popped) = queue.pop().await else {
            return exchange.on_close(1001, tokenwire_core::api::close_reason::SHUTTING_DOWN);
        };
        if popped.drained {
            let _ = guard.driver.send(DriverMsg::Drained(guard.conn)).await;
        }
        let step = match popped.item {
            OutFrame::Ping => continue,
            OutFrame::Close { code, reason } => exchange.on_close(code, &reason),
            OutFrame::Text(text) => {
                guard.count(&text);
                exchange.on_frame(&text)
            }
        };
        guard.request_id = exchange.request_id().map(str::to_owned);
        if step != HttpStep::Wait {
            return step;
        }
    }
}

/// The virtual connection's lifetime: reports `Closed` to the driver when
/// dropped (the response finished, or the client went away) and logs the
/// request's counts (never its text).
struct VirtualConn {
    conn: ConnId,
    dialect: Dialect,
    driver: DriverHandle,
    open: bool,
    started: StdInstant,
    stream: bool,
    frames_out: u64,
    bytes_out: u64,
    request_id: Option<String>,
}

impl VirtualConn {
    fn count(&mut self, text: &str) {
        self.frames_out += 1;
        self.bytes_out += text.len() as u64;
    }
}

impl Drop for VirtualConn {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        self.driver
            .send_now(DriverMsg::Input(Input::Closed { conn: self.conn }));
        tracing::info!(
            conn = self.conn.0,
            dialect = self.dialect.name(),
            request_id = self.request_id.as_deref().unwrap_or(""),
            stream = self.stream,
            duration_ms = self.started.elapsed().as_millis() as u64,
            frames_out = self.frames_out,
            bytes_out = self.bytes_out,
            "http request closed"
        );
    }
}

/// The `text/event-stream` body of a streaming request.
struct SseBody {
    queue: ConnQueue,
    guard: VirtualConn,
    exchange: Box<dyn HttpExchange>,
    /// The events that started the stream, encoded, sent first.
    first: Option<String>,
    done: bool,
}

/// Several events' wire form, in order, for one body frame.
fn encode_all(events: &[SseEvent]) -> String {
    events.iter().map(SseEvent::encode).collect()
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(first)))));
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let step = match std::task::ready!(this.queue.poll_pop(cx)) {
                None => this
                    .exchange
                    .on_close(1001, tokenwire_core::api::close_reason::SHUTTING_DOWN),
                Some(popped) => {
                    if popped.drained {
                        this.guard
                            .driver
                            .send_now(DriverMsg::Drained(this.guard.conn));
                    }
                    match popped.item {
                        OutFrame::Ping => continue,
                        OutFrame::Close { code, reason } => this.exchange.on_close(code, &reason),
                        OutFrame::Text(text) => {
                            this.guard.count(&text);
                            this.exchange.on_frame(&text)
                        }
                    }
                }
            };
            this.guard.request_id = this.exchange.request_id().map(str::to_owned);
            let wire = match step {
                HttpStep::Wait => continue,
                HttpStep::Event(e) => e.encode(),
                HttpStep::LastEvent(e) => {
                    this.done = true;
                    e.encode()
                }
                HttpStep::Events { events, last } => {
                    this.done = last;
                    encode_all(&events)
                }
                HttpStep::Reply(r) => {
                    // A streaming exchange ends with an event; relay the body.
                    this.done = true;
                    SseEvent {
                        event: None,
                        data: r.body,
                    }
                    .encode()
                }
            };
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(wire)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    type Chunk = Result<Frame<Bytes>, Infallible>;

    /// A request body fed by the test, a chunk at a time.
    fn fed_body() -> (
        tokio::sync::mpsc::Sender<Chunk>,
        http_body_util::StreamBody<impl futures_util::Stream<Item = Chunk> + Unpin>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(4);
        let chunks =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
            );
        (tx, http_body_util::StreamBody::new(Box::pin(chunks)))
    }

    /// Sends `chunk` every `every` of paused time until the body is read or
    /// `n` chunks went; returns the read's result and the time it took.
    async fn trickle(
        chunk: &'static [u8],
        every: Duration,
        n: usize,
    ) -> (Result<Bytes, HttpFailure>, Duration) {
        let (tx, body) = fed_body();
        let started = tokio::time::Instant::now();
        let reader = tokio::spawn(read_body(body, 1 << 20, Duration::from_secs(1), 1000));
        for _ in 0..n {
            if reader.is_finished()
                || tx
                    .send(Ok(Frame::data(Bytes::from_static(chunk))))
                    .await
                    .is_err()
            {
                break;
            }
            tokio::time::advance(every).await;
            tokio::task::yield_now().await;
        }
        drop(tx);
        let result = reader.await.expect("reader");
        (result, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_trickled_below_the_minimum_rate_times_out_at_its_deadline() {
        // One byte every 150 ms is far below 1000 bytes/s: the 1 s deadline
        // grows by only a millisecond per byte.
        let (result, took) = trickle(b" ", Duration::from_millis(150), 1000).await;
        assert!(
            matches!(result, Err(HttpFailure::BodyTimeout)),
            "{result:?}"
        );
        assert!(took < Duration::from_millis(1300), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_arriving_at_the_minimum_rate_outlives_the_base_deadline() {
        // 500 bytes every 100 ms (5000 bytes/s) for 3 s: each chunk earns
        // half a second, so the body completes long past the 1 s base.
        let chunk: &'static [u8] = &[b'x'; 500];
        let (result, took) = trickle(chunk, Duration::from_millis(100), 30).await;
        assert_eq!(result.expect("complete").len(), 15_000);
        assert!(took >= Duration::from_secs(3), "{took:?}");
    }
}
