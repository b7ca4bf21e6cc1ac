//! One WebSocket connection: a reader that forwards frames to the driver and
//! keeps reading while the writer streams, and a writer that drains the
//! connection's outbound queue onto the socket.
//!
//! The driver is told `Closed` exactly once, when the connection ends for any
//! reason. Nothing here looks inside a frame: logs carry ids, counts, byte
//! lengths and durations only.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokenwire_core::{ConnId, Dialect, Input, Transport};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::driver::{ConnQueue, DriverHandle, DriverMsg, OutFrame};
use crate::sync::{ConnectionPermit, OutboundQueue, Pop};

/// How long a closing connection may take to deliver its last frames and see
/// the peer's close reply before the socket is dropped.
pub(crate) const CLOSE_LINGER: Duration = Duration::from_secs(5);
/// Most frames written before one flush.
const WRITE_BATCH: usize = 64;
/// Extra room over `max_frame_bytes` before tungstenite itself refuses a message
/// (the Host enforces the exact limit).
const FRAME_SLACK: usize = 1024;
/// Longest close reason a close frame can carry, in bytes.
const MAX_CLOSE_REASON: usize = 123;

/// The socket type after an HTTP upgrade.
pub(crate) type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// The WebSocket settings for a `max_frame_bytes` limit: larger messages fail
/// with a capacity error, which becomes `Input::FrameTooLarge`.
pub(crate) fn websocket_config(max_frame_bytes: usize) -> WebSocketConfig {
    let limit = max_frame_bytes.saturating_add(FRAME_SLACK);
    WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
        .read_buffer_size(16 * 1024)
        .write_buffer_size(16 * 1024)
}

/// Who a connection is.
#[derive(Debug, Clone)]
pub(crate) struct ConnMeta {
    /// Its id.
    pub conn: ConnId,
    /// Its dialect.
    pub dialect: Dialect,
    /// Raw query string.
    pub query: String,
    /// Peer address.
    pub peer: SocketAddr,
}

#[derive(Debug, Default)]
struct Counts {
    frames_in: u64,
    bytes_in: u64,
    frames_out: u64,
    bytes_out: u64,
}

/// How the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadEnd {
    /// The peer closed, or the socket ended.
    PeerClosed,
    /// A read error (protocol violation, reset).
    Error,
    /// A frame over the limit; the Host will close with 1009.
    TooLarge,
    /// The driver is gone.
    DriverGone,
}

/// How the writer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteEnd {
    /// A close frame with this code was sent (or tried).
    SentClose(u16),
    /// The queue ended without a close frame.
    QueueEnded,
    /// The socket failed or the close could not be delivered in time.
    Error,
}

/// Runs one upgraded WebSocket connection to its end. `permit` is held until then.
pub(crate) async fn run(
    ws: Socket,
    meta: ConnMeta,
    driver: DriverHandle,
    max_queued_frames: usize,
    permit: ConnectionPermit,
) {
    let started = StdInstant::now();
    let queue: ConnQueue = Arc::new(OutboundQueue::new(max_queued_frames));
    let opened = driver
        .send(DriverMsg::Open {
            conn: meta.conn,
            dialect: meta.dialect,
            transport: Transport::WebSocket,
            query: meta.query.clone(),
            peer: meta.peer,
            queue: queue.clone(),
        })
        .await;
    let (mut sink, stream) = ws.split();
    if opened.is_err() {
        let _ = tokio::time::timeout(
            CLOSE_LINGER,
            sink.send(close_message(
                1001,
                tokenwire_core::api::close_reason::SHUTTING_DOWN,
            )),
        )
        .await;
        return;
    }
    tracing::info!(
        conn = meta.conn.0,
        dialect = meta.dialect.name(),
        peer = %meta.peer,
        "connection opened"
    );

    let mut counts_in = Counts::default();
    let mut counts_out = Counts::default();
    let (read_end, write_end) = {
        let reader = read_loop(stream, meta.conn, &driver, &mut counts_in);
        let writer = write_loop(&mut sink, &queue, meta.conn, &driver, &mut counts_out);
        tokio::pin!(reader);
        tokio::pin!(writer);
        tokio::select! {
            r = &mut reader => {
                let w = if r == ReadEnd::TooLarge {
                    // The Host answers with a 1009 close; let the writer deliver it.
                    tokio::time::timeout(CLOSE_LINGER, &mut writer).await.ok()
                } else {
                    None
                };
                (Some(r), w)
            }
            w = &mut writer => {
                // Our close is out: read until the peer's close reply, briefly.
                let r = tokio::time::timeout(CLOSE_LINGER, &mut reader).await.ok();
                (r, Some(w))
            }
        }
    };
    queue.close();
    let _ = driver
        .send(DriverMsg::Input(Input::Closed { conn: meta.conn }))
        .await;
    drop(permit);

    let close_code = match write_end {
        Some(WriteEnd::SentClose(code)) => Some(code),
        _ => None,
    };
    tracing::info!(
        conn = meta.conn.0,
        dialect = meta.dialect.name(),
        peer = %meta.peer,
        duration_ms = started.elapsed().as_millis() as u64,
        frames_in = counts_in.frames_in,
        bytes_in = counts_in.bytes_in,
        frames_out = counts_out.frames_out,
        bytes_out = counts_out.bytes_out,
        close_code,
        read_end = ?read_end,
        write_end = ?write_end,
        "connection closed"
    );
}

