//! # tokenwire-sim
//!
//! The deterministic simulator (DESIGN.md, "The simulator") lives here: seeded
//! swarms of clients and faults driven through `tokenwire-core`, with invariant
//! checkers after every event. Until it lands, `tokenwire_core::testing::Harness`
//! is the virtual-time driver the core's own tests use.
