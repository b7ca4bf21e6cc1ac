//! The channels between the driver and the rest of the server: what
//! connection tasks, HTTP handlers, the engine thread and job verifiers send
//! the driver ([`DriverMsg`] through a [`DriverHandle`]), what the driver
//! sends a connection's writer ([`OutFrame`] through its [`ConnQueue`]), and
//! what the HTTP handlers can see of its state ([`Snapshot`]). A leaf: the
//! driver's event loop ([`crate::driver`]) and every sender import it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokenwire_core::host::HostStats;
use tokenwire_core::{ConnId, Dialect, Host, Input, ModelInfo, Transport};
use tokio::sync::{mpsc, watch};

use crate::sync::OutboundQueue;

/// Capacity of the driver's input channel.
pub(crate) const DRIVER_CHANNEL: usize = 1024;
/// A frame for one connection's writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OutFrame {
    /// A text frame (JSON).
    Text(String),
    /// A ping.
    Ping,
    /// A close frame; the last frame of the connection.
    Close {
        /// Close code.
        code: u16,
        /// Close reason (no client content).
        reason: String,
    },
}

/// A connection's outbound queue, shared by the driver and the connection's writer.
pub(crate) type ConnQueue = Arc<OutboundQueue<OutFrame>>;

/// What the driver receives.
#[derive(Debug)]
pub(crate) enum DriverMsg {
    /// A connection opened; its frames go to `queue`.
    Open {
        /// Its id.
        conn: ConnId,
        /// Its dialect.
        dialect: Dialect,
        /// WebSocket or HTTP.
        transport: Transport,
        /// Raw query string.
        query: String,
        /// The `Authorization` header, if any.
        authorization: Option<String>,
        /// Peer address.
        peer: SocketAddr,
        /// Its outbound queue.
        queue: ConnQueue,
        /// Whether its reader may read (the Host pauses it while frames pile up).
        gate: ReadGate,
    },
    /// An input for the Host (frames, closes, engine results, model loading).
    Input(Input),
    /// A connection's writer drained its queue to the low mark.
    Drained(ConnId),
    /// The model could not be loaded: the server stops with this error.
    LoadFailed(String),
}

/// The sending side of the driver's channel.
#[derive(Debug, Clone)]
pub(crate) struct DriverHandle {
    tx: mpsc::Sender<DriverMsg>,
}

/// The driver is gone (the server is stopping).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriverGone;

impl DriverHandle {
    /// Sends `msg`, waiting while the channel is full.
    pub(crate) async fn send(&self, msg: DriverMsg) -> Result<(), DriverGone> {
        self.tx.send(msg).await.map_err(|_| DriverGone)
    }

    /// Sends `msg` from a thread that is not a tokio worker (the engine thread).
    pub(crate) fn blocking_send(&self, msg: DriverMsg) -> Result<(), DriverGone> {
        self.tx.blocking_send(msg).map_err(|_| DriverGone)
    }

    /// Sends `msg` without waiting, from code that cannot await (a `Drop`, a
    /// `poll`): if the channel is full the send finishes on a spawned task.
    pub(crate) fn send_now(&self, msg: DriverMsg) {
        match self.tx.try_send(msg) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(msg)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let tx = self.tx.clone();
                    rt.spawn(async move {
                        let _ = tx.send(msg).await;
                    });
                }
            }
        }
    }
}

/// What the HTTP handlers can see of the driver's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// The model is loaded and the Host serves it.
    pub loaded: bool,
    /// Loading progress, 0..=100.
    pub load_progress: f32,
    /// The served model, once loaded.
    pub model: Option<Arc<ModelInfo>>,
    /// The Host's gauges.
    pub stats: HostStats,
}

/// The channels between the driver and the rest of the server.
pub(crate) fn channel() -> (DriverHandle, mpsc::Receiver<DriverMsg>) {
    let (tx, rx) = mpsc::channel(DRIVER_CHANNEL);
    (DriverHandle { tx }, rx)
}

/// A fresh snapshot watch, before the driver runs.
pub(crate) fn snapshot_channel(
    host: &Host,
) -> (watch::Sender<Snapshot>, watch::Receiver<Snapshot>) {
    watch::channel(Snapshot {
        loaded: false,
        load_progress: 0.0,
        model: None,
        stats: host.stats(),
    })
}

/// Lets the driver pause and resume a connection's reader.
pub(crate) type ReadGate = Arc<watch::Sender<bool>>;

/// A gate open for reading, and the receiver its reader waits on.
pub(crate) fn read_gate() -> (ReadGate, watch::Receiver<bool>) {
    let (tx, rx) = watch::channel(true);
    (Arc::new(tx), rx)
}
