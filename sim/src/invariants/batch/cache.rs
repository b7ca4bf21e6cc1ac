//! The Host's `batch` continue-generation cache as the frames tell it:
//! each finished batch's full texts (prompt and everything generated)
//! under its owner and ordered ids, least recently used first out past
//! `batch_cache_entries`, across owners (the Host's one LRU).
//!
//! Some ends do not show whether the Host kept a batch: a run that ended
//! short of `max_new_tokens` without an end-of-sequence token (the context
//! filled up, which the Host keeps, or a deadline, which it does not), or
//! a content filter's stop. Such a batch may or may not have gone in, and
//! if it did it may have pushed out another owner's entry. So the model
//! keeps every cache the Host may hold ([`World`]s): an uncertain put
//! splits each in two, identical ones merge. A lookup is certain when
//! every world agrees; past [`MAX_WORLDS`] the model stops telling hits
//! (every lookup of a key it may hold is uncertain) until the Host's cache
//! is known again (a crash empties it).

use std::collections::BTreeMap;

use tokenwire_core::ConnId;

/// Whose entries a connection reads and writes: its own (the sim's
/// clients present no key, so each connection is its own principal), or
/// everyone's (`None`) with `--batch-cache-scope host`.
pub type Owner = Option<ConnId>;

/// Caches the model follows at once before it gives up telling hits.
pub const MAX_WORLDS: usize = 16;

/// An entry's key: its owner and ordered request ids.
type Key = (Owner, Vec<String>);

/// An entry's texts (`None`: kept, with texts the frames do not tell).
type Texts = Option<Vec<String>>;

/// One cache the Host may hold: its entries by owner and ordered ids, each
/// with its texts (`None`: kept, but with texts the frames do not tell)
/// and when it was last used.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct World {
    map: BTreeMap<Key, (Texts, u64)>,
}

impl World {
    fn put(&mut self, capacity: usize, key: Key, texts: Texts, clock: u64) {
        self.map.remove(&key);
        while self.map.len() >= capacity {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.1)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.map.remove(&oldest);
        }
        self.map.insert(key, (texts, clock));
    }

    /// The entry under `key`, made the most recently used.
    fn get(&mut self, key: &Key, clock: u64) -> Option<Texts> {
        let e = self.map.get_mut(key)?;
        e.1 = clock;
        Some(e.0.clone())
    }

    /// Its entries' keys and texts, in recency order: what two worlds must
    /// share to be the same cache from here on.
    fn shape(&self) -> Vec<(&Key, &Texts)> {
        let mut v: Vec<_> = self.map.iter().map(|(k, e)| (k, &e.0, e.1)).collect();
        v.sort_by_key(|e| e.2);
        v.into_iter().map(|(k, t, _)| (k, t)).collect()
    }
}

/// What a lookup finds, in every cache the Host may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Nowhere.
    Miss,
    /// Everywhere, with these texts.
    Hit(Vec<String>),
    /// The worlds disagree, or the texts are not known.
    Uncertain,
}

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchCache {
    /// Most entries held (`batch_cache_entries`).
    pub capacity: usize,
    /// The Host has content-filter stop rules.
    pub filter_stops: bool,
    /// The caches the Host may hold (never empty).
    worlds: Vec<World>,
    clock: u64,
    /// Past [`MAX_WORLDS`]: the one world left holds every key the Host
    /// may hold, pushes none out, and none of its entries tells a hit.
    lost: bool,
}

impl BatchCache {
    /// An empty cache of `capacity` entries.
    pub fn new(capacity: usize) -> BatchCache {
        BatchCache {
            capacity,
            filter_stops: false,
            worlds: vec![World::default()],
            clock: 0,
            lost: false,
        }
    }

    /// The same cache, for a Host with (`true`) or without content-filter
    /// stop rules.
    pub fn with_filter_stops(mut self, on: bool) -> BatchCache {
        self.filter_stops = on;
        self
    }

    /// True when the Host certainly holds no entry at all.
    pub fn holds_nothing(&self) -> bool {
        self.worlds.iter().all(|w| w.map.is_empty())
    }

    /// Looks `owner`'s `key` up as the Host does when a payload is
    /// accepted: a hit becomes the most recently used.
    pub fn get(&mut self, owner: Owner, key: &[String]) -> Lookup {
        self.clock += 1;
        let k = (owner, key.to_vec());
        let found: Vec<Option<Texts>> = self
            .worlds
            .iter_mut()
            .map(|w| w.get(&k, self.clock))
            .collect();
        let first = &found[0];
        if found.iter().any(|f| f != first) {
            return Lookup::Uncertain;
        }
        match first {
            None => Lookup::Miss,
            Some(Some(texts)) if !self.lost => Lookup::Hit(texts.clone()),
            Some(_) => Lookup::Uncertain,
        }
    }

    /// The Host kept `owner`'s `texts` under `key` (`None`: texts not
    /// known here, as when the batch may or may not have continued one).
    pub fn put(&mut self, owner: Owner, key: Vec<String>, texts: Option<Vec<String>>) {
        self.put_in_every_world(owner, key, texts);
    }

