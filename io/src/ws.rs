//! One upgraded WebSocket as the connection task sees it: a stream of whole
//! messages and a sink of frames.
//!
//! The frame layer is yawc's `Streaming`: RFC 6455 framing, masking, ping
//! replies, the close handshake and permessage-deflate (RFC 7692), with
//! every frame's payload bounded on the wire and once inflated. On top of
//! it this module assembles fragmented messages under the same bound and
//! checks that text is UTF-8, so it knows, for every failed read, whether
//! the frame layer already queued its close (its own errors) or whether the
//! close is ours to send (an assembly error). Under the frame layer,
//! [`Lingering`] keeps a closing socket from resetting before the peer has
//! read our close frame.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::{Sink, SinkExt, Stream};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use yawc::streaming::Streaming;
use yawc::{DeflatePool, Frame, OpCode, Options, Role, WebSocket, WebSocketError};

/// Extra room over `max_frame_bytes` before this layer refuses a message
/// (the Host enforces the exact limit).
const FRAME_SLACK: usize = 1024;
/// Bytes the frame layer keeps for reading from the socket; it allocates
/// this much per connection up front, so it is most of what an idle
/// connection costs. Client frames are small (a config, a control); a large
/// one grows the buffer for as long as it takes, then gives the memory back.
const READ_BUFFER: usize = 2 * 1024;
/// Bytes the frame layer keeps for writing; it grows for a burst and
/// returns to this once flushed.
const WRITE_BUFFER: usize = 512;
/// Bytes of outbound frames buffered before a write must reach the socket.
const BACKPRESSURE: usize = 16 * 1024;
/// How long a dropped socket keeps reading (and discarding) what the peer
/// still sends, so that our close frame is not lost to a reset.
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes a dropped socket discards before it gives up and resets.
const LINGER_BYTES: usize = 1 << 20;

/// Messages shorter than this go uncompressed: a token frame (under 100
/// bytes of JSON) does not shrink on its own, and skipping it means a
/// streaming connection never takes deflate state for it.
const COMPRESSION_THRESHOLD: usize = 128;
/// Deflate states kept for reuse between messages, server-wide: about the
/// messages compressed at one moment (the runtime's threads), not the
/// connections.
const DEFLATE_POOL: usize = 16;

/// The WebSocket settings for a `max_frame_bytes` limit: a larger message,
/// on the wire or once inflated, is refused with 1009, and inflation stops
/// at the limit, so a compression bomb costs at most the limit in memory.
///
/// `compress` accepts permessage-deflate when a client offers it, with no
/// context takeover in either direction (RFC 7692 lets the server impose
/// both): a connection that keeps its own deflate window costs about 370
/// KiB for its whole life, against the few KiB an idle connection is meant
/// to cost, so each message borrows state from one server-wide pool
/// instead. Messages of [`COMPRESSION_THRESHOLD`] bytes and more are
/// compressed (completions, `batch` results, long texts); the price is
/// that no message can refer to an earlier one.
pub(crate) fn websocket_options(max_frame_bytes: usize, compress: bool) -> Options {
    // The frame layer's bound is exclusive.
    let limit = message_limit(max_frame_bytes) + 1;
    let options = Options::default()
        .with_limits(limit, limit)
        .with_read_buffer_capacity(READ_BUFFER)
        .with_write_buffer_capacity(WRITE_BUFFER)
        .with_backpressure_boundary(BACKPRESSURE)
        .with_no_delay();
    if compress {
        options
            .with_low_latency_compression()
            .server_no_context_takeover()
            .client_no_context_takeover()
            .with_deflate_pool(DeflatePool::new(DEFLATE_POOL))
            .with_compression_threshold(COMPRESSION_THRESHOLD)
    } else {
        options.without_compression()
    }
}

/// Largest message this layer passes on for a `max_frame_bytes` limit.
fn message_limit(max_frame_bytes: usize) -> usize {
    max_frame_bytes.saturating_add(FRAME_SLACK)
}

/// A whole message, or a control frame the connection acts on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A text message.
    Text(String),
    /// A binary message of this many bytes (refused by every dialect).
    Binary(usize),
    /// A reply to our ping.
    Pong,
}

/// Why a read failed, and who sends the close it calls for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ReadFailure {
    /// The close code owed: 1009 for a message over the limit, 1007 for
    /// text that is not UTF-8, 1002 for any other protocol violation; none
    /// when the socket itself failed.
    pub code: Option<u16>,
    /// What was wrong, for the close frame and the log (never content).
    pub reason: String,
    /// The frame layer already queued the close (flushing the sink sends
    /// it); otherwise the connection sends its own.
    pub close_queued: bool,
}

