//! `cai` authentication at upgrade: the query string's `authorization`
//! (`Bearer <key>` or the bare key) and `orgId`, checked against a [`KeyRing`]
//! (the operator's keys file, parsed by the shell; the ring and its
//! constant-time lookup are [`crate::keys`], every route's).

use crate::keys::KeyRing;

use super::super::Refusal;

/// Close code: missing or unknown key.
pub const CLOSE_BAD_KEY: u16 = 4001;
/// Close code: missing `orgId`.
pub const CLOSE_NO_ORG: u16 = 4002;
/// Close code: an organisation the key may not act for.
pub const CLOSE_ORG_DENIED: u16 = 4003;
/// Close code: no keys file configured (policy: no anonymous mode).
pub const CLOSE_POLICY: u16 = 1008;

/// Who a connection acts as once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Index of the key in its [`KeyRing`].
    pub key: usize,
    /// The organisation it acts for.
    pub org: String,
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
    let Some(key) = crate::keys::hash_key_lookup(ring, token) else {
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
    use crate::keys::{hash_key, parse_sha256, to_hex, ApiKey};

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
