//! Starting and stopping a server: binds the listener, starts the engine thread
//! and the driver, accepts HTTP/1.1 connections, and shuts down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokenwire_core::host::HostStats;
use tokenwire_core::Host;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::channel::Snapshot;
use crate::clock::Clock;
use crate::config::{ModelSource, ServerConfig};
use crate::conn::CLOSE_LINGER;
use crate::driver::{Driver, DriverParts, TextWorkers};
use crate::engine_thread::{self, EngineSpec};
use crate::feedback::FeedbackLog;
use crate::http::state::{PermitSlot, Permits};
use crate::http::{self, state::AppState};
use crate::metrics::Metrics;
use crate::sync::{CancelFlag, ConnectionLimiter, PerKeyLimiter};
use crate::ws::websocket_options;

/// How long a connection over the limit may take to read its 503 before it
/// is dropped.
const REFUSE_LINGER: Duration = Duration::from_secs(1);

/// A server started by [`start`] or [`start_loading`]. Stop it with
/// [`RunningServer::shutdown`] (or [`RunningServer::finish`] for its error);
/// dropping it also begins a graceful shutdown, without waiting for it.
#[derive(Debug)]
pub struct RunningServer {
    /// The address the server listens on (the real port when `listen` had port 0).
    pub local_addr: SocketAddr,
    shutdown: CancelFlag,
    snapshot: watch::Receiver<Snapshot>,
    task: JoinHandle<anyhow::Result<()>>,
    outcome: Option<anyhow::Result<()>>,
}

impl RunningServer {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Resolves once the Host's gauges satisfy `pred` (at once if they do
    /// now): true, or false if the server stopped first. Tests wait on this
    /// for what the Host has done instead of sleeping.
    pub async fn wait_for_stats(&self, mut pred: impl FnMut(&HostStats) -> bool) -> bool {
        let mut rx = self.snapshot.clone();
        let held = rx.wait_for(|s| pred(&s.stats)).await.is_ok();
        held
    }

