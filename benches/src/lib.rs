//! # tokenwire-benches
//!
//! Benchmarks and the load generator (their issues fill this crate).
