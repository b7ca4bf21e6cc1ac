//! Small shared primitives between the driver task, the connection tasks and the
//! HTTP handlers: a connection limiter, a cancel flag and the bounded outbound
//! queue with its full/drained signals.
//!
//! They use only a mutex, atomics and wakers through the private `facade` module, which
//! maps to `loom` under `--cfg loom` and to `std` otherwise (as tokio's
//! `src/loom/mod.rs` does), so each primitive can be model-checked with loom.

mod cancel;
mod facade;
mod limiter;
mod queue;

pub use cancel::{CancelFlag, Cancelled};
pub use limiter::{ConnectionLimiter, ConnectionPermit};
pub use queue::{OutboundQueue, Pop, Popped, PushResult};
