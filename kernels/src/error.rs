//! Errors of model loading. Every variant names the file it is about, because
//! the operator's first question is always "which file is broken?".

use std::path::PathBuf;

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read at all.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid JSON, or a field is missing or has the wrong type or value.
    #[error("{}: {msg}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        msg: String,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("{}: missing tensor `{name}`", path.display())]
    MissingTensor {
        /// The weights file (or index) that should have held it.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor is present but unusable (wrong shape, unsupported dtype, bad data).
    #[error("{}: tensor `{name}`: {msg}", path.display())]
    BadTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        msg: String,
    },
    /// The safetensors container itself is malformed.
    #[error("{}: not a valid safetensors file: {msg}", path.display())]
    Safetensors {
        /// The weights file.
        path: PathBuf,
        /// The parser's complaint.
        msg: String,
    },
    /// `tokenizer.json` could not be parsed by the `tokenizers` crate.
    #[error("{}: bad tokenizer: {msg}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The parser's complaint.
        msg: String,
    },
    /// The chat template does not compile.
    #[error("{}: bad chat template: {msg}", path.display())]
    ChatTemplate {
        /// The file holding the template.
        path: PathBuf,
        /// The template engine's complaint.
        msg: String,
    },
    /// A GGUF file is malformed, or its metadata does not describe a model
    /// this engine can build.
    #[error("{}: {msg}", path.display())]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong, naming the byte offset or metadata key.
        msg: String,
    },
    /// The model is well-formed but uses something this engine does not run.
    #[error("{}: unsupported: {msg}", path.display())]
    Unsupported {
        /// The file that asks for it.
        path: PathBuf,
        /// What is unsupported.
        msg: String,
    },
    /// The engine options are invalid or the KV pool they ask for cannot be allocated.
    #[error("engine options: {0}")]
    Options(String),
    /// The compute backend could not start: no GPU adapter (or none matching
    /// the requested name), the device refused, or the model does not fit it.
    #[error("compute backend: {0}")]
    Backend(String),
}

impl LoadError {
    pub(crate) fn json(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        LoadError::Json {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub(crate) fn bad_tensor(
        path: impl Into<PathBuf>,
        name: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        LoadError::BadTensor {
            path: path.into(),
            name: name.into(),
            msg: msg.into(),
        }
    }
}

/// Reads a whole file, mapping the error to [`LoadError::Io`].
pub(crate) fn read_file(path: &std::path::Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value, LoadError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|e| LoadError::json(path, format!("invalid JSON: {e}")))
}
