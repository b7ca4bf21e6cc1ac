//! The scheduler: continuous batching over a paged KV block allocator.
//!
//! [`Scheduler`] decides which sequences run in each engine step, which KV blocks
//! they write, when a long prompt is split into chunks, and who loses their
//! blocks (to be recomputed later) when memory runs short. It is a pure state
//! machine: the Host feeds it requests and engine answers, and takes
//! [`crate::StepPlan`]s from it. The same calls give the same plans.
//!
//! The shape follows nano-vllm's `scheduler.py` and `block_manager.py`: one
//! waiting queue (FIFO), one running list in admission order, decodes first,
//! then prefill chunks; preemption by recompute, newest first. Beyond it:
//! forked sequences share full blocks by reference count and copy their
//! partial one (beams), and finished sequences can be parked with their
//! blocks for a continuation, the first to go when memory runs short.
//!
//! Prefix caching, as nano-vllm's block manager does it: every full,
//! computed block is registered under a chained SHA-256 of its tokens
//! ([`blocks::block_key`]); a block no sequence holds stays cached until an
//! allocation needs it (least recently released first); a sequence being
//! admitted takes the longest run of its prompt's full blocks that is
//! registered, computes only the rest, and its first plan carries the
//! cached tokens so the engine knows its history.
//!
//! A constrained sequence (structured output) keeps its grammar state
//! ([`constrained`]): every plan that samples it carries the mask of tokens
//! its grammar allows next, and each sampled token is fed back; a token
//! outside the mask fails the sequence ([`Scheduler::take_constraint_failures`]).
//!
//! Speculative decoding by prompt lookup ([`draft`]): a decoding sequence
//! whose last tokens occurred earlier in it gets the tokens that followed
//! them then as a draft, fed in the same step; the engine's samples confirm
//! a prefix of it, and the step yields that many tokens more. Drafts use
//! free blocks only, and only while few sequences decode.

mod blocks;
mod constrained;
pub mod draft;
mod scheduler;
mod seq;

#[cfg(test)]
mod constrained_tests;
#[cfg(test)]
mod draft_tests;
#[cfg(test)]
mod fork_tests;
#[cfg(test)]
mod park_tests;
#[cfg(test)]
mod prefix_tests;
#[cfg(test)]
mod tests;

pub use draft::DraftConfig;
pub use scheduler::{scored_rows_per_step, AdmitError, SchedConfig, Scheduler};
