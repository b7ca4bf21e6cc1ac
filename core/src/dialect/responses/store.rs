//! The host's store of `store: true` responses made over HTTP, for
//! `GET /v1/responses/{id}` and HTTP continuations: a bounded map that
//! forgets the least recently used response first. Memory only, never disk.

use std::collections::BTreeMap;

use serde_json::Value;

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
    entries: BTreeMap<String, (u64, Stored)>,
    by_age: BTreeMap<u64, String>,
    clock: u64,
    capacity: usize,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0 keeps none).
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            entries: BTreeMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
            capacity,
        }
    }

    /// Keeps `stored` under `id`, forgetting the least recent past capacity.
    pub fn put(&mut self, id: String, stored: Stored) {
        if self.capacity == 0 {
            return;
        }
        if let Some((age, _)) = self.entries.remove(&id) {
            self.by_age.remove(&age);
        }
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        self.clock += 1;
        self.by_age.insert(self.clock, id.clone());
        self.entries.insert(id, (self.clock, stored));
    }

    /// The response `id`, marked recently used.
    pub fn get(&mut self, id: &str) -> Option<&Stored> {
        self.clock += 1;
        let clock = self.clock;
        let (age, _) = self.entries.get(id)?;
        let old = *age;
        self.by_age.remove(&old);
        self.by_age.insert(clock, id.to_string());
        let entry = self.entries.get_mut(id)?;
        entry.0 = clock;
        Some(&entry.1)
    }

    /// Responses held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is held.
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