    /// The Host may have kept `owner`'s batch under `key`, with texts the
    /// frames do not tell: every world splits in two.
    pub fn may_put(&mut self, owner: Owner, key: Vec<String>) {
        if self.capacity == 0 {
            return;
        }
        if self.lost {
            // The one world holds whatever the Host may hold.
            return self.put_in_every_world(owner, key, None);
        }
        let before = self.worlds.clone();
        self.put_in_every_world(owner, key, None);
        self.worlds.extend(before);
        self.merge();
    }

    fn put_in_every_world(&mut self, owner: Owner, key: Vec<String>, texts: Texts) {
        if self.capacity == 0 {
            return;
        }
        self.clock += 1;
        let texts = texts.filter(|_| !self.lost);
        // The one world past the bound holds more keys than the Host:
        // it must not push out what the Host may still hold.
        let capacity = if self.lost { usize::MAX } else { self.capacity };
        for w in &mut self.worlds {
            w.put(capacity, (owner, key.clone()), texts.clone(), self.clock);
        }
    }

    /// Drops duplicate worlds; past [`MAX_WORLDS`], keeps one that holds
    /// every key any of them holds, with no texts.
    fn merge(&mut self) {
        let mut kept: Vec<World> = Vec::new();
        for w in self.worlds.drain(..) {
            if !kept.iter().any(|k| k.shape() == w.shape()) {
                kept.push(w);
            }
        }
        if kept.len() > MAX_WORLDS {
            let mut all = World::default();
            for w in kept.drain(..) {
                for (k, e) in w.map {
                    let clock = all.map.get(&k).map_or(e.1, |(_, c)| (*c).max(e.1));
                    all.map.insert(k, (None, clock));
                }
            }
            kept.push(all);
            self.lost = true;
        }
        self.worlds = kept;
    }

    /// Forgets a closed connection's entries (the Host frees them).
    pub fn remove_owner(&mut self, conn: ConnId) {
        for w in &mut self.worlds {
            w.map.retain(|(o, _), _| *o != Some(conn));
        }
        self.merge();
        // The one world left past the bound is exact again once empty.
        if self.lost && self.holds_nothing() {
            self.lost = false;
        }
    }

    /// The Host crashed.
    pub fn clear(&mut self) {
        self.worlds = vec![World::default()];
        self.lost = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_exact_lru_across_owners() {
        let mut c = BatchCache::new(2);
        let (a, b) = (Some(ConnId(1)), Some(ConnId(2)));
        c.put(a, ids(&["x"]), Some(ids(&["ax"])));
        c.put(b, ids(&["x"]), Some(ids(&["bx"])));
        assert_eq!(c.get(a, &ids(&["x"])), Lookup::Hit(ids(&["ax"])));
        // b's entry is now the least recently used.
        c.put(a, ids(&["y"]), Some(ids(&["ay"])));
        assert_eq!(c.get(b, &ids(&["x"])), Lookup::Miss);
        assert_eq!(c.get(a, &ids(&["x"])), Lookup::Hit(ids(&["ax"])));
        c.remove_owner(ConnId(1));
        assert!(c.holds_nothing());
    }

    /// The case that made the model keep worlds: one entry's room, and
    /// another owner's batch that may or may not have gone in.
    #[test]
    fn an_uncertain_put_makes_what_it_may_push_out_uncertain() {
        let mut c = BatchCache::new(1);
        let (a, b) = (Some(ConnId(1)), Some(ConnId(2)));
        c.put(a, ids(&["x"]), Some(ids(&["ax"])));
        c.may_put(b, ids(&["y"]));
        assert_eq!(c.get(a, &ids(&["x"])), Lookup::Uncertain);
        assert_eq!(c.get(b, &ids(&["y"])), Lookup::Uncertain);
        assert_eq!(c.get(b, &ids(&["z"])), Lookup::Miss, "never put anywhere");
        // A certain put settles it: with room for one, only it is left.
        c.put(b, ids(&["z"]), Some(ids(&["bz"])));
        assert_eq!(c.get(a, &ids(&["x"])), Lookup::Miss);
        assert_eq!(c.get(b, &ids(&["z"])), Lookup::Hit(ids(&["bz"])));
    }

    #[test]
    fn past_the_bound_of_worlds_hits_are_no_longer_told() {
        let mut c = BatchCache::new(64);
        let a = Some(ConnId(1));
        c.put(a, ids(&["kept"]), Some(ids(&["t"])));
        for i in 0..5 {
            c.may_put(a, ids(&[&format!("m{i}")]));
        }
        assert!(c.lost);
        assert_eq!(c.get(a, &ids(&["kept"])), Lookup::Uncertain);
        assert_eq!(c.get(a, &ids(&["never"])), Lookup::Miss);
        c.clear();
        c.put(a, ids(&["kept"]), Some(ids(&["t"])));
        assert_eq!(c.get(a, &ids(&["kept"])), Lookup::Hit(ids(&["t"])));
    }
}
