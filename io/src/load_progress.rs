//! Shows a model load's progress: to the Host (so `/health` answers 503
//! with the percentage and WebSocket clients get `model_loading`), as a
//! bar redrawn in place when stderr is a terminal, and as log lines
//! otherwise (one per tenth of the way and one per new phase, not one per
//! report).

use std::io::Write;
use std::sync::Mutex;

use tokenwire_core::Input;
use tokenwire_kernels::LoadProgress;

use crate::channel::{DriverHandle, DriverMsg};

/// What was last shown.
#[derive(Debug, Default)]
struct Shown {
    percent: f32,
    phase: String,
}

/// Whether a report at `percent` in `phase` deserves a log line after `last`.
fn worth_a_line(last: &Shown, percent: f32, phase: &str) -> bool {
    phase != last.phase || (percent / 10.0).floor() > (last.percent / 10.0).floor()
}

/// The phase of a report, without its counts ("uploading layer 3 of 22 to
/// the GPU" is the phase "uploading layer # of # to the GPU").
fn phase_of(what: &str) -> String {
    let mut out = String::with_capacity(what.len());
    for c in what.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// A 30-character bar for `percent`.
fn bar(percent: f32) -> String {
    let filled = ((percent / 100.0) * 30.0).round().clamp(0.0, 30.0) as usize;
    format!("[{}{}]", "#".repeat(filled), " ".repeat(30 - filled))
}

/// The reporter handed to the engine's loader.
pub(crate) fn reporter(driver: DriverHandle, terminal: bool) -> LoadProgress {
    let shown = Mutex::new(Shown::default());
    LoadProgress::new(move |fraction, what| {
        let percent = fraction * 100.0;
        let _ = driver.blocking_send(DriverMsg::Input(Input::ModelLoading {
            progress: percent,
            message: what.to_string(),
            eta: None,
        }));
        let Ok(mut last) = shown.lock() else {
            return;
        };
        if terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{} {percent:5.1}% {what}\x1b[K", bar(percent));
            if fraction >= 1.0 {
                let _ = writeln!(err);
            }
            let _ = err.flush();
        } else {
            let phase = phase_of(what);
            if worth_a_line(&last, percent, &phase) || fraction >= 1.0 {
                tracing::info!(progress = format!("{percent:.0}%"), "{what}");
            }
            last.phase = phase;
        }
        last.percent = percent;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_tenth_and_per_phase_not_per_report() {
        let mut last = Shown::default();
        let mut lines = 0;
        // 22 layers of an upload between 30% and 100%.
        for i in 0..22 {
            let percent = 30.0 + 70.0 * i as f32 / 22.0;
            let phase = phase_of(&format!("uploading layer {} of 22 to the GPU", i + 1));
            if worth_a_line(&last, percent, &phase) {
                lines += 1;
            }
            last = Shown { percent, phase };
        }
        // The new phase, then one line per tenth crossed (30s to 90s).
        assert_eq!(lines, 1 + 6, "{lines}");
        assert!(!worth_a_line(
            &last,
            last.percent + 1.0,
            &last.phase.clone()
        ));
        assert!(worth_a_line(&last, last.percent, "another phase"));
    }

    #[test]
    fn the_bar_fills_with_the_percentage() {
        assert_eq!(bar(0.0), format!("[{}]", " ".repeat(30)));
        assert_eq!(bar(50.0), format!("[{}{}]", "#".repeat(15), " ".repeat(15)));
        assert_eq!(bar(100.0), format!("[{}]", "#".repeat(30)));
        assert_eq!(phase_of("layer 12 of 22"), "layer # of #");
        assert_eq!(phase_of("layer 9 of 22"), phase_of("layer 10 of 22"));
    }
}
