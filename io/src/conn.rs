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
use tokenwire_core::api::close_reason;
use tokenwire_core::{ConnId, Dialect, Input, Transport};
use tokio::sync::watch;
use yawc::close::CloseCode;
use yawc::{Frame, WebSocketError};

use crate::channel::{read_gate, ConnQueue, DriverHandle, DriverMsg, OutFrame};
use crate::http::state::Permits;
use crate::sync::{OutboundQueue, Pop};
use crate::ws::{Incoming, ReadFailure, Socket};

/// How long a closing connection may take to finish the write in flight and
/// deliver its close frame before the socket is dropped.
pub(crate) const CLOSE_LINGER: Duration = Duration::from_secs(5);
/// How long to wait for the peer's close reply once ours is out (a peer that
/// never answers must not hold a shutdown up).
pub(crate) const REPLY_LINGER: Duration = Duration::from_secs(1);
/// Most frames written before one flush.
const WRITE_BATCH: usize = 64;
/// Longest close reason a close frame can carry, in bytes.
const MAX_CLOSE_REASON: usize = 123;

/// Who a connection is.
#[derive(Debug, Clone)]
pub(crate) struct ConnMeta {
    /// Its id.
    pub conn: ConnId,
    /// Its dialect.
    pub dialect: Dialect,
    /// Raw query string.
    pub query: String,
    /// The upgrade's `Authorization` header (never logged).
    pub authorization: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReadEnd {
    /// The peer closed, or the socket ended.
    PeerClosed,
    /// The socket failed (reset, I/O error).
    Error,
    /// The peer sent what ends the connection with a close: a message over
    /// the limit (1009) or a protocol violation (1007 for text that is not
    /// UTF-8, 1002 otherwise).
    Refused {
        /// The close code owed.
        code: u16,
        /// Why, for the close frame and the log (never frame content).
        reason: String,
        /// The WebSocket layer queued the close itself.
        close_queued: bool,
    },
    /// The driver is gone.
    DriverGone,
}

/// How the writer stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum WriteEnd {
    /// The connection was being closed with `code`; `sent` tells whether the
    /// close frame reached the socket within the linger.
    Close {
        /// The close code.
        code: u16,
        /// The close reason.
        reason: String,
        /// The close frame was written.
        sent: bool,
    },
    /// The queue ended without a close frame.
    QueueEnded,
    /// The socket failed.
    Error,
}

/// Runs one upgraded WebSocket connection to its end. `permit` is held until then.
pub(crate) async fn run(
    ws: Socket,
    meta: ConnMeta,
    driver: DriverHandle,
    max_queued_frames: usize,
    permit: Permits,
) {
    let started = StdInstant::now();
    let queue: ConnQueue = Arc::new(OutboundQueue::new(max_queued_frames));
    let (gate, gate_rx) = read_gate();
    let opened = driver
        .send(DriverMsg::Open {
            conn: meta.conn,
            dialect: meta.dialect,
            transport: Transport::WebSocket,
            query: meta.query.clone(),
            authorization: meta.authorization.clone(),
            peer: meta.peer,
            queue: queue.clone(),
            gate,
        })
        .await;
    let (mut sink, stream) = ws.split();
    if opened.is_err() {
        let _ = tokio::time::timeout(
            CLOSE_LINGER,
            sink.send(close_message(1001, close_reason::SHUTTING_DOWN)),
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
        let reader = read_loop(stream, gate_rx, &queue, meta.conn, &driver, &mut counts_in);
        let writer = write_loop(&mut sink, &queue, meta.conn, &driver, &mut counts_out);
        tokio::pin!(reader);
        tokio::pin!(writer);
        tokio::select! {
            r = &mut reader => (Some(r), None),
            w = &mut writer => {
                // Our close is out: read until the peer's close reply, briefly.
                let r = tokio::time::timeout(REPLY_LINGER, &mut reader).await.ok();
                (r, Some(w))
            }
        }
    };
    // A message too large or a protocol error: the reader closed our queue
    // (nothing may follow the close); send the close owed, unless ours
    // already went.
    let write_end = match (&read_end, write_end) {
        (_, Some(w @ WriteEnd::Close { sent: true, .. })) => Some(w),
        (
            Some(ReadEnd::Refused {
                code,
                reason,
                close_queued,
            }),
            _,
        ) => {
            tracing::info!(conn = meta.conn.0, code, reason = %reason, "refused a frame; closing");
            Some(send_refusal_close(&mut sink, *code, reason.clone(), *close_queued).await)
        }
        (_, w) => w,
    };
    queue.close();
    let _ = driver
        .send(DriverMsg::Input(Input::Closed { conn: meta.conn }))
        .await;
    drop(permit);

    let (close_code, close_reason, close_sent) = match &write_end {
        Some(WriteEnd::Close { code, reason, sent }) => {
            (Some(*code), Some(reason.as_str()), Some(*sent))
        }
        _ => (None, None, None),
    };
    let read_end = read_end.map(|r| match r {
        ReadEnd::Refused { code: 1009, .. } => "too_large",
        ReadEnd::Refused { .. } => "protocol_error",
        ReadEnd::PeerClosed => "peer_closed",
        ReadEnd::Error => "error",
        ReadEnd::DriverGone => "driver_gone",
    });
    let write_end = write_end.as_ref().map(|w| match w {
        WriteEnd::Close { .. } => "close",
        WriteEnd::QueueEnded => "queue_ended",
        WriteEnd::Error => "error",
    });
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
        close_reason,
        close_sent,
        read_end,
        write_end,
        "connection closed"
    );
}

