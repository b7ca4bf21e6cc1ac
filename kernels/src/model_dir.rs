//! Where a Hugging Face model's files come from: a directory on disk, or
//! files built into the binary (the default model, [`crate::builtin`]).
//! Every loader of that layout reads through [`ModelDir`], so a built-in
//! model goes through exactly the code a directory does.

use crate::error::LoadError;
use crate::tensor::{map_file, SharedMap};
use std::path::{Path, PathBuf};

/// Files by name, each `(name, bytes)`.
pub type BuiltinFiles = &'static [(&'static str, &'static [u8])];

/// A model's files: a directory, or a set built into the binary.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The directory, or `<built-in>/NAME` (used in messages only).
    root: PathBuf,
    builtin: Option<BuiltinFiles>,
}

impl ModelDir {
    /// The files of the directory `root`.
    pub fn new(root: &Path) -> ModelDir {
        ModelDir {
            root: root.to_path_buf(),
            builtin: None,
        }
    }

    /// Files built into the binary, named `name` in messages.
    pub fn builtin(name: &str, files: BuiltinFiles) -> ModelDir {
        ModelDir {
            root: Path::new("<built-in>").join(name),
            builtin: Some(files),
        }
    }

    /// The directory (for a built-in set, `<built-in>/NAME`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the files are built into the binary.
    pub fn is_builtin(&self) -> bool {
        self.builtin.is_some()
    }

    /// The path of file `name`, as messages name it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn builtin_file(&self, name: &str) -> Option<&'static [u8]> {
        self.builtin?
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, bytes)| *bytes)
    }

    /// Whether file `name` is there.
    pub fn exists(&self, name: &str) -> bool {
        match self.builtin {
            Some(_) => self.builtin_file(name).is_some(),
            None => self.path(name).exists(),
        }
    }

    /// The bytes of file `name`.
    pub(crate) fn read(&self, name: &str) -> Result<Vec<u8>, LoadError> {
        match self.builtin {
            Some(_) => self
                .builtin_file(name)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| self.not_built_in(name)),
            None => crate::error::read_file(&self.path(name)),
        }
    }

    /// File `name` parsed as JSON.
    pub(crate) fn read_json(&self, name: &str) -> Result<serde_json::Value, LoadError> {
        let bytes = self.read(name)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| LoadError::json(self.path(name), format!("invalid JSON: {e}")))
    }

    /// File `name` as shared read-only bytes: mapped from disk, or the
    /// built-in bytes themselves (no copy either way).
    pub(crate) fn map(&self, name: &str) -> Result<SharedMap, LoadError> {
        match self.builtin {
            Some(_) => self
                .builtin_file(name)
                .map(SharedMap::from_static)
                .ok_or_else(|| self.not_built_in(name)),
            None => map_file(&self.path(name)).map_err(|source| LoadError::Io {
                path: self.path(name),
                source,
            }),
        }
    }

    fn not_built_in(&self, name: &str) -> LoadError {
        LoadError::Io {
            path: self.path(name),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not built in"),
        }
    }
}