    /// Resolves once the model is loaded and served (`/health` answers 200), or
    /// fails if the server stopped first (for instance because the model could
    /// not be loaded; [`RunningServer::finish`] then returns why).
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        let mut rx = self.snapshot.clone();
        let loaded = rx.wait_for(|s| s.loaded).await.is_ok();
        if loaded {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "the server stopped before the model was loaded"
            ))
        }
    }

    /// Begins a graceful shutdown without waiting for it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Resolves when the server has stopped, by itself (the model failed to
    /// load) or after a shutdown. Cancel-safe: may be used in `select!`.
    pub async fn stopped(&mut self) {
        if self.outcome.is_none() {
            let joined = (&mut self.task).await;
            self.outcome = Some(match joined {
                Ok(result) => result,
                Err(e) => Err(anyhow::anyhow!("the server task failed: {e}")),
            });
        }
    }

    /// Shuts down gracefully (stop accepting, let generations finish for the
    /// shutdown grace, close every connection) and waits until it is done. An
    /// error the server had stopped with is logged; [`RunningServer::finish`]
    /// returns it instead.
    pub async fn shutdown(self) {
        if let Err(e) = self.finish().await {
            tracing::warn!(error = %format!("{e:#}"), "the server had stopped with an error");
        }
    }

    /// [`RunningServer::shutdown`], returning the server's error if it had
    /// stopped with one (such as a model that failed to load).
    pub async fn finish(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.stopped().await;
        self.outcome.take().unwrap_or(Ok(()))
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The key of the Host's ChaCha20: from `--seed` when it was given, else
/// 32 bytes from the OS, so that ids cannot be guessed from other ids.
fn host_seed(config: &ServerConfig) -> anyhow::Result<tokenwire_core::rng::Seed> {
    if config.reproducible_ids {
        return Ok(config.seed.into());
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key)
        .map_err(|e| anyhow::anyhow!("cannot read random bytes from the OS: {e}"))?;
    Ok(key.into())
}

/// Runs a server until `shutdown` resolves (then shuts down gracefully) or it
/// stops by itself with an error (such as a model that fails to load).
pub async fn serve(config: ServerConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut server = start_loading(config).await?;
    tokio::select! {
        _ = server.stopped() => {}
        _ = shutdown => {}
    }
    server.finish().await
}

/// Starts a server and waits until its model is loaded, so it is ready to
/// generate when this returns (it already accepts connections while loading).
/// Errors: the listener cannot be bound, the feedback log cannot be opened, a
/// thread cannot be started, or the model fails to load.
pub async fn start(config: ServerConfig) -> anyhow::Result<RunningServer> {
    let server = start_loading(config).await?;
    if server.wait_ready().await.is_ok() {
        return Ok(server);
    }
    Err(match server.finish().await {
        Err(e) => e,
        Ok(()) => anyhow::anyhow!("the server stopped before the model was loaded"),
    })
}

/// Starts a server: binds `config.listen`, starts loading the model and
/// returns as soon as it accepts connections. Until the model is loaded,
/// `/health` answers 503 and WebSocket clients get `model_loading` status;
/// [`RunningServer::wait_ready`] waits for the end of loading. Errors: the
/// listener cannot be bound, the feedback log cannot be opened, a thread cannot
/// be started.
pub async fn start_loading(config: ServerConfig) -> anyhow::Result<RunningServer> {
    let verifier = Arc::new(crate::jobs::AcceptAll {
        token_budget: config.job_token_budget,
    });
    start_loading_with(config, verifier).await
}

/// [`start_loading`] with a job verifier of the caller's (a deployment's
/// payment or quota check) instead of the default [`crate::jobs::AcceptAll`].
pub async fn start_loading_with(
    config: ServerConfig,
    verifier: Arc<dyn crate::jobs::JobVerifier>,
) -> anyhow::Result<RunningServer> {
    match &config.model {
        ModelSource::Tiny => tracing::info!(
            seed = config.seed,
            "--random-model: serving the built-in tiny model (random weights)"
        ),
        ModelSource::Builtin => tracing::info!(
            "no --model given: serving the built-in stories260K model (a 260K-parameter \
             TinyStories llama); pass --model PATH to serve another"
        ),
        ModelSource::Dir(dir) => tracing::info!(model = %dir.display(), "loading the model"),
    }

    let keys = match &config.keys {
        Some(path) => {
            let ring = crate::keys::load(path).map_err(anyhow::Error::msg)?;
            tracing::info!(keys = ring.len(), auth = ?config.tenancy.auth, "keys file loaded");
            Some(ring)
        }
        None => {
            tracing::info!("cai: no --keys given, so every connection on / is refused (1008)");
            None
        }
    };
    config
        .tenancy
        .check(keys.is_some())
        .map_err(anyhow::Error::msg)?;
    let feedback = match &config.feedback_log {
        Some(path) => Some(FeedbackLog::open(path)?),
        None => None,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| anyhow::anyhow!("cannot read the listening address: {e}"))?;

    let clock = Clock::start();
    let mut host_config = config.host_config(clock.epoch_unix_ms());
    host_config.keys = keys.clone();
    if let Some(path) = &config.content_filter {
        let filter = crate::content_filter::load(path).map_err(anyhow::Error::msg)?;
        // Rule names only: patterns may spell what the operator keeps out.
        let names: Vec<&str> = filter.rules().iter().map(|r| r.name.as_str()).collect();
        tracing::info!(rules = ?names, "content filter loaded");
        host_config.content_filter = Some(Arc::new(filter));
    }
    let host = Host::new(host_config, host_seed(&config)?);
    let (snapshot_tx, snapshot_rx) = crate::channel::snapshot_channel(&host);
    let ready_rx = snapshot_rx.clone();
    let (driver_handle, driver_rx) = crate::channel::channel();
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancelFlag::new();

    let engine = engine_thread::spawn(
        EngineSpec {
            model: config.model.clone(),
            backend: config.backend,
            kv_blocks: config.kv_blocks,
            max_context: config.max_context,
            wgpu_adapter: config.wgpu_adapter.clone(),
            wgpu_matrix_units: config.wgpu_matrix_units,
            cpu_activations: config.cpu_activations,
            seed: config.seed,
            reasoning_tags: config.host.reasoning_tags,
            embed_pooling: config.host.embed_pooling,
        },
        driver_handle.clone(),
    )?;
    let driver = Driver::new(DriverParts {
        host,
        handle: driver_handle.clone(),
        text: TextWorkers::new(text_workers()),
        clock,
        rx: driver_rx,
        engine,
        metrics: metrics.clone(),
        feedback,
        verifier,
        snapshot: snapshot_tx,
        shutdown: shutdown.clone(),
        shutdown_grace: config.host.shutdown_grace,
    });

    let (tasks_tx, mut tasks_rx) = mpsc::channel::<()>(1);
    let state = Arc::new(AppState {
        driver: driver_handle,
        snapshot: snapshot_rx,
        metrics,
        limiter: ConnectionLimiter::new(config.max_connections),
        per_ip: PerKeyLimiter::new(
            usize::try_from(config.tenancy.max_connections_per_ip).unwrap_or(usize::MAX),
        ),
        keys: keys.map(Arc::new),
        auth: config.tenancy.scope(),
        metrics_auth: config.tenancy.metrics_auth,
        allowed_origins: config.tenancy.allowed_origins.clone(),
        next_conn: AtomicU64::new(1),
        started_unix_s: clock.epoch_unix_ms() / 1000,
        max_frame_bytes: config.host.max_frame_bytes,
        body_timeout: config.body_timeout,
        body_min_rate: config.body_min_rate,
        header_timeout: config.header_timeout,
        send_buffer_bytes: config.send_buffer_bytes,
        max_queued_frames: config.max_queued_frames,
        ws_options: websocket_options(config.host.max_frame_bytes, config.websocket_compression),
        _tasks: tasks_tx,
    });
    tracing::info!(addr = %local_addr, "listening");

    let accept_shutdown = shutdown.clone();
    let driver_shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        let accept = tokio::spawn(accept_loop(listener, state, accept_shutdown));
        let result = driver.run().await;
        // However the driver ended, stop accepting and let the connections end.
        driver_shutdown.cancel();
        let _ = accept.await;
        // Every connection task holds the state; wait (briefly) until all are gone.
        let _ = tokio::time::timeout(CLOSE_LINGER + Duration::from_secs(1), tasks_rx.recv()).await;
        tracing::info!("server stopped");
        result
    });

    Ok(RunningServer {
        local_addr,
        shutdown,
        snapshot: ready_rx,
        task,
        outcome: None,
    })
}

