//! The `cai` keys file (`--keys FILE`): TOML with one `[[key]]` table per
//! API key, holding the key's SHA-256 (never the key), the organisations it
//! may act for and its rate limits per organisation.
//!
//! ```toml
//! [[key]]
//! name = "mobile-app"            # for operators; optional
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! orgs = ["org_123456"]
//! requests_per_minute = 60       # optional: no limit when left out
//! tokens_per_minute = 100000     # optional: prompt and generated tokens
//! ```
//!
//! `tokenwire hash-key` prints the SHA-256 line for a key read from stdin.

use std::path::Path;

use serde::Deserialize;
use tokenwire_core::keys::{parse_sha256, ApiKey, KeyRing};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: Option<String>,
    sha256: String,
    orgs: Vec<String>,
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
}

/// Reads and checks the keys file at `path`; the error names the file and
/// what is wrong in it (never a key: the file holds none).
pub fn load(path: &Path) -> Result<KeyRing, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the keys file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("keys file {}: {e}", path.display()))
}

/// Parses a keys file's text.
pub fn parse(text: &str) -> Result<KeyRing, String> {
    let file: KeysFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    let keys = file
        .key
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let name = k.name.unwrap_or_else(|| format!("#{}", i + 1));
            let sha256 = parse_sha256(&k.sha256).map_err(|e| format!("key `{name}`: {e}"))?;
            Ok(ApiKey {
                name,
                sha256,
                orgs: k.orgs,
                requests_per_minute: k.requests_per_minute,
                tokens_per_minute: k.tokens_per_minute,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if keys.is_empty() {
        return Err("no [[key]] tables: the file must list at least one key".into());
    }
    KeyRing::new(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwire_core::keys::{hash_key, to_hex};

    #[test]
    fn a_keys_file_becomes_a_ring() {
        let text = format!(
            "[[key]]\nname = \"app\"\nsha256 = \"{}\"\norgs = [\"org_1\"]\nrequests_per_minute = 5\n\n[[key]]\nsha256 = \"{}\"\norgs = [\"org_2\", \"org_3\"]\n",
            to_hex(&hash_key("k1")),
            to_hex(&hash_key("k2"))
        );
        let ring = parse(&text).expect("valid");
        assert_eq!(ring.len(), 2);
        let k = ring.key(0).expect("first");
        assert_eq!(k.name, "app");
        assert_eq!(k.requests_per_minute, Some(5));
        assert_eq!(ring.key(1).map(|k| k.name.as_str()), Some("#2"));
    }

    #[test]
    fn every_mistake_is_named() {
        let h = to_hex(&hash_key("k"));
        let cases = [
            ("", "at least one key"),
            ("[[key]]\norgs = [\"o\"]\n", "sha256"),
            (
                "[[key]]\nsha256 = \"abc\"\norgs = [\"o\"]\n",
                "key `#1`: a sha256 must be 64 hex digits",
            ),
            (
                &format!("[[key]]\nsha256 = \"{h}\"\norgs = []\n"),
                "at least one organisation",
            ),
            (
                &format!("[[key]]\nsha256 = \"{h}\"\norgs = [\"o\"]\nrpm = 3\n"),
                "unknown field `rpm`",
            ),
            (
                &format!("[[key]]\nsha256 = \"{h}\"\norgs = [\"o\"]\ntokens_per_minute = 0\n"),
                "at least 1",
            ),
            ("[[key]\n", "unclosed array table"),
        ];
        for (text, needle) in cases {
            let e = parse(text).expect_err(text);
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let e = load(Path::new("/nonexistent/keys.toml")).expect_err("missing");
        assert!(e.contains("/nonexistent/keys.toml"), "{e}");
    }
}
