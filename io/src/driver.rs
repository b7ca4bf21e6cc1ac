//! The driver: the one task that owns the [`Host`].
//!
//! Connection tasks, HTTP handlers and the engine thread send it [`DriverMsg`]s
//! over one bounded channel. For each it calls [`Host::handle`] and drains
//! [`Host::poll_output`] until empty, routing frames to the connections'
//! outbound queues, plans to the engine thread, events to the metrics and
//! feedback to the feedback log. It sleeps until [`Host::poll_timeout`] with one
//! reusable `Sleep`, reset only when the deadline changes (quinn's pattern).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokenwire_core::{
    ConnId, EngineFault, EngineFaultKind, Event, Host, Input, Instant, ModelInfo, Output, StepPlan,
    TextDone, TextJob,
};
use tokio::sync::{mpsc, watch};

use crate::channel::{ConnQueue, DriverHandle, DriverMsg, OutFrame, ReadGate, Snapshot};
use crate::clock::{far_future, Clock};
use crate::feedback::FeedbackLog;
use crate::jobs::{JobVerifier, VerdictReply};
use crate::metrics::Metrics;
use crate::sync::{CancelFlag, PushResult};

/// Most messages handled before the driver looks at its timers again.
const BATCH: usize = 256;
/// Added to the shutdown grace to get the hard cap on a graceful shutdown.
pub(crate) const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);

struct ConnEntry {
    queue: ConnQueue,
    gate: ReadGate,
    /// The Host was told `QueueFull` and not yet `QueueDrained`.
    host_full: bool,
    /// The connection's tracing span (id and dialect), the parent of its
    /// requests' spans.
    span: tracing::Span,
}

/// Runs the Host's text jobs (tokenizing, chat templates) on tokio's blocking
/// threads, a few at a time, so a long prompt never stalls the driver and a
/// burst of them cannot take every core from the engine.
pub(crate) struct TextWorkers {
    permits: Arc<tokio::sync::Semaphore>,
}

impl TextWorkers {
    /// At most `parallel` jobs at once.
    pub(crate) fn new(parallel: usize) -> TextWorkers {
        TextWorkers {
            permits: Arc::new(tokio::sync::Semaphore::new(parallel.max(1))),
        }
    }

    /// Runs `job` and sends its result to the driver.
    fn run(&self, job: TextJob, driver: DriverHandle) {
        let permits = self.permits.clone();
        tokio::spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            let id = job.id;
            let done = match tokio::task::spawn_blocking(move || job.run()).await {
                Ok(done) => done,
                // The tokenizer panicked: the request gets an error, not silence.
                Err(e) => {
                    // Never the error's text: a panic message may quote input.
                    tracing::error!(job = id.0, panicked = e.is_panic(), "a text job failed");
                    TextDone {
                        id,
                        result: Err("the tokenizer failed on this input".into()),
                    }
                }
            };
            let _ = driver.send(DriverMsg::Input(Input::Tokenized(done))).await;
        });
    }
}

/// The task that owns the Host.
pub(crate) struct Driver {
    host: Host,
    /// The driver's own channel, for results of work it hands out.
    handle: DriverHandle,
    text: TextWorkers,
    clock: Clock,
    rx: mpsc::Receiver<DriverMsg>,
    conns: HashMap<ConnId, ConnEntry>,
    engine: std::sync::mpsc::Sender<StepPlan>,
    metrics: Arc<Metrics>,
    feedback: Option<FeedbackLog>,
    verifier: Arc<dyn JobVerifier>,
    snapshot: watch::Sender<Snapshot>,
    model: Option<Arc<ModelInfo>>,
    pending: VecDeque<Input>,
    /// Tracing spans of the requests in flight, by sequence id: ids and
    /// lengths only, closed with a "request finished" line.
    requests: HashMap<u64, tracing::Span>,
    shutdown: CancelFlag,
    shutdown_cap: Duration,
    done: bool,
    failure: Option<String>,
}

