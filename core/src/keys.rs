//! The operator's API keys: the ring a host accepts (each key's SHA-256,
//! never a key), the organisations each acts for and their rate limits.
//! Every route that takes keys looks them up here; `cai`'s query-string
//! check ([`crate::dialect::cai::auth`]) and the principals
//! ([`crate::principal`]) both do.
//!
//! A presented key is hashed and compared with every entry in constant time
//! (no early exit, no data-dependent branch in the comparison), so neither
//! the answer's timing nor a log line says anything about how close a guess
//! was.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// One API key of the keys file.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// A name for operators' logs (never the key).
    pub name: String,
    /// SHA-256 of the key as clients send it.
    pub sha256: [u8; 32],
    /// Organisations the key may act for.
    pub orgs: Vec<String>,
    /// Requests per minute per organisation (`None`: no limit).
    pub requests_per_minute: Option<u64>,
    /// Prompt and generated tokens per minute per organisation (`None`: no limit).
    pub tokens_per_minute: Option<u64>,
}

impl std::fmt::Debug for ApiKey {
    // The hash is left out: it is what guesses are checked against.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("orgs", &self.orgs)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .finish_non_exhaustive()
    }
}

/// An organisation's rate limits ([`KeyRing::org_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OrgLimits {
    /// Requests per minute (`None`: no limit).
    pub requests_per_minute: Option<u64>,
    /// Prompt and generated tokens per minute (`None`: no limit).
    pub tokens_per_minute: Option<u64>,
}

/// The smaller of two optional limits, where `None` is no limit.
fn min_some(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// The keys a host accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRing {
    keys: Vec<ApiKey>,
}

impl KeyRing {
    /// A ring of `keys`; refused when two share a hash, a key names no
    /// organisation, or a limit is zero (each error names the key).
    pub fn new(keys: Vec<ApiKey>) -> Result<KeyRing, String> {
        for (i, k) in keys.iter().enumerate() {
            if k.orgs.is_empty() || k.orgs.iter().any(String::is_empty) {
                return Err(format!(
                    "key `{}` must name at least one organisation, none empty",
                    k.name
                ));
            }
            if k.requests_per_minute == Some(0) || k.tokens_per_minute == Some(0) {
                return Err(format!(
                    "key `{}`: a rate limit must be at least 1 (leave it out for no limit)",
                    k.name
                ));
            }
            if let Some(other) = keys[..i].iter().find(|o| o.sha256 == k.sha256) {
                return Err(format!(
                    "keys `{}` and `{}` have the same sha256",
                    other.name, k.name
                ));
            }
        }
        Ok(KeyRing { keys })
    }

    /// The limits of organisation `org`: per limit, the smallest that any
    /// key acting for it sets (the keys file's limits are per organisation,
    /// so an organisation reached through several keys gets the strictest).
    pub fn org_limits(&self, org: &str) -> OrgLimits {
        let mut limits = OrgLimits::default();
        for k in self.keys.iter().filter(|k| k.orgs.iter().any(|o| o == org)) {
            limits.requests_per_minute =
                min_some(limits.requests_per_minute, k.requests_per_minute);
            limits.tokens_per_minute = min_some(limits.tokens_per_minute, k.tokens_per_minute);
        }
        limits
    }

    /// The key at `index`.
    pub fn key(&self, index: usize) -> Option<&ApiKey> {
        self.keys.get(index)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the ring holds no key (every upgrade then gets 4001).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The index of the key whose hash is `hash`, comparing with every entry
    /// in constant time.
    fn find(&self, hash: &[u8; 32]) -> Option<usize> {
        let mut found = None;
        for (i, k) in self.keys.iter().enumerate() {
            // Every entry is compared whatever matched before.
            if bool::from(k.sha256.ct_eq(hash)) {
                found = Some(i);
            }
        }
        found
    }
}

/// The index of the key `key` in `ring` (hashed, then compared with every
/// entry in constant time).
pub fn hash_key_lookup(ring: &KeyRing, key: &str) -> Option<usize> {
    ring.find(&hash_key(key))
}

/// SHA-256 of `key` (what a keys file holds).
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// `hex` (64 hex digits, either case) as a SHA-256 digest.
pub fn parse_sha256(hex: &str) -> Result<[u8; 32], String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(format!(
            "a sha256 must be 64 hex digits, got {} characters",
            hex.chars().count()
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| "a sha256 must be 64 hex digits (0-9, a-f)".to_string())?;
    }
    Ok(out)
}

/// Lower-case hex of a digest.
pub fn to_hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