/// An upgraded WebSocket: [`Incoming`] messages in, frames out.
pub(crate) struct Socket {
    frames: Streaming<Lingering<TokioIo<Upgraded>>>,
    messages: Assembler,
    /// A read failed: the stream has ended.
    failed: bool,
}

/// Assembles frames into messages of at most `limit` bytes.
struct Assembler {
    limit: usize,
    /// A fragmented message being assembled: its opcode and bytes so far.
    partial: Option<(OpCode, Vec<u8>)>,
}

impl Socket {
    /// The server side of a connection whose handshake agreed `extensions`
    /// (the `Sec-WebSocket-Extensions` value we answered, if any).
    pub(crate) fn server(
        upgraded: Upgraded,
        extensions: Option<&str>,
        options: Options,
        max_frame_bytes: usize,
    ) -> Result<Socket, WebSocketError> {
        let io = Lingering::new(TokioIo::new(upgraded));
        let ws = WebSocket::from_stream_with_extensions(io, Role::Server, extensions, options)?;
        Ok(Socket {
            frames: ws.into_streaming(),
            messages: Assembler {
                limit: message_limit(max_frame_bytes),
                partial: None,
            },
            failed: false,
        })
    }
}

impl Assembler {
    /// Takes one frame into the message being assembled: a whole message
    /// when it completes one, `None` for a fragment or an ignored control
    /// frame.
    fn push(&mut self, frame: Frame) -> Result<Option<Incoming>, ReadFailure> {
        let (opcode, fin, payload) = frame.into_parts();
        let (opcode, bytes) = match (opcode, self.partial.take()) {
            (OpCode::Pong, partial) => {
                self.partial = partial;
                return Ok(Some(Incoming::Pong));
            }
            // Pings are answered and closes replied to by the frame layer.
            (OpCode::Ping | OpCode::Close, partial) => {
                self.partial = partial;
                return Ok(None);
            }
            (OpCode::Text | OpCode::Binary, Some(_)) => {
                return Err(own_close(
                    1002,
                    "a new message began inside a fragmented one",
                ))
            }
            (OpCode::Continuation, None) => {
                return Err(own_close(1002, "a continuation frame outside a message"))
            }
            (OpCode::Text | OpCode::Binary, None) if fin => (opcode, payload.to_vec()),
            (OpCode::Text | OpCode::Binary, None) => {
                self.partial = Some((opcode, payload.to_vec()));
                return Ok(None);
            }
            (OpCode::Continuation, Some((opcode, mut bytes))) => {
                if bytes.len() + payload.len() > self.limit {
                    return Err(own_close(1009, "message too large"));
                }
                bytes.extend_from_slice(&payload);
                if !fin {
                    self.partial = Some((opcode, bytes));
                    return Ok(None);
                }
                (opcode, bytes)
            }
        };
        if opcode == OpCode::Binary {
            return Ok(Some(Incoming::Binary(bytes.len())));
        }
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(Incoming::Text(text))),
            Err(_) => Err(own_close(1007, "text frame is not valid UTF-8")),
        }
    }
}

/// A failure whose close the connection sends.
fn own_close(code: u16, reason: &str) -> ReadFailure {
    ReadFailure {
        code: Some(code),
        reason: reason.to_owned(),
        close_queued: false,
    }
}

/// A failure the frame layer reported (and queued its close for).
fn layer_failure(e: WebSocketError) -> ReadFailure {
    let code = match e {
        WebSocketError::FrameTooLarge => Some(1009),
        WebSocketError::InvalidUTF8 => Some(1007),
        ref e if e.is_protocol_error() => Some(1002),
        _ => None,
    };
    ReadFailure {
        code,
        reason: match code {
            Some(1009) => "message too large".to_owned(),
            Some(_) => format!("protocol error: {e}"),
            None => format!("read error: {e}"),
        },
        close_queued: code.is_some(),
    }
}

impl Stream for Socket {
    type Item = Result<Incoming, ReadFailure>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.failed {
                return Poll::Ready(None);
            }
            let frame = match ready!(this.frames.poll_next_frame(cx)) {
                Ok(frame) => frame,
                Err(WebSocketError::ConnectionClosed) => return Poll::Ready(None),
                Err(e) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(layer_failure(e))));
                }
            };
            match this.messages.push(frame) {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => continue,
                Err(failure) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(failure)));
                }
            }
        }
    }
}

impl Sink<Frame> for Socket {
    type Error = WebSocketError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().frames.poll_ready_unpin(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Frame) -> Result<(), Self::Error> {
        self.get_mut().frames.start_send_unpin(item)
    }

    /// Flushes what the frame layer owes too (pong replies, its close):
    /// the layer sends those only when it is next made ready, and a split
    /// sink is made ready only while it holds a frame.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        ready!(this.frames.poll_ready_unpin(cx))?;
        this.frames.poll_flush_unpin(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().frames.poll_close_unpin(cx)
    }
}

