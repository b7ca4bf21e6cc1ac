//! Who owns what the server keeps between requests (PROTOCOLS.md, Tenancy).
//!
//! Everything kept beyond one request (the `batch` continue cache, the
//! `responses` store, live `session` ids) is filed under a [`Principal`] and
//! found only by it: another principal's lookup is answered exactly as a
//! miss, so nothing says whether an id exists elsewhere.
//!
//! A connection's principal is fixed when it opens ([`Principal::of`]): the
//! key and organisation it presented when keys are in use, else the
//! WebSocket connection itself, or one anonymous principal shared by every
//! HTTP request without a key.

use crate::api::{ConnId, Transport};
use crate::keys::{hash_key_lookup, KeyRing};

/// The owner of kept state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Principal {
    /// An API key of the keys file acting for one of its organisations.
    Key {
        /// The key's index in the [`KeyRing`].
        key: usize,
        /// The organisation it acts for.
        org: String,
    },
    /// One WebSocket connection that presented no key.
    Conn(ConnId),
    /// Every HTTP request that presented no key.
    Anonymous,
}

/// Which routes need a key (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthScope {
    /// Only `cai` (its own query-string authentication); other routes are
    /// open, and a key they present still makes their principal.
    #[default]
    Cai,
    /// Every dialect route, WebSocket and HTTP.
    All,
}

/// Why a presented credential was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No key was presented where one is needed.
    Missing,
    /// The key is not in the keys file (or no keys file is loaded).
    Invalid,
    /// The key may not act for the organisation named.
    OrgDenied,
}

impl AuthError {
    /// A message for the client (never the key).
    pub fn message(&self) -> &'static str {
        match self {
            AuthError::Missing => {
                "this server needs an API key: send `Authorization: Bearer KEY` \
                 (or `x-api-key: KEY`, or the `authorization` query parameter)"
            }
            AuthError::Invalid => "invalid API key",
            AuthError::OrgDenied => "organisation not found or not allowed for this key",
        }
    }
}

/// What a client presented to say who it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    /// The `Authorization` header's value (`Bearer KEY`, or the bare key).
    pub header: Option<&'a str>,
    /// The raw query string (without `?`): its `authorization` and `orgId`
    /// parameters count as the header and organisation do.
    pub query: &'a str,
}

impl Principal {
    /// The principal of a connection that presented `presented` over
    /// `transport`, as connection `conn`. With [`AuthScope::All`] a valid key
    /// is required. With [`AuthScope::Cai`] the routes are open: a valid key
    /// still names the principal, and anything else (no key, or one this
    /// server does not know, as SDKs send whatever key they were given) is
    /// the connection, or the anonymous HTTP caller.
    pub fn of(
        ring: Option<&KeyRing>,
        scope: AuthScope,
        conn: ConnId,
        transport: Transport,
        presented: Presented<'_>,
    ) -> Result<Principal, AuthError> {
        let keyed = Self::keyed(ring, presented);
        match (scope, keyed) {
            (_, Ok(p)) => Ok(p),
            (AuthScope::All, Err(e)) => Err(e),
            (AuthScope::Cai, Err(_)) => Ok(match transport {
                Transport::WebSocket => Principal::Conn(conn),
                Transport::Http => Principal::Anonymous,
            }),
        }
    }

    /// The key principal `presented` names.
    fn keyed(ring: Option<&KeyRing>, presented: Presented<'_>) -> Result<Principal, AuthError> {
        let mut query_key = None;
        let mut org = None;
        for (k, v) in form_urlencoded::parse(presented.query.as_bytes()) {
            match &*k {
                "authorization" if query_key.is_none() => query_key = Some(v.into_owned()),
                "orgId" if org.is_none() => org = Some(v.into_owned()),
                _ => {}
            }
        }
        let key = presented
            .header
            .map(bare_key)
            .filter(|k| !k.is_empty())
            .or_else(|| query_key.as_deref().map(bare_key).filter(|k| !k.is_empty()))
            .ok_or(AuthError::Missing)?;
        let ring = ring.ok_or(AuthError::Invalid)?;
        let index = hash_key_lookup(ring, key).ok_or(AuthError::Invalid)?;
        let entry = ring.key(index).ok_or(AuthError::Invalid)?;
        let org = match org.filter(|o| !o.is_empty()) {
            Some(o) if entry.orgs.contains(&o) => o,
            Some(_) => return Err(AuthError::OrgDenied),
            // A key names at least one organisation (KeyRing::new checks).
            None => entry.orgs.first().cloned().ok_or(AuthError::OrgDenied)?,
        };
        Ok(Principal::Key { key: index, org })
    }

