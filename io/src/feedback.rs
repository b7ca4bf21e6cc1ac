//! The operator's feedback log: one JSON line per feedback message, appended to
//! `--feedback-log` by a background thread (the only client text ever written to
//! disk, and only when the operator asks for it).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use tokenwire_core::FeedbackRecord;

/// Appends feedback records to a file without blocking the caller.
#[derive(Debug)]
pub(crate) struct FeedbackLog {
    lines: Option<mpsc::SyncSender<String>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// Records waiting for the writer at most.
const QUEUED_RECORDS: usize = 1024;

impl FeedbackLog {
    /// Opens (creating if needed) `path` for appending and starts the writer thread.
    pub(crate) fn open(path: &Path) -> anyhow::Result<FeedbackLog> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("cannot open --feedback-log {}: {e}", path.display()))?;
        // Bounded: a disk slower than clients' feedback drops records
        // (counted in the log) instead of growing memory.
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUED_RECORDS);
        let shown: PathBuf = path.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("tokenwire-feedback".into())
            .spawn(move || {
                for line in rx {
                    if let Err(e) = file.write_all(line.as_bytes()).and_then(|_| file.flush()) {
                        tracing::warn!(path = %shown.display(), error = %e, "feedback log write failed");
                    }
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the feedback log thread: {e}"))?;
        Ok(FeedbackLog {
            lines: Some(tx),
            writer: Some(writer),
        })
    }

    /// Queues one record for appending; drops it when the writer is
    /// [`QUEUED_RECORDS`] behind.
    pub(crate) fn append(&self, rec: &FeedbackRecord) {
        if let Some(lines) = &self.lines {
            if let Err(mpsc::TrySendError::Full(_)) = lines.try_send(format_record(rec)) {
                tracing::warn!(
                    "the feedback log is {QUEUED_RECORDS} records behind; one was dropped"
                );
            }
        }
    }
}

impl Drop for FeedbackLog {
    /// Lets the writer finish what is queued, so nothing is lost at shutdown.
    fn drop(&mut self) {
        self.lines = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The JSON line for `rec` (with its trailing newline).
pub(crate) fn format_record(rec: &FeedbackRecord) -> String {
    let mut line = serde_json::json!({
        "request_id": rec.request_id,
        "rating": rec.rating,
        "position": rec.position,
        "text": rec.text,
    })
    .to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_json_line_per_record() {
        let line = format_record(&FeedbackRecord {
            request_id: Some("gen_1".into()),
            rating: 1.0,
            position: Some(3),
            text: Some("nice\nline".into()),
        });
        assert!(line.ends_with('\n'));
        assert_eq!(
            line.matches('\n').count(),
            1,
            "newlines in text are escaped"
        );
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).expect("json");
        assert_eq!(v["request_id"], "gen_1");
        assert_eq!(v["position"], 3);
        assert_eq!(v["text"], "nice\nline");
    }
}
