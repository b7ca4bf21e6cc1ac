//! WebSocket permessage-deflate (RFC 7692) over real sockets, with frames
//! written and read by hand so that every bit is checked: a client that
//! offers the extension gets it, with no context takeover either way, its
//! compressed and fragmented request is understood, and the reply's larger
//! messages come back compressed, each inflating on its own, to the same
//! greedy text an uncompressed connection gets; a
//! frame of 4 MiB on the wire that would inflate to 4 GiB closes 1009
//! without the server ever holding more than the frame limit; with
//! `--websocket-compression off` the offer is declined and a compressed
//! frame is a protocol error. (The browser test runs the playground over
//! Chromium's own permessage-deflate.)

use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{json, Value};
use tokenwire_tests::{
    client_frame, raw_websocket_with, read_raw_frames, start, stories260k, token_text, Client,
    ModelSource, ServerConfig, WAIT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OFFER: &str = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
const RSV1: u8 = 0b100;
const TEXT: u8 = 1;
const CONTINUATION: u8 = 0;
/// The 4-byte tail every sync-flushed deflate block ends with, which
/// RFC 7692 (7.2.1) leaves off the wire.
const TAIL: [u8; 4] = [0, 0, 0xff, 0xff];

/// `data` deflated as one permessage-deflate message (no context takeover on
/// our side: a fresh compressor each time).
fn deflate_message(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(data.len() + 64);
    c.compress_vec(data, &mut out, FlushCompress::Sync)
        .expect("deflate");
    assert!(out.ends_with(&TAIL));
    out.truncate(out.len() - TAIL.len());
    out
}

/// One server frame: FIN, RSV1, opcode, payload.
struct RawFrame {
    fin: bool,
    rsv1: bool,
    opcode: u8,
    payload: Vec<u8>,
}

async fn read_frame(s: &mut TcpStream) -> RawFrame {
    let read = async {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).await.expect("frame head");
        assert_eq!(h[1] & 0x80, 0, "server frames are not masked");
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                s.read_exact(&mut b).await.expect("length");
                u16::from_be_bytes(b) as usize
            }
            127 => {
                let mut b = [0u8; 8];
                s.read_exact(&mut b).await.expect("length");
                u64::from_be_bytes(b) as usize
            }
            n => n as usize,
        };
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.expect("payload");
        RawFrame {
            fin: h[0] & 0x80 != 0,
            rsv1: h[0] & 0x40 != 0,
            opcode: h[0] & 0x0f,
            payload,
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("a frame in time")
}

fn request() -> Value {
    json!({"type": "config", "prompt": "Once upon a time",
           "parameters": {"max_tokens": 48, "temperature": 0}})
}

/// The server's answer to [`OFFER`]: the extension, with no context
/// takeover imposed in both directions.
fn offered_and_accepted(head: &str) -> bool {
    let head = head.to_ascii_lowercase();
    let Some(line) = head
        .lines()
        .find(|l| l.starts_with("sec-websocket-extensions:"))
    else {
        return false;
    };
    line.contains("permessage-deflate")
        && line.contains("server_no_context_takeover")
        && line.contains("client_no_context_takeover")
}

