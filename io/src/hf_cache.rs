//! `--model org/name`: a Hugging Face repository id found in the local
//! Hugging Face cache, offline. The cache is `HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub` (the layout
//! `huggingface_hub` writes: `models--ORG--NAME/refs/main` holds the commit
//! whose files are in `snapshots/COMMIT/`). Nothing is downloaded.

use std::path::{Path, PathBuf};

/// The environment variables the lookup reads, passed in so tests can set
/// them without touching the process's environment.
#[derive(Debug, Clone, Default)]
pub struct CacheEnv {
    /// `HF_HUB_CACHE`.
    pub hub_cache: Option<PathBuf>,
    /// `HF_HOME`.
    pub hf_home: Option<PathBuf>,
    /// `HOME`.
    pub home: Option<PathBuf>,
}

impl CacheEnv {
    /// The variables of this process.
    pub fn from_process() -> CacheEnv {
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        CacheEnv {
            hub_cache: var("HF_HUB_CACHE"),
            hf_home: var("HF_HOME"),
            home: var("HOME"),
        }
    }

    /// The hub cache directory these variables name.
    pub fn hub_dir(&self) -> Option<PathBuf> {
        if let Some(dir) = &self.hub_cache {
            return Some(dir.clone());
        }
        if let Some(home) = &self.hf_home {
            return Some(home.join("hub"));
        }
        self.home
            .as_ref()
            .map(|h| h.join(".cache").join("huggingface").join("hub"))
    }
}

/// Whether `arg` reads as a repository id (`org/name`, optionally
/// `org/name/FILE.gguf` for one file of a repository of several), rather
/// than a path.
pub fn looks_like_repo_id(arg: &str) -> bool {
    let parts: Vec<&str> = arg.split('/').collect();
    let name_ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match parts.as_slice() {
        [org, name] => name_ok(org) && name_ok(name),
        [org, name, file] => {
            name_ok(org) && name_ok(name) && name_ok(file) && file.ends_with(".gguf")
        }
        _ => false,
    }
}

/// What `--model ARG` names: `ARG` itself when it exists, else the
/// snapshot of the repository id `ARG` in the cache. The error says what
/// was looked for and where.
pub fn resolve_model(arg: &Path, env: &CacheEnv) -> Result<PathBuf, String> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(id) = arg.to_str().filter(|s| looks_like_repo_id(s)) else {
        return Ok(arg.to_path_buf());
    };
    let hub = env.hub_dir().ok_or_else(|| {
        format!(
            "--model {id}: no such file or directory, and no Hugging Face cache to look in \
             (set HF_HUB_CACHE or HF_HOME, or HOME for ~/.cache/huggingface/hub)"
        )
    })?;
    let mut parts = id.split('/');
    let (org, name, file) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next(),
    );
    let repo = hub.join(format!("models--{org}--{name}"));
    let snapshot = snapshot_dir(&repo).map_err(|why| {
        format!(
            "--model {id}: no such file or directory, and not in the Hugging Face cache: {why} \
             (looked in {}; tokenwire does not download: fetch it with \
             `huggingface-cli download {org}/{name}` first)",
            repo.display()
        )
    })?;
    if let Some(file) = file {
        let path = snapshot.join(file);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "--model {id}: {file} is not in the cached snapshot {}",
                snapshot.display()
            ))
        };
    }
    if snapshot.join("config.json").is_file() {
        return Ok(snapshot);
    }
    let ggufs = gguf_files(&snapshot);
    match ggufs.as_slice() {
        [one] => Ok(snapshot.join(one)),
        [] => Err(format!(
            "--model {id}: the cached snapshot {} has neither a config.json nor a .gguf file",
            snapshot.display()
        )),
        many => Err(format!(
            "--model {id}: the cached snapshot {} has {} GGUF files; name one as \
             --model {id}/FILE: {}",
            snapshot.display(),
            many.len(),
            many.join(", ")
        )),
    }
}

