//! Sampling parameter validation.