async fn read_loop(
    mut stream: SplitStream<Socket>,
    mut gate: watch::Receiver<bool>,
    queue: &ConnQueue,
    conn: ConnId,
    driver: &DriverHandle,
    counts: &mut Counts,
) -> ReadEnd {
    loop {
        // The Host may ask us to stop reading while this connection's frames
        // pile up (TCP then pushes back on the peer).
        if gate.wait_for(|open| *open).await.is_err() {
            return ReadEnd::DriverGone;
        }
        let Some(read) = stream.next().await else {
            break;
        };
        let input = match read {
            Ok(Incoming::Text(text)) => {
                counts.frames_in += 1;
                counts.bytes_in += text.len() as u64;
                Input::Text { conn, text }
            }
            Ok(Incoming::Binary(len)) => {
                counts.frames_in += 1;
                counts.bytes_in += len as u64;
                Input::Binary { conn, len }
            }
            Ok(Incoming::Pong) => Input::Pong { conn },
            Err(ReadFailure {
                code: None, reason, ..
            }) => {
                tracing::debug!(conn = conn.0, reason = %reason, "read failed");
                return ReadEnd::Error;
            }
            Err(ReadFailure {
                code: Some(code),
                reason,
                close_queued,
            }) => {
                // The close owed goes next: nothing queued may follow it.
                queue.close_now(None);
                if code == 1009 {
                    // The Host ends the connection's generations (its own
                    // close finds the queue closed).
                    if driver
                        .send(DriverMsg::Input(Input::FrameTooLarge { conn }))
                        .await
                        .is_err()
                    {
                        return ReadEnd::DriverGone;
                    }
                }
                return ReadEnd::Refused {
                    code,
                    reason,
                    close_queued,
                };
            }
        };
        if driver.send(DriverMsg::Input(input)).await.is_err() {
            return ReadEnd::DriverGone;
        }
    }
    ReadEnd::PeerClosed
}

/// Sends the close owed for a refused frame within [`CLOSE_LINGER`]: the one
/// the WebSocket layer queued (a flush sends it), or ours.
async fn send_refusal_close(
    sink: &mut SplitSink<Socket, Frame>,
    code: u16,
    reason: String,
    close_queued: bool,
) -> WriteEnd {
    let sent = tokio::time::timeout(CLOSE_LINGER, async {
        if close_queued {
            sink.flush().await
        } else {
            sink.send(close_message(code, &reason)).await
        }
    })
    .await;
    WriteEnd::Close {
        code,
        reason,
        sent: matches!(sent, Ok(Ok(()))),
    }
}

async fn write_loop(
    sink: &mut SplitSink<Socket, Frame>,
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
            let msg = match popped.item {
                OutFrame::Close { code, reason } => {
                    close = Some((code, reason));
                    break;
                }
                OutFrame::Text(text) => {
                    counts.frames_out += 1;
                    counts.bytes_out += text.len() as u64;
                    Frame::text(text)
                }
                OutFrame::Ping => Frame::ping(Vec::new()),
            };
            if !guarded(queue, sink.feed(msg)).await {
                return gave_up(queue);
            }
            written += 1;
            if written < WRITE_BATCH {
                if let Pop::Item(p) = queue.try_pop() {
                    next = Some(p);
                }
            }
        }
        if written > 0 && !guarded(queue, sink.flush()).await {
            return gave_up(queue);
        }
        if let Some((code, reason)) = close {
            let sent =
                tokio::time::timeout(CLOSE_LINGER, sink.send(close_message(code, &reason))).await;
            return WriteEnd::Close {
                code,
                reason,
                sent: matches!(sent, Ok(Ok(()))),
            };
        }
    }
}

/// The writer could not finish a write within the linger after the queue
/// closed: report the close that was owed (from the queue), undelivered.
fn gave_up(queue: &ConnQueue) -> WriteEnd {
    while let Pop::Item(p) = queue.try_pop() {
        if let OutFrame::Close { code, reason } = p.item {
            return WriteEnd::Close {
                code,
                reason,
                sent: false,
            };
        }
    }
    WriteEnd::Error
}

/// Runs a socket write, giving up if the queue has been closed for longer than
/// [`CLOSE_LINGER`] (a peer that stopped reading cannot hold the connection open).
/// Returns true when the write succeeded.
async fn guarded<F>(queue: &ConnQueue, write: F) -> bool
where
    F: Future<Output = Result<(), WebSocketError>>,
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

fn close_message(code: u16, reason: &str) -> Frame {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Frame::close(CloseCode::from(code), &reason[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_to_the_frame_limit_on_a_char_boundary() {
        let long = "é".repeat(100);
        let f = close_message(1008, &long);
        assert_eq!(f.opcode(), yawc::OpCode::Close);
        assert_eq!(f.close_code().map(u16::from), Some(1008));
        let reason = f.close_reason().expect("UTF-8").expect("a reason");
        assert!(reason.len() <= MAX_CLOSE_REASON && !reason.is_empty());
    }
}
