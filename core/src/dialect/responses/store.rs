//! The host's store of `store: true` responses made over HTTP, for
//! `GET /v1/responses/{id}` and HTTP continuations: a bounded map that
//! forgets the least recently used response first. Memory only, never disk.
//!
//! Each response is filed under the principal that made it and found only
//! by it (PROTOCOLS.md, Tenancy): another principal asking for its id gets
//! the same answer as for an id that never existed.

use serde_json::Value;

use crate::lru::Lru;
use crate::principal::Principal;
use crate::text::ChatMessage;

/// One stored response.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The final Response object, as returned.
    pub response: Value,
    /// Its whole conversation (input, instructions excluded, and output),
    /// which a continuation starts from.
    pub messages: Vec<ChatMessage>,
}

/// At most `capacity` responses, least recently used forgotten first.
#[derive(Debug)]
pub struct ResponseStore {
    entries: Lru<(Principal, String), Stored>,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: stores nothing).
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            entries: Lru::new(capacity),
        }
    }

    /// Stores `owner`'s response `id`, forgetting the least recently used
    /// past the capacity.
    pub fn put(&mut self, owner: &Principal, id: String, stored: Stored) {
        self.entries.put((owner.clone(), id), stored);
    }

    /// `owner`'s stored response `id`, marked as just used.
    pub fn get(&mut self, owner: &Principal, id: &str) -> Option<&Stored> {
        self.entries
            .get(&(owner.clone(), id.to_string()))
            .map(|s| &*s)
    }

    /// Responses stored (the tests' view: nothing in the Host needs the
    /// count, the bound is the LRU's own).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

impl crate::dialect::state::HostWide for ResponseStore {}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u64) -> Stored {
        Stored {
            response: Value::from(n),
            messages: Vec::new(),
        }
    }

    const ME: &Principal = &Principal::Anonymous;

    #[test]
    fn the_least_recently_used_response_goes_first() {
        let mut s = ResponseStore::new(2);
        s.put(ME, "a".into(), stored(1));
        s.put(ME, "b".into(), stored(2));
        assert!(s.get(ME, "a").is_some(), "a is now the most recent");
        s.put(ME, "c".into(), stored(3));
        assert_eq!(s.len(), 2);
        assert!(s.get(ME, "b").is_none(), "b was least recent");
        assert_eq!(
            s.get(ME, "a").map(|x| x.response.clone()),
            Some(Value::from(1))
        );
        s.put(ME, "a".into(), stored(4));
        assert_eq!(s.len(), 2, "replacing keeps one entry");
        assert_eq!(
            s.get(ME, "a").map(|x| x.response.clone()),
            Some(Value::from(4))
        );
        let mut none = ResponseStore::new(0);
        none.put(ME, "x".into(), stored(1));
        assert_eq!(none.len(), 0);
    }

    #[test]
    fn a_response_is_found_only_by_the_principal_that_stored_it() {
        let alice = Principal::Key {
            key: 0,
            org: "a".into(),
        };
        let bob = Principal::Key {
            key: 1,
            org: "b".into(),
        };
        let mut s = ResponseStore::new(4);
        s.put(&alice, "resp_1".into(), stored(1));
        assert!(s.get(&bob, "resp_1").is_none());
        assert!(s.get(ME, "resp_1").is_none(), "nor an anonymous caller");
        assert!(s.get(&alice, "resp_1").is_some());
    }
}
