//! JSON parsing with limits.
