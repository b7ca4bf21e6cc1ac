//! The host's store of `store: true` responses made over HTTP, for
//! `GET /v1/responses/{id}` and HTTP continuations: a bounded map that
//! forgets the least recently used response first. Memory only, never disk.

use serde_json::Value;

use crate::lru::Lru;
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
    entries: Lru<String, Stored>,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: stores nothing).
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            entries: Lru::new(capacity),
        }
    }

    /// Stores a response, forgetting the least recently used past the capacity.
    pub fn put(&mut self, id: String, stored: Stored) {
        self.entries.put(id, stored);
    }

    /// A stored response, marked as just used.
    pub fn get(&mut self, id: &str) -> Option<&Stored> {
        self.entries.get(&id.to_string()).map(|s| &*s)
    }

    /// Responses stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u64) -> Stored {
        Stored {
            response: Value::from(n),
            messages: Vec::new(),
        }
    }

    #[test]
    fn the_least_recently_used_response_goes_first() {
        let mut s = ResponseStore::new(2);
        s.put("a".into(), stored(1));
        s.put("b".into(), stored(2));
        assert!(s.get("a").is_some(), "a is now the most recent");
        s.put("c".into(), stored(3));
        assert_eq!(s.len(), 2);
        assert!(s.get("b").is_none(), "b was least recent");
        assert_eq!(s.get("a").map(|x| x.response.clone()), Some(Value::from(1)));
        s.put("a".into(), stored(4));
        assert_eq!(s.len(), 2, "replacing keeps one entry");
        assert_eq!(s.get("a").map(|x| x.response.clone()), Some(Value::from(4)));
        let mut none = ResponseStore::new(0);
        none.put("x".into(), stored(1));
        assert!(none.is_empty());
    }
}