/// How many text jobs (tokenizing prompts) run at once: one per core, so a
/// burst of long prompts cannot starve the engine of every core.
fn text_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Accepts connections until `shutdown` is cancelled. Every connection,
/// HTTP or WebSocket, holds one slot of the connection limit for its whole
/// life; one over the limit gets a 503 and is closed at once.
async fn accept_loop(listener: TcpListener, state: Arc<AppState>, shutdown: CancelFlag) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some(conn) = state.limiter.try_acquire() else {
                    tracing::debug!(%peer, max = state.limiter.max(), "connection limit reached");
                    state.metrics.connection_refused();
                    tokio::spawn(refuse(stream, Refusal::Server));
                    continue;
                };
                let Some(ip) = state.per_ip.try_acquire(peer.ip()) else {
                    tracing::debug!(%peer, max = state.per_ip.max(), "per-address connection limit reached");
                    state.metrics.connection_refused();
                    tokio::spawn(refuse(stream, Refusal::Address));
                    continue;
                };
                tokio::spawn(serve_connection(
                    stream,
                    peer,
                    Permits {
                        _conn: conn,
                        _ip: ip,
                    },
                    state.clone(),
                    shutdown.clone(),
                ));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off briefly.
                tracing::warn!(error = %e, "accept failed");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
    }
    tracing::debug!("stopped accepting");
}

/// Which connection limit a refused connection met.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The server's (`--max-connections`).
    Server,
    /// Its address's (`--max-connections-per-ip`).
    Address,
}

/// Answers a connection over a limit with a 503 (and when to retry), then
/// drops it; the whole exchange is bounded by [`REFUSE_LINGER`].
async fn refuse(mut stream: TcpStream, why: Refusal) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = match why {
        Refusal::Server => {
            r#"{"type":"error","error":"too_many_connections","message":"the server's connection limit is reached; retry later","recoverable":true}"#
        }
        Refusal::Address => {
            r#"{"type":"error","error":"too_many_connections","message":"this address has as many connections open as one address may; close one first","recoverable":true}"#
        }
    };
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSE_LINGER, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes, so closing does not
        // reset the connection before the client has read the response.
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Serves one HTTP/1.1 connection (with upgrades), gracefully ending it on
/// shutdown. `permits` are its slots in the connection limits: an upgrade
/// takes them over for the WebSocket's life, otherwise they are freed with
/// the connection.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    permit: Permits,
    state: Arc<AppState>,
    shutdown: CancelFlag,
) {
    let _ = stream.set_nodelay(true);
    if state.send_buffer_bytes > 0 {
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(state.send_buffer_bytes);
    }
    let slot = PermitSlot::new(permit);
    let svc_state = state.clone();
    let svc_slot = slot.clone();
    let service =
        service_fn(move |req| http::handle(svc_state.clone(), peer, svc_slot.clone(), req));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(state.header_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "http connection ended with an error");
    }
    drop(slot);
    drop(state);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_seed_the_id_generator_is_keyed_from_the_os_and_with_one_it_repeats() {
        let os = ServerConfig {
            reproducible_ids: false,
            ..ServerConfig::default()
        };
        let a = host_seed(&os).expect("os random");
        let b = host_seed(&os).expect("os random");
        assert_ne!(a, b, "two servers never share a key");
        let fixed = ServerConfig {
            seed: 7,
            reproducible_ids: true,
            ..ServerConfig::default()
        };
        assert_eq!(
            host_seed(&fixed).expect("seeded"),
            tokenwire_core::rng::Seed::from(7u64)
        );
    }
}
