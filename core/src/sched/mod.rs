//! Scheduler (placeholder until the scheduler lands).