    /// The key and organisation, when the principal is a key.
    pub fn key(&self) -> Option<(usize, &str)> {
        match self {
            Principal::Key { key, org } => Some((*key, org)),
            _ => None,
        }
    }
}

/// The key in an `authorization` value: after `Bearer ` (any case), or all of it.
pub(crate) fn bare_key(value: &str) -> &str {
    let v = value.trim();
    match v.get(..7) {
        Some(p) if p.eq_ignore_ascii_case("bearer ") => v[7..].trim(),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{hash_key, ApiKey};

    fn ring() -> KeyRing {
        KeyRing::new(vec![
            ApiKey {
                name: "a".into(),
                sha256: hash_key("key-a"),
                orgs: vec!["org_1".into(), "org_2".into()],
                requests_per_minute: None,
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

    fn of(
        scope: AuthScope,
        t: Transport,
        header: Option<&str>,
        query: &str,
    ) -> Result<Principal, AuthError> {
        Principal::of(
            Some(&ring()),
            scope,
            ConnId(9),
            t,
            Presented { header, query },
        )
    }

    #[test]
    fn without_a_key_the_connection_or_the_anonymous_http_caller_owns_its_state() {
        let ws = Transport::WebSocket;
        let http = Transport::Http;
        assert_eq!(
            of(AuthScope::Cai, ws, None, ""),
            Ok(Principal::Conn(ConnId(9)))
        );
        assert_eq!(of(AuthScope::Cai, http, None, ""), Ok(Principal::Anonymous));
        assert_eq!(
            of(AuthScope::Cai, http, Some("Bearer "), ""),
            Ok(Principal::Anonymous)
        );
        assert_eq!(of(AuthScope::All, ws, None, ""), Err(AuthError::Missing));
        assert_eq!(
            of(AuthScope::All, http, Some("  "), ""),
            Err(AuthError::Missing)
        );
    }

    #[test]
    fn a_key_names_its_principal_and_a_wrong_one_is_refused_where_keys_are_needed() {
        let ws = Transport::WebSocket;
        let a1 = Principal::Key {
            key: 0,
            org: "org_1".into(),
        };
        assert_eq!(
            of(AuthScope::All, ws, Some("Bearer key-a"), ""),
            Ok(a1.clone())
        );
        assert_eq!(of(AuthScope::Cai, ws, Some("key-a"), ""), Ok(a1.clone()));
        assert_eq!(
            of(AuthScope::All, ws, None, "authorization=Bearer%20key-a"),
            Ok(a1)
        );
        assert_eq!(
            of(AuthScope::All, ws, Some("bearer key-a"), "orgId=org_2"),
            Ok(Principal::Key {
                key: 0,
                org: "org_2".into()
            })
        );
        assert_eq!(
            of(AuthScope::All, ws, Some("Bearer key-b"), ""),
            Ok(Principal::Key {
                key: 1,
                org: "org_3".into()
            })
        );
        assert_eq!(
            of(AuthScope::All, ws, Some("Bearer key-a"), "orgId=org_3"),
            Err(AuthError::OrgDenied)
        );
        for wrong in ["Bearer key-", "key-aa", "Bearer key-c", "Bearer KEY-A"] {
            assert_eq!(
                of(AuthScope::All, ws, Some(wrong), ""),
                Err(AuthError::Invalid),
                "{wrong}"
            );
            assert_eq!(
                of(AuthScope::Cai, ws, Some(wrong), ""),
                Ok(Principal::Conn(ConnId(9))),
                "open routes: an unknown key is no key ({wrong})"
            );
        }
        let no_ring = |scope| {
            Principal::of(
                None,
                scope,
                ConnId(1),
                Transport::Http,
                Presented {
                    header: Some("key-a"),
                    query: "",
                },
            )
        };
        assert_eq!(no_ring(AuthScope::All), Err(AuthError::Invalid));
        assert_eq!(no_ring(AuthScope::Cai), Ok(Principal::Anonymous));
    }
}