/// Everything [`Driver::new`] takes.
pub(crate) struct DriverParts {
    pub host: Host,
    pub handle: DriverHandle,
    pub text: TextWorkers,
    pub clock: Clock,
    pub rx: mpsc::Receiver<DriverMsg>,
    pub engine: std::sync::mpsc::Sender<StepPlan>,
    pub metrics: Arc<Metrics>,
    pub feedback: Option<FeedbackLog>,
    /// Answers the Host's job checks.
    pub verifier: Arc<dyn JobVerifier>,
    pub snapshot: watch::Sender<Snapshot>,
    pub shutdown: CancelFlag,
    pub shutdown_grace: Duration,
}

impl Driver {
    /// A driver for `parts.host`.
    pub(crate) fn new(parts: DriverParts) -> Driver {
        Driver {
            host: parts.host,
            handle: parts.handle,
            text: parts.text,
            clock: parts.clock,
            rx: parts.rx,
            conns: HashMap::new(),
            engine: parts.engine,
            metrics: parts.metrics,
            feedback: parts.feedback,
            verifier: parts.verifier,
            snapshot: parts.snapshot,
            model: None,
            pending: VecDeque::new(),
            requests: HashMap::new(),
            shutdown: parts.shutdown,
            shutdown_cap: parts.shutdown_grace + SHUTDOWN_SLACK,
            done: false,
            failure: None,
        }
    }

