//! Checkers that hold for every dialect: closes and what may follow them,
//! the idle, keepalive, slow-client and shutdown deadlines (each dialect's
//! notion of busy), KV blocks, the scheduler, step budgets, flow control,
//! metrics (each dialect's errors and terminal frames), isolation (no text
//! of one principal's prompt reaches another), liveness (every request
//! of every dialect ends, every message is answered) and the content
//! filter (no reply carries text a `stop` rule matches); a shutdown completes
//! as soon as nothing is left to wait for.
//!
//! They see every connection's frames; what each dialect calls busy or
//! ended they read from the shared [`View`](super::View) and its dialect
//! parts.

pub mod after_close;
pub mod closes;
pub mod filtered_text;
pub mod flow_control;
pub mod idle_timeout;
pub mod isolation;
pub mod keepalive;
pub mod kv_blocks;
pub mod liveness;
pub mod metrics;
pub mod scheduler;
pub mod shutdown;
pub mod shutdown_prompt;
pub mod slow_client;
pub mod step_budget;

use super::Checker;

/// Checkers that hold for every dialect, in the order they run.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(after_close::AfterClose::default()),
        Box::new(idle_timeout::IdleTimeout),
        Box::new(keepalive::Keepalive),
        Box::new(slow_client::SlowClient),
        Box::new(shutdown::Shutdown),
        Box::new(shutdown_prompt::ShutdownPrompt),
        Box::new(kv_blocks::KvBlocks),
        Box::new(scheduler::SchedulerInvariants),
        Box::new(step_budget::StepBudget::default()),
        Box::new(flow_control::FlowControl),
        Box::new(closes::Closes::default()),
        Box::new(metrics::Metrics::default()),
        Box::new(isolation::Isolation::default()),
        Box::new(liveness::Liveness),
        Box::new(filtered_text::FilteredText),
    ]
}