/// A socket that is not closed the moment it is dropped: its write side is
/// shut (FIN) and what the peer still sends is read and discarded for up to
/// [`LINGER`] or [`LINGER_BYTES`]. Closing a TCP socket with unread input
/// makes the kernel send a reset, and a peer that gets the reset before it
/// has read our close frame loses the frame (the 1009 after an oversized
/// message would never arrive).
pub(crate) struct Lingering<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    io: Option<S>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Lingering<S> {
    /// Wraps `io`.
    pub(crate) fn new(io: S) -> Self {
        Lingering { io: Some(io) }
    }

    fn io(&mut self) -> &mut S {
        self.io.as_mut().expect("present until drop")
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Lingering<S> {
    fn drop(&mut self) {
        let (Some(mut io), Ok(runtime)) = (self.io.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            let _ = tokio::time::timeout(LINGER, async {
                if io.shutdown().await.is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                let mut discarded = 0;
                while discarded < LINGER_BYTES {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => discarded += n,
                    }
                }
            })
            .await;
        });
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Lingering<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().io()).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Lingering<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().io()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().io()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().io()).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().io()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assembler() -> Assembler {
        Assembler {
            limit: 10,
            partial: None,
        }
    }

    #[test]
    fn fragments_make_one_message_and_controls_pass_between_them() {
        let mut a = assembler();
        assert_eq!(a.push(Frame::text("ab").with_fin(false)), Ok(None));
        assert_eq!(a.push(Frame::pong(Vec::new())), Ok(Some(Incoming::Pong)));
        assert_eq!(a.push(Frame::ping(Vec::new())), Ok(None));
        assert_eq!(a.push(Frame::continuation("cd").with_fin(false)), Ok(None));
        assert_eq!(
            a.push(Frame::continuation("é")),
            Ok(Some(Incoming::Text("abcdé".into())))
        );
        assert_eq!(
            a.push(Frame::binary(vec![0u8; 3])),
            Ok(Some(Incoming::Binary(3)))
        );
    }

    #[test]
    fn a_fragmented_message_over_the_limit_is_1009_sent_by_us() {
        let mut a = assembler();
        assert_eq!(a.push(Frame::text("123456").with_fin(false)), Ok(None));
        let e = a.push(Frame::continuation("78901")).unwrap_err();
        assert_eq!((e.code, e.close_queued), (Some(1009), false));
    }

    #[test]
    fn broken_sequences_and_bad_text_are_protocol_errors() {
        let e = assembler().push(Frame::continuation("x")).unwrap_err();
        assert_eq!(e.code, Some(1002));
        let mut a = assembler();
        a.push(Frame::text("x").with_fin(false)).unwrap();
        assert_eq!(a.push(Frame::text("y")).unwrap_err().code, Some(1002));
        // "é" cut in half across fragments is only checked once whole.
        let mut a = assembler();
        a.push(Frame::text(vec![0xC3]).with_fin(false)).unwrap();
        assert_eq!(
            a.push(Frame::continuation(vec![0xA9])),
            Ok(Some(Incoming::Text("é".into())))
        );
        let e = assembler().push(Frame::text(vec![0xC3, 0x28])).unwrap_err();
        assert_eq!((e.code, e.close_queued), (Some(1007), false));
    }

    #[test]
    fn websocket_limit_is_a_little_over_the_frame_limit() {
        let o = websocket_options(1000, true);
        assert_eq!(o.max_payload_read, Some(1000 + FRAME_SLACK + 1));
        assert_eq!(o.max_read_buffer, Some(1000 + FRAME_SLACK + 1));
        let deflate = o.compression.expect("compression accepted");
        assert!(deflate.server_no_context_takeover && deflate.client_no_context_takeover);
        assert!(deflate.pool.is_some());
        assert_eq!(deflate.compression_threshold, COMPRESSION_THRESHOLD);
        assert!(websocket_options(1000, false).compression.is_none());
    }

    #[test]
    fn frame_layer_failures_say_their_close_is_queued_and_which() {
        let too_big = layer_failure(WebSocketError::FrameTooLarge);
        assert_eq!((too_big.code, too_big.close_queued), (Some(1009), true));
        let utf8 = layer_failure(WebSocketError::InvalidUTF8);
        assert_eq!(utf8.code, Some(1007));
        let rsv = layer_failure(WebSocketError::ReservedBitsNotZero);
        assert_eq!(rsv.code, Some(1002));
        let io = layer_failure(WebSocketError::IoError(
            std::io::ErrorKind::BrokenPipe.into(),
        ));
        assert_eq!((io.code, io.close_queued), (None, false));
    }
}