    /// Runs until the Host reports `ShutdownComplete` after `shutdown` was
    /// cancelled (or every connection is gone by then), the hard cap passes, or the
    /// model fails to load (then returns that error).
    pub(crate) async fn run(mut self) -> anyhow::Result<()> {
        let timer = tokio::time::sleep_until(far_future());
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        let hard_cap = tokio::time::sleep_until(far_future());
        tokio::pin!(hard_cap);
        let shutdown = self.shutdown.clone();
        let mut shutting_down = false;

        loop {
            // Re-arm the timer only when the Host's deadline moved.
            let next = self.host.poll_timeout();
            if next != armed {
                armed = next;
                if let Some(t) = next {
                    timer.as_mut().reset(self.clock.to_tokio(t));
                }
            }
            if shutting_down && self.conns.is_empty() {
                self.done = true;
            }
            self.publish();
            if self.done {
                break;
            }

            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if !shutting_down => {
                    shutting_down = true;
                    tracing::info!(
                        connections = self.conns.len(),
                        grace_ms = self.shutdown_cap.saturating_sub(SHUTDOWN_SLACK).as_millis() as u64,
                        "shutting down: refusing new work, letting generations finish"
                    );
                    hard_cap.as_mut().reset(tokio::time::Instant::now() + self.shutdown_cap);
                    self.input(Input::Shutdown);
                }
                _ = &mut hard_cap, if shutting_down => {
                    tracing::warn!(
                        connections = self.conns.len(),
                        "shutdown hard cap reached; closing the remaining connections"
                    );
                    break;
                }
                _ = &mut timer, if armed.is_some() => {
                    armed = None;
                    self.input(Input::Timeout);
                }
                msg = self.rx.recv() => {
                    let Some(msg) = msg else { break };
                    self.on_msg(msg);
                    for _ in 0..BATCH {
                        match self.rx.try_recv() {
                            Ok(msg) => self.on_msg(msg),
                            Err(_) => break,
                        }
                        if self.done {
                            break;
                        }
                    }
                }
            }
        }
        self.finish()
    }

    /// Closes what is left and reports how the driver ended.
    fn finish(mut self) -> anyhow::Result<()> {
        let (code, reason) = if self.failure.is_some() {
            (1011, "the model failed to load")
        } else {
            (1001, tokenwire_core::api::close_reason::SHUTTING_DOWN)
        };
        for (_, entry) in self.conns.drain() {
            entry.queue.close_now(Some(OutFrame::Close {
                code,
                reason: reason.into(),
            }));
        }
        self.publish();
        match self.failure.take() {
            Some(msg) => Err(anyhow::anyhow!(msg)),
            None => Ok(()),
        }
    }

    fn on_msg(&mut self, msg: DriverMsg) {
        match msg {
            DriverMsg::Open {
                conn,
                dialect,
                transport,
                query,
                authorization,
                peer,
                queue,
                gate,
            } => {
                let span = tracing::info_span!("conn", id = conn.0, dialect = dialect.name());
                self.conns.insert(
                    conn,
                    ConnEntry {
                        queue,
                        gate,
                        host_full: false,
                        span,
                    },
                );
                self.input(Input::Open {
                    conn,
                    dialect,
                    transport,
                    query,
                    authorization,
                    peer: peer.to_string(),
                });
            }
            DriverMsg::Input(input) => self.on_input(input),
            DriverMsg::Drained(conn) => {
                let Some(entry) = self.conns.get_mut(&conn) else {
                    return;
                };
                // The writer saw the queue drain, but the driver may have filled it
                // again since: the queue's current state decides.
                if entry.host_full && !entry.queue.is_full() {
                    entry.host_full = false;
                    self.input(Input::QueueDrained { conn });
                }
            }
            DriverMsg::LoadFailed(message) => {
                tracing::error!(error = %message, "model load failed");
                self.failure = Some(message);
                self.done = true;
            }
        }
    }

    /// Opens a request's span when the Host admits it and closes it, with
    /// its outcome and lengths, when it ends.
    fn trace_request(&mut self, event: &Event) {
        match *event {
            Event::RequestStarted {
                conn,
                request,
                prompt_tokens,
                max_tokens,
                ..
            } => {
                let parent = self.conns.get(&conn).map(|c| c.span.clone());
                let span = tracing::info_span!(
                    parent: parent.as_ref().and_then(|p| p.id()),
                    "request",
                    id = request,
                    prompt_tokens,
                    max_tokens
                );
                span.in_scope(|| tracing::debug!("request started"));
                self.requests.insert(request, span);
            }
            Event::RequestFinished {
                request,
                outcome,
                completion_tokens,
                elapsed,
                ..
            } => {
                if let Some(span) = self.requests.remove(&request) {
                    span.in_scope(|| {
                        tracing::info!(
                            outcome = outcome.name(),
                            completion_tokens,
                            elapsed_ms = elapsed.as_millis() as u64,
                            "request finished"
                        )
                    });
                }
            }
            _ => {}
        }
    }

    fn on_input(&mut self, input: Input) {
        match &input {
            Input::Text { conn, .. }
            | Input::Binary { conn, .. }
            | Input::FrameTooLarge { conn }
            | Input::Pong { conn }
            | Input::QueueFull { conn }
            | Input::QueueDrained { conn }
                if !self.conns.contains_key(conn) =>
            {
                // The connection is gone already: nothing to tell the Host.
                return;
            }
            Input::Closed { conn } => {
                let Some(entry) = self.conns.remove(conn) else {
                    return;
                };
                entry.queue.close();
            }
            Input::ModelLoaded { info, .. } => {
                self.model = Some(Arc::new(info.clone()));
            }
            _ => {}
        }
        self.input(input);
    }

    /// Hands `input` to the Host and drains its outputs, then does the same for
    /// any inputs those outputs caused (queue full, engine gone).
    fn input(&mut self, input: Input) {
        self.pending.push_back(input);
        while let Some(input) = self.pending.pop_front() {
            let started = std::time::Instant::now();
            self.host.handle(self.clock.now(), input);
            while let Some(out) = self.host.poll_output() {
                self.on_output(out);
            }
            self.metrics.observe_handle(started.elapsed());
        }
    }

    fn on_output(&mut self, out: Output) {
        match out {
            Output::Send { conn, text } => self.push(conn, OutFrame::Text(text)),
            Output::Ping { conn } => self.push(conn, OutFrame::Ping),
            Output::Close { conn, code, reason } => {
                let Some(entry) = self.conns.get(&conn) else {
                    return;
                };
                let frame = OutFrame::Close { code, reason };
                if entry.queue.is_full() {
                    // A slow reader: do not make the close wait behind its backlog.
                    entry.queue.close_now(Some(frame));
                } else {
                    entry.queue.push_final(frame);
                }
            }
            Output::RunStep(plan) => {
                let step_id = plan.step_id;
                if self.engine.send(plan).is_err() {
                    self.pending.push_back(Input::EngineFault(EngineFault {
                        step_id,
                        kind: EngineFaultKind::Internal("the engine thread has stopped".into()),
                    }));
                }
            }
            Output::Tokenize(job) => self.text.run(job, self.handle.clone()),
            Output::VerifyJob(check) => {
                let reply = VerdictReply::new(check.id, self.handle.clone());
                self.verifier.verify(check, reply);
            }
            Output::PauseReading { conn } | Output::ResumeReading { conn } => {
                let open = matches!(out, Output::ResumeReading { .. });
                if let Some(entry) = self.conns.get(&conn) {
                    entry.gate.send_replace(open);
                }
            }
            Output::Event(Event::ConnectionNamed {
                conn,
                dialect,
                name,
            }) => {
                tracing::info!(conn = conn.0, dialect = dialect.name(), %name, "connection named");
            }
            Output::Event(event) => {
                self.trace_request(&event);
                self.metrics.observe(&event);
            }
            Output::Feedback(record) => {
                if let Some(log) = &self.feedback {
                    log.append(&record);
                }
            }
            Output::ShutdownComplete => {
                tracing::info!("shutdown complete");
                self.done = true;
            }
        }
    }

    fn push(&mut self, conn: ConnId, frame: OutFrame) {
        let Some(entry) = self.conns.get_mut(&conn) else {
            return;
        };
        match entry.queue.push(frame) {
            PushResult::Ok | PushResult::Closed => {}
            PushResult::BecameFull => {
                if !entry.host_full {
                    entry.host_full = true;
                    self.pending.push_back(Input::QueueFull { conn });
                }
            }
            PushResult::Overflow => {
                tracing::warn!(
                    conn = conn.0,
                    queued = entry.queue.len(),
                    "outbound queue overflow; closing the connection (1008)"
                );
                self.metrics.outbound_overflow();
                entry.queue.close_now(Some(OutFrame::Close {
                    code: 1008,
                    reason: "outbound queue overflow".into(),
                }));
            }
        }
    }

    /// Publishes the snapshot the HTTP handlers read, if it changed.
    fn publish(&self) {
        let stats = self.host.stats();
        let loaded = self.model.is_some();
        let next = Snapshot {
            loaded,
            load_progress: if loaded { 100.0 } else { stats.load_progress },
            model: self.model.clone(),
            stats,
        };
        self.snapshot.send_if_modified(|cur| {
            if *cur == next {
                false
            } else {
                *cur = next;
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{channel, read_gate, snapshot_channel};
    use crate::config::ServerConfig;
    use crate::sync::{OutboundQueue, Pop};
    use std::net::SocketAddr;
    use tokenwire_core::testing::{tiny_model_info, ByteCodec, ScriptEngine};
    use tokenwire_core::{Dialect, Transport};

    /// A driver over a real Host with the byte codec and a scripted engine on
    /// its own thread; returns its handle and the shutdown flag.
    fn driver(config: ServerConfig) -> (DriverHandle, CancelFlag, tokio::task::JoinHandle<()>) {
        let clock = Clock::start();
        let host = Host::with_model(
            config.host_config(clock.epoch_unix_ms()),
            tiny_model_info(),
            ByteCodec::shared(),
            1u64,
        );
        let (handle, rx) = channel();
        let (plans_tx, plans_rx) = std::sync::mpsc::channel::<StepPlan>();
        let engine_handle = handle.clone();
        std::thread::spawn(move || {
            let mut engine = ScriptEngine::new("the quick brown fox jumps over the lazy dog ");
            while let Ok(plan) = plans_rx.recv() {
                let done = engine.step(&plan);
                if engine_handle
                    .blocking_send(DriverMsg::Input(Input::StepDone(done)))
                    .is_err()
                {
                    break;
                }
            }
        });
        let (snapshot_tx, _snapshot_rx) = snapshot_channel(&host);
        let shutdown = CancelFlag::new();
        let d = Driver::new(DriverParts {
            host,
            handle: handle.clone(),
            text: TextWorkers::new(2),
            clock,
            rx,
            engine: plans_tx,
            metrics: Arc::new(Metrics::new()),
            feedback: None,
            verifier: Arc::new(crate::jobs::AcceptAll::default()),
            snapshot: snapshot_tx,
            shutdown: shutdown.clone(),
            shutdown_grace: config.host.shutdown_grace,
        });
        let task = tokio::spawn(async move {
            let _ = d.run().await;
        });
        (handle, shutdown, task)
    }

    async fn open(
        handle: &DriverHandle,
        conn: ConnId,
        capacity: usize,
        max_tokens: u32,
    ) -> ConnQueue {
        let queue: ConnQueue = Arc::new(OutboundQueue::new(capacity));
        let sent = handle
            .send(DriverMsg::Open {
                conn,
                dialect: Dialect::Generate,
                transport: Transport::WebSocket,
                query: String::new(),
                authorization: None,
                peer: SocketAddr::from(([127, 0, 0, 1], 1)),
                queue: queue.clone(),
                gate: read_gate().0,
            })
            .await;
        assert!(sent.is_ok());
        let config = format!(
            r#"{{"type":"config","prompt":"hi","parameters":{{"max_tokens":{max_tokens},"temperature":0}}}}"#
        );
        let sent = handle
            .send(DriverMsg::Input(Input::Text { conn, text: config }))
            .await;
        assert!(sent.is_ok());
        queue
    }

    const BOUND: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_pauses_the_generation_and_draining_resumes_it() {
        let (handle, shutdown, task) = driver(ServerConfig {
            max_queued_frames: 4,
            ..ServerConfig::default()
        });
        let conn = ConnId(1);
        let queue = open(&handle, conn, 4, 100).await;
        // The scripted engine is instant: the queue fills at once.
        tokio::time::timeout(BOUND, async {
            while !queue.is_full() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the queue fills");
        assert!(
            queue.len() <= queue.hard_limit(),
            "paused before the hard limit"
        );

        // Read like a writer: report each drain, until the completion.
        let mut tokens = 0;
        let mut drains = 0;
        let completion = tokio::time::timeout(BOUND, async {
            loop {
                let Some(p) = queue.pop().await else {
                    panic!("queue closed before the completion")
                };
                if p.drained {
                    drains += 1;
                    assert!(handle.send(DriverMsg::Drained(conn)).await.is_ok());
                }
                let OutFrame::Text(text) = p.item else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(&text).expect("json");
                match v["type"].as_str() {
                    Some("token") => tokens += 1,
                    Some("completion") => return v,
                    _ => {}
                }
            }
        })
        .await
        .expect("the generation completes");
        assert!(drains >= 1, "the queue was drained at least once");
        assert_eq!(tokens, 100);
        assert_eq!(completion["usage"]["completion_tokens"], 100);
        assert!(handle
            .send(DriverMsg::Input(Input::Closed { conn }))
            .await
            .is_ok());
        shutdown.cancel();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("the driver stops")
            .expect("join");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_that_stays_full_gets_closed_with_1008() {
        let mut config = ServerConfig {
            max_queued_frames: 4,
            ..ServerConfig::default()
        };
        config.host.slow_client_timeout = Duration::from_millis(50);
        let (handle, shutdown, task) = driver(config);
        let conn = ConnId(7);
        let queue = open(&handle, conn, 4, 100).await;
        tokio::time::timeout(BOUND, queue.closed())
            .await
            .expect("the slow client is closed");
        // A full queue is not drained into a slow reader: only the close is left.
        match queue.try_pop() {
            Pop::Item(p) => assert!(
                matches!(p.item, OutFrame::Close { code: 1008, .. }),
                "{:?}",
                p.item
            ),
            other => panic!("expected the close frame, got {other:?}"),
        }
        assert_eq!(queue.try_pop(), Pop::Closed);
        assert!(handle
            .send(DriverMsg::Input(Input::Closed { conn }))
            .await
            .is_ok());
        shutdown.cancel();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("the driver stops")
            .expect("join");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_with_no_connections_ends_the_driver() {
        let (_handle, shutdown, task) = driver(ServerConfig::default());
        shutdown.cancel();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("the driver stops")
            .expect("join");
    }
}
