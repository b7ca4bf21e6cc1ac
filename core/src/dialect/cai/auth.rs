//! `cai` authentication at upgrade: the query string's `authorization`
//! (`Bearer <key>` or the bare key) and `orgId`, checked against a [`KeyRing`]
//! (the operator's keys file, parsed by the shell).
//!
//! The ring holds only each key's SHA-256, never a key. A presented key is
//! hashed and compared with every entry in constant time (no early exit, no
//! data-dependent branch in the comparison), so neither the answer's timing
//! nor a log line says anything about how close a guess was.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::super::Refusal;

/// Close code: missing or unknown key.
pub const CLOSE_BAD_KEY: u16 = 4001;
/// Close code: missing `orgId`.
pub const CLOSE_NO_ORG: u16 = 4002;
/// Close code: an organisation the key may not act for.
pub const CLOSE_ORG_DENIED: u16 = 4003;
/// Close code: no keys file configured (policy: no anonymous mode).
pub const CLOSE_POLICY: u16 = 1008;

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

/// Who a connection acts as once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Index of the key in its [`KeyRing`].
    pub key: usize,
    /// The organisation it acts for.
    pub org: String,
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

fn refuse(code: u16, reason: &str) -> Refusal {
    Refusal {
        code,
        reason: reason.to_string(),
    }
}

/// Checks an upgrade's query string (without `?`) against `ring`: who the
/// connection acts as, or the close that refuses it (PROTOCOLS.md `cai`).
pub fn authenticate(ring: Option<&KeyRing>, query: &str) -> Result<Credentials, Refusal> {
    let Some(ring) = ring else {
        return Err(refuse(
            CLOSE_POLICY,
            "cai needs a keys file (--keys); there is no anonymous mode",
        ));
    };
    let mut authorization = None;
    let mut org = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "authorization" if authorization.is_none() => authorization = Some(v.into_owned()),
            "orgId" if org.is_none() => org = Some(v.into_owned()),
            _ => {}
        }
    }
    let token = authorization
        .as_deref()
        .map(crate::principal::bare_key)
        .unwrap_or_default();
    if token.is_empty() {
        return Err(refuse(CLOSE_BAD_KEY, "missing authorization"));
    }
    let Some(key) = ring.find(&hash_key(token)) else {
        return Err(refuse(CLOSE_BAD_KEY, "invalid authorization"));
    };
    let org = org.unwrap_or_default();
    if org.is_empty() {
        return Err(refuse(CLOSE_NO_ORG, "missing orgId"));
    }
    let allowed = ring.key(key).is_some_and(|k| k.orgs.contains(&org));
    if !allowed {
        return Err(refuse(
            CLOSE_ORG_DENIED,
            "organisation not found or not allowed for this key",
        ));
    }
    Ok(Credentials { key, org })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        KeyRing::new(vec![
            ApiKey {
                name: "a".into(),
                sha256: hash_key("key-a"),
                orgs: vec!["org_1".into(), "org 2".into()],
                requests_per_minute: Some(10),
                tokens_per_minute: None,
            },
            ApiKey {
                name: "b".into(),
                sha256: hash_key("key-b"),
                orgs: vec!["org_3".into()],
                requests_per_minute: None,
                tokens_per_minute: None,
            },
        ])
        .expect("valid ring")
    }

    fn code(query: &str) -> u16 {
        authenticate(Some(&ring()), query)
            .expect_err("refused")
            .code
    }

    #[test]
    fn the_close_codes_follow_the_contract() {
        assert_eq!(
            authenticate(None, "authorization=key-a&orgId=org_1")
                .expect_err("no ring")
                .code,
            1008
        );
        assert_eq!(code(""), 4001);
        assert_eq!(code("orgId=org_1"), 4001);
        assert_eq!(code("authorization=Bearer%20&orgId=org_1"), 4001);
        assert_eq!(code("authorization=key-x&orgId=org_1"), 4001);
        assert_eq!(code("authorization=key-a"), 4002, "key checked first");
        assert_eq!(code("authorization=key-a&orgId="), 4002);
        assert_eq!(code("authorization=key-a&orgId=org_3"), 4003);
        assert_eq!(code("authorization=key-b&orgId=org_9"), 4003);
    }

    #[test]
    fn bearer_and_bare_keys_and_escapes_are_accepted() {
        let r = ring();
        for q in [
            "authorization=Bearer%20key-a&orgId=org_1",
            "authorization=bearer+key-a&orgId=org_1",
            "authorization=key-a&orgId=org_1",
            "orgId=org_1&authorization=key-a&extra=1",
        ] {
            let c = authenticate(Some(&r), q).expect(q);
            assert_eq!(
                c,
                Credentials {
                    key: 0,
                    org: "org_1".into()
                }
            );
        }
        let c = authenticate(Some(&r), "authorization=key-a&orgId=org%202").expect("escaped org");
        assert_eq!(c.org, "org 2");
        let c = authenticate(Some(&r), "authorization=key-b&orgId=org_3").expect("second key");
        assert_eq!(c.key, 1);
    }

    #[test]
    fn rings_refuse_duplicates_empty_orgs_and_zero_limits() {
        let k = |name: &str, key: &str, orgs: &[&str], rpm| ApiKey {
            name: name.into(),
            sha256: hash_key(key),
            orgs: orgs.iter().map(|s| s.to_string()).collect(),
            requests_per_minute: rpm,
            tokens_per_minute: None,
        };
        let e = KeyRing::new(vec![k("x", "1", &["o"], None), k("y", "1", &["o"], None)])
            .expect_err("duplicate");
        assert!(e.contains("`x` and `y`"), "{e}");
        assert!(KeyRing::new(vec![k("x", "1", &[], None)]).is_err());
        assert!(KeyRing::new(vec![k("x", "1", &[""], None)]).is_err());
        assert!(KeyRing::new(vec![k("x", "1", &["o"], Some(0))]).is_err());
    }

    #[test]
    fn hex_digests_round_trip_and_bad_ones_are_named() {
        let h = hash_key("abc");
        assert_eq!(
            to_hex(&h),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_sha256(&to_hex(&h).to_uppercase()), Ok(h));
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"zz".repeat(32)).is_err());
        assert!(parse_sha256(&"é".repeat(32)).is_err());
        let debug = format!("{:?}", ring());
        assert!(
            !debug.contains("sha256"),
            "hashes stay out of Debug: {debug}"
        );
    }
}