/// The snapshot `refs/main` points at, or the only snapshot there is.
fn snapshot_dir(repo: &Path) -> Result<PathBuf, String> {
    if !repo.is_dir() {
        return Err("the repository is not cached".into());
    }
    let snapshots = repo.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(repo.join("refs").join("main")) {
        let commit = commit.trim();
        let dir = snapshots.join(commit);
        if !commit.is_empty() && !commit.contains('/') && dir.is_dir() {
            return Ok(dir);
        }
        return Err(format!("refs/main names {commit:?}, which has no snapshot"));
    }
    let mut all: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .map_err(|e| format!("cannot read {}: {e}", snapshots.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    match all.len() {
        1 => Ok(all.remove(0)),
        0 => Err("no snapshot is cached".into()),
        n => Err(format!(
            "no refs/main and {n} snapshots: pass the snapshot directory itself"
        )),
    }
}

/// Names of the `.gguf` files of `dir`, sorted.
fn gguf_files(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".gguf"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temp dir.
    fn temp(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tokenwire-hf-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// `hub/models--ORG--NAME` with `files` in snapshot `commit`, and
    /// `refs/main` naming it when `main`.
    fn cached(
        hub: &Path,
        org: &str,
        name: &str,
        commit: &str,
        files: &[&str],
        main: bool,
    ) -> PathBuf {
        let repo = hub.join(format!("models--{org}--{name}"));
        let snap = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snap).expect("snapshot dir");
        for f in files {
            std::fs::write(snap.join(f), b"x").expect("file");
        }
        if main {
            std::fs::create_dir_all(repo.join("refs")).expect("refs");
            std::fs::write(repo.join("refs").join("main"), format!("{commit}\n")).expect("ref");
        }
        snap
    }

    #[test]
    fn repo_ids_and_paths_are_told_apart() {
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(looks_like_repo_id("org/name/model.Q4_1.gguf"));
        assert!(!looks_like_repo_id("model.gguf"));
        assert!(!looks_like_repo_id("./org/name"));
        assert!(!looks_like_repo_id("/abs/path"));
        assert!(!looks_like_repo_id("org/../name"));
        assert!(!looks_like_repo_id("org/name/config.json"));
        assert!(!looks_like_repo_id("a/b/c/d"));
    }

    #[test]
    fn the_cache_is_hf_hub_cache_then_hf_home_then_home() {
        let env = CacheEnv {
            hub_cache: Some("/c".into()),
            hf_home: Some("/h".into()),
            home: Some("/u".into()),
        };
        assert_eq!(env.hub_dir(), Some(PathBuf::from("/c")));
        let env = CacheEnv {
            hub_cache: None,
            ..env
        };
        assert_eq!(env.hub_dir(), Some(PathBuf::from("/h/hub")));
        let env = CacheEnv {
            hf_home: None,
            ..env
        };
        assert_eq!(
            env.hub_dir(),
            Some(PathBuf::from("/u/.cache/huggingface/hub"))
        );
        assert_eq!(CacheEnv::default().hub_dir(), None);
    }

    #[test]
    fn a_cached_repository_resolves_to_the_snapshot_refs_main_names() {
        let hub = temp("main");
        cached(&hub, "org", "old", "aaa", &["config.json"], false);
        let want = cached(&hub, "org", "m", "c0ffee", &["config.json"], true);
        cached(&hub, "org", "m", "0ld", &["config.json"], false);
        let env = CacheEnv {
            hub_cache: Some(hub.clone()),
            ..CacheEnv::default()
        };
        assert_eq!(resolve_model(Path::new("org/m"), &env), Ok(want));
        // One snapshot and no refs/main: that one.
        assert!(resolve_model(Path::new("org/old"), &env)
            .expect("resolves")
            .ends_with("snapshots/aaa"));
        let _ = std::fs::remove_dir_all(&hub);
    }

    #[test]
    fn gguf_repositories_resolve_to_their_file_or_ask_which() {
        let hub = temp("gguf");
        let one = cached(
            &hub,
            "o",
            "single",
            "1",
            &["m.Q4_1.gguf", "README.md"],
            true,
        );
        let many = cached(
            &hub,
            "o",
            "multi",
            "2",
            &["a.Q4_K_M.gguf", "b.Q8_0.gguf"],
            true,
        );
        let env = CacheEnv {
            hf_home: Some(hub.parent().expect("parent").to_path_buf()),
            hub_cache: Some(hub.clone()),
            ..CacheEnv::default()
        };
        assert_eq!(
            resolve_model(Path::new("o/single"), &env),
            Ok(one.join("m.Q4_1.gguf"))
        );
        let err = resolve_model(Path::new("o/multi"), &env).expect_err("ambiguous");
        assert!(err.contains("2 GGUF files"), "{err}");
        assert!(err.contains("a.Q4_K_M.gguf, b.Q8_0.gguf"), "{err}");
        assert_eq!(
            resolve_model(Path::new("o/multi/b.Q8_0.gguf"), &env),
            Ok(many.join("b.Q8_0.gguf"))
        );
        let err = resolve_model(Path::new("o/multi/c.gguf"), &env).expect_err("absent");
        assert!(
            err.contains("c.gguf is not in the cached snapshot"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&hub);
    }

    #[test]
    fn a_missing_repository_says_where_it_looked() {
        let hub = temp("missing");
        let env = CacheEnv {
            hub_cache: Some(hub.clone()),
            ..CacheEnv::default()
        };
        let err = resolve_model(Path::new("nobody/nothing"), &env).expect_err("not cached");
        assert!(err.contains("not in the Hugging Face cache"), "{err}");
        assert!(
            err.contains(&hub.join("models--nobody--nothing").display().to_string()),
            "{err}"
        );
        let err =
            resolve_model(Path::new("nobody/nothing"), &CacheEnv::default()).expect_err("no cache");
        assert!(err.contains("no Hugging Face cache to look in"), "{err}");
        // A path that exists is taken as it is, and one that is not an id
        // is passed on for the loader's own error.
        assert_eq!(resolve_model(&hub, &env), Ok(hub.clone()));
        assert_eq!(
            resolve_model(Path::new("no/such/dir/x"), &env),
            Ok(PathBuf::from("no/such/dir/x"))
        );
        let _ = std::fs::remove_dir_all(&hub);
    }
}