/// Messages the server sends uncompressed are shorter than this.
const THRESHOLD: usize = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offering_client_gets_compressed_frames_that_inflate_to_the_same_text() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;

    // The reference: the same request on a connection without compression
    // (tungstenite's client offers none).
    let mut plain = Client::connect(&server, "/generate").await;
    plain.send(request()).await;
    let reference = plain.recv_until(&["completion", "error"]).await;
    let want = token_text(&reference);
    assert!(!want.is_empty());

    let (mut s, head) = raw_websocket_with(&server, "/generate", OFFER).await;
    assert!(offered_and_accepted(&head), "{head}");
    // The request, compressed and split across two frames: RSV1 on the
    // first only (RFC 7692, 6.1).
    let compressed = deflate_message(request().to_string().as_bytes());
    let (a, b) = compressed.split_at(compressed.len() / 2);
    s.write_all(&client_frame(false, RSV1, TEXT, a, true))
        .await
        .expect("write");
    s.write_all(&client_frame(true, 0, CONTINUATION, b, true))
        .await
        .expect("write");

    // The server's frames, each compressed one inflated on its own (no
    // context takeover: a fresh window per message).
    let (mut frames, mut compressed_frames, mut wire_bytes, mut text_bytes) = (Vec::new(), 0, 0, 0);
    loop {
        let f = read_frame(&mut s).await;
        assert!(f.fin && f.opcode == TEXT, "one text frame per message");
        let text = if f.rsv1 {
            compressed_frames += 1;
            wire_bytes += f.payload.len();
            let mut input = f.payload;
            input.extend_from_slice(&TAIL);
            let mut out = Vec::with_capacity(64 * 1024);
            Decompress::new(false)
                .decompress_vec(&input, &mut out, FlushDecompress::Sync)
                .expect("inflate");
            let text = String::from_utf8(out).expect("UTF-8");
            assert!(text.len() >= THRESHOLD, "{text}");
            text_bytes += text.len();
            text
        } else {
            assert!(f.payload.len() < THRESHOLD, "a large message uncompressed");
            String::from_utf8(f.payload).expect("UTF-8")
        };
        let v: Value = serde_json::from_str(&text).expect("JSON");
        let end = v["type"] == "completion" || v["type"] == "error";
        frames.push(v);
        if end {
            assert!(f.rsv1, "the completion (with the whole text) is compressed");
            break;
        }
    }
    assert_eq!(frames.last().expect("frames")["type"], "completion");
    assert_eq!(token_text(&frames), want, "the same greedy text");
    assert!(
        wire_bytes < text_bytes,
        "compression saves bytes: {wire_bytes} on the wire for {text_bytes}"
    );
    eprintln!(
        "permessage-deflate: {} messages, {compressed_frames} compressed: \
         {text_bytes} bytes of JSON in {wire_bytes} on the wire",
        frames.len()
    );
    server.shutdown().await;
}

/// VmHWM (peak resident memory) of this process, in bytes.
fn peak_resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_mib_frame_that_inflates_to_4_gib_closes_1009_within_the_limit() {
    let server = start(ModelSource::Tiny, |_| {}).await;
    let limit = server_frame_limit();

    // A sync-flushed deflate block of 1 MiB of zeros: a literal zero, then
    // matches one byte back. Repeated, each copy inflates to another MiB.
    let mut c = Compress::new(Compression::best(), false);
    let mut block = Vec::with_capacity(64 * 1024);
    c.compress_vec(&vec![0u8; 1 << 20], &mut block, FlushCompress::Sync)
        .expect("deflate");
    let copies = (limit - 64 * 1024) / block.len();
    let bomb = block.repeat(copies);
    assert!(bomb.len() < limit && bomb.len() > limit / 2);
    let inflated = copies as u64 * (1 << 20);
    assert!(inflated > 1 << 31, "it would inflate to {inflated} bytes");

    let before = peak_resident_bytes();
    let (mut s, head) = raw_websocket_with(&server, "/generate", OFFER).await;
    assert!(offered_and_accepted(&head), "{head}");
    s.write_all(&client_frame(true, RSV1, TEXT, &bomb, true))
        .await
        .expect("write");
    let got = read_raw_frames(&mut s, WAIT).await;
    assert_eq!(got.close.as_ref().map(|c| c.0), Some(1009), "{got:?}");
    assert!(got.texts.is_empty(), "{got:?}");
    let grew = peak_resident_bytes().saturating_sub(before);
    assert!(
        grew < 256 << 20,
        "peak memory grew by {grew} bytes for a frame that inflates to {inflated}"
    );

    // The server goes on serving, compressed or not.
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 4}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    assert_eq!(frames.last().expect("frames")["type"], "completion");
    server.shutdown().await;
}

/// The server's default `--max-frame-bytes`.
fn server_frame_limit() -> usize {
    ServerConfig::default().host.max_frame_bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_compression_off_the_offer_is_declined_and_rsv1_is_a_protocol_error() {
    let server = start(ModelSource::Tiny, |c| c.websocket_compression = false).await;
    let (mut s, head) = raw_websocket_with(&server, "/generate", OFFER).await;
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{head}"
    );
    let compressed = deflate_message(request().to_string().as_bytes());
    s.write_all(&client_frame(true, RSV1, TEXT, &compressed, true))
        .await
        .expect("write");
    let got = read_raw_frames(&mut s, Duration::from_secs(30)).await;
    assert_eq!(got.close.as_ref().map(|c| c.0), Some(1002), "{got:?}");
    server.shutdown().await;
}
