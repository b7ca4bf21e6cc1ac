//! How far a model load got, for the server's `/health`, its terminal
//! progress bar and its log: a fraction of the load's phases (reading the
//! files, building the tokenizer, setting up the backend, uploading each
//! layer to a GPU) and what it is doing now.

use std::sync::Arc;

/// The function behind a [`LoadProgress`].
type ReportFn = dyn Fn(f32, &str) + Send + Sync;

/// A callback taking `(fraction 0..=1, what is being done)`, called from
/// the loading thread, never with a fraction below one it was given before.
#[derive(Clone)]
pub struct LoadProgress(Arc<ReportFn>);

impl LoadProgress {
    /// Reports through `f`.
    pub fn new(f: impl Fn(f32, &str) + Send + Sync + 'static) -> LoadProgress {
        LoadProgress(Arc::new(f))
    }

    /// Reports `fraction` (clamped to 0..=1) and `what`.
    pub fn report(&self, fraction: f32, what: &str) {
        (self.0)(fraction.clamp(0.0, 1.0), what);
    }

    /// A part of the load: reports of `0..=1` within it land in `from..=to`
    /// of the whole.
    pub fn span(&self, from: f32, to: f32) -> LoadProgress {
        let outer = self.clone();
        LoadProgress::new(move |f, what| outer.report(from + (to - from) * f, what))
    }
}

/// Reports to `progress`, if there is one.
pub(crate) fn report(progress: &Option<LoadProgress>, fraction: f32, what: &str) {
    if let Some(p) = progress {
        p.report(fraction, what);
    }
}

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadProgress(..)")
    }
}

/// Two callbacks are equal when they are the same callback.
impl PartialEq for LoadProgress {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LoadProgress {}