async fn read_loop(
    mut stream: SplitStream<Socket>,
    conn: ConnId,
    driver: &DriverHandle,
    counts: &mut Counts,
) -> ReadEnd {
    while let Some(msg) = stream.next().await {
        let input = match msg {
            Ok(Message::Text(text)) => {
                counts.frames_in += 1;
                counts.bytes_in += text.len() as u64;
                Input::Text {
                    conn,
                    text: text.as_str().to_owned(),
                }
            }
            Ok(Message::Binary(data)) => {
                counts.frames_in += 1;
                counts.bytes_in += data.len() as u64;
                Input::Binary {
                    conn,
                    len: data.len(),
                }
            }
            Ok(Message::Pong(_)) => Input::Pong { conn },
            // Pings are answered and the close handshake completed by tungstenite
            // as long as we keep reading; the stream ends after the close.
            Ok(Message::Ping(_) | Message::Close(_) | Message::Frame(_)) => continue,
            Err(WsError::Capacity(e)) => {
                tracing::info!(conn = conn.0, error = %e, "frame too large");
                if driver
                    .send(DriverMsg::Input(Input::FrameTooLarge { conn }))
                    .await
                    .is_err()
                {
                    return ReadEnd::DriverGone;
                }
                return ReadEnd::TooLarge;
            }
            Err(e) => {
                tracing::debug!(conn = conn.0, error = %e, "read error");
                return ReadEnd::Error;
            }
        };
        if driver.send(DriverMsg::Input(input)).await.is_err() {
            return ReadEnd::DriverGone;
        }
    }
    ReadEnd::PeerClosed
}

async fn write_loop(
    sink: &mut SplitSink<Socket, Message>,
    queue: &ConnQueue,
    conn: ConnId,
    driver: &DriverHandle,
    counts: &mut Counts,
) -> WriteEnd {
    loop {
        let Some(first) = queue.pop().await else {
            return WriteEnd::QueueEnded;
        };
        let mut next = Some(first);
        let mut written = 0;
        let mut close = None;
        // Feed what is queued (up to a batch), then flush once.
        while let Some(popped) = next.take() {
            if popped.drained && driver.send(DriverMsg::Drained(conn)).await.is_err() {
                return WriteEnd::QueueEnded;
            }
            match popped.item {
                OutFrame::Close { code, reason } => {
                    close = Some((code, reason));
                    break;
                }
                OutFrame::Text(text) => {
                    counts.frames_out += 1;
                    counts.bytes_out += text.len() as u64;
                    if !guarded(queue, sink.feed(Message::text(text))).await {
                        return WriteEnd::Error;
                    }
                }
                OutFrame::Ping => {
                    if !guarded(queue, sink.feed(Message::Ping(Default::default()))).await {
                        return WriteEnd::Error;
                    }
                }
            }
            written += 1;
            if written < WRITE_BATCH {
                if let Pop::Item(p) = queue.try_pop() {
                    next = Some(p);
                }
            }
        }
        if written > 0 && !guarded(queue, sink.flush()).await {
            return WriteEnd::Error;
        }
        if let Some((code, reason)) = close {
            let sent =
                tokio::time::timeout(CLOSE_LINGER, sink.send(close_message(code, &reason))).await;
            return match sent {
                Ok(Ok(())) => WriteEnd::SentClose(code),
                _ => WriteEnd::Error,
            };
        }
    }
}

/// Runs a socket write, giving up if the queue has been closed for longer than
/// [`CLOSE_LINGER`] (a peer that stopped reading cannot hold the connection open).
/// Returns true when the write succeeded.
async fn guarded<F>(queue: &ConnQueue, write: F) -> bool
where
    F: Future<Output = Result<(), WsError>>,
{
    tokio::select! {
        biased;
        r = write => r.is_ok(),
        _ = async {
            queue.closed().await;
            tokio::time::sleep(CLOSE_LINGER).await;
        } => false,
    }
}

fn close_message(code: u16, reason: &str) -> Message {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason[..end].to_owned().into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_to_the_frame_limit_on_a_char_boundary() {
        let long = "é".repeat(100);
        match close_message(1008, &long) {
            Message::Close(Some(f)) => {
                assert!(f.reason.len() <= MAX_CLOSE_REASON);
                assert_eq!(u16::from(f.code), 1008);
            }
            other => panic!("not a close: {other:?}"),
        }
    }

    #[test]
    fn websocket_limit_is_a_little_over_the_frame_limit() {
        let c = websocket_config(1000);
        assert_eq!(c.max_message_size, Some(1000 + FRAME_SLACK));
        assert_eq!(c.max_frame_size, Some(1000 + FRAME_SLACK));
    }
}
