//! # tokenwire-sync
//!
//! Small shared primitives between tokenwire's driver task, connection tasks
//! and HTTP handlers: a connection limiter ([`ConnectionLimiter`]), a limit
//! per key such as the peer's address ([`PerKeyLimiter`]), a cancel
//! flag ([`CancelFlag`]) and the bounded outbound queue with its full/drained
//! signals ([`OutboundQueue`]). `tokenwire-io` re-exports this crate as
//! `tokenwire_io::sync`.
//!
//! They use only a mutex, atomics and wakers through the private `facade`
//! module, which maps to [loom](https://docs.rs/loom)'s model-checked types
//! under `--cfg loom` and to `std` otherwise (as tokio's `src/loom/mod.rs`
//! does). They live in their own std-only crate so that building with
//! `--cfg loom` recompiles only this crate and loom, not tokio, hyper or wgpu
//! (some of which also change behaviour under `cfg(loom)`).
//!
//! ## Running the loom models
//!
//! The models in `tests/loom.rs` explore every interleaving of a few threads
//! racing on each primitive (limit never exceeded, no lost wakeup, FIFO with
//! the full/drained signals exactly once):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p tokenwire-sync --release --test loom
//! ```
//!
//! The separate target directory keeps the cfg change from invalidating the
//! main build cache. `LOOM_MAX_PREEMPTIONS`, `LOOM_LOG` and `LOOM_CHECKPOINT_FILE`
//! work as loom documents them. The ordinary unit tests run with a plain
//! `cargo test -p tokenwire-sync`.

mod cancel;
mod facade;
mod limiter;
mod per_key;
mod queue;

pub use cancel::{CancelFlag, Cancelled};
pub use limiter::{ConnectionLimiter, ConnectionPermit};
pub use per_key::{KeyPermit, PerKeyLimiter};
pub use queue::{ClosedFuture, OutboundQueue, Pop, PopFuture, Popped, PushResult};
