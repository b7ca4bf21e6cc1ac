//! The paged KV cache's block allocator: which block ids are free, how many
//! holders each used block has, and which blocks hold a known prefix's K/V
//! (prefix caching, as nano-vllm's block manager does it).
//!
//! Block ids are handed out lowest first. That keeps the pool's low ids busy and
//! its high ids idle, so shrinking the pool (memory pressure) usually finds the
//! blocks above the new capacity already free.
//!
//! A full, computed block may be *registered* under its content key (a
//! chained SHA-256 of the tokens from position 0 to its end: see
//! [`block_key`]). A registered block whose last holder lets go is not freed
//! but *cached*: still counted as available, it keeps its K/V until the pool
//! needs it, and a later sequence whose prompt starts with the same tokens
//! takes it back ([`BlockAllocator::acquire`]) instead of computing it again.
//! Allocation takes a never-cached free block first and only then evicts the
//! least recently released cached one, whose key is forgotten with it.
//!
//! Invariants ([`BlockAllocator::check`]): `used` is the number of held
//! blocks; every id below the capacity is exactly one of held, free or
//! cached; free blocks are unregistered, cached blocks registered; keys and
//! blocks are one to one.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::engine::{BlockId, TokenId};

/// A full block's content key: SHA-256 over the key of the block before it
/// (none for the first) and the block's tokens. Equal keys mean equal
/// tokens from position 0 to the block's end (a cryptographic hash, so no
/// client can make two different prefixes share K/V by collision).
pub type BlockKey = [u8; 32];

/// The key of a full block holding `tokens`, after the block keyed `parent`.
pub fn block_key(parent: Option<&BlockKey>, tokens: &[TokenId]) -> BlockKey {
    let mut h = Sha256::new();
    // The first block's input is not a parent key: never confused with one.
    match parent {
        Some(p) => {
            h.update([1u8]);
            h.update(p);
        }
        None => h.update([0u8]),
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// Free list, reference counts and content registry of the KV blocks.
///
/// `capacity` is the number of usable block ids (`0..capacity`). After a shrink,
/// blocks at or above the capacity that are still held stay valid for their
/// holders, count as used, and are retired (never handed out again) when
/// released; after a grow, ids that are not held become free again.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    capacity: u32,
    /// Holders per block id; its length is the highest capacity ever set.
    refcount: Vec<u32>,
    /// Unheld, unregistered ids below `capacity`, allocated lowest first.
    free: BTreeSet<BlockId>,
    /// Blocks with at least one holder (including any at or above `capacity`).
    used: u32,
    /// Registered blocks by content key, and back.
    by_key: BTreeMap<BlockKey, BlockId>,
    key_of: BTreeMap<BlockId, BlockKey>,
    /// Unheld registered blocks below `capacity`, by release time (oldest
    /// first: evicted first), and each one's release time.
    cached: BTreeMap<u64, BlockId>,
    cached_at: BTreeMap<BlockId, u64>,
    clock: u64,
}

impl BlockAllocator {
    /// A pool of `capacity` blocks, all free.
    pub fn new(capacity: u32) -> Self {
        BlockAllocator {
            capacity,
            refcount: vec![0; capacity as usize],
            free: (0..capacity).collect(),
            used: 0,
            by_key: BTreeMap::new(),
            key_of: BTreeMap::new(),
            cached: BTreeMap::new(),
            cached_at: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Number of usable block ids.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Blocks with at least one holder.
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Unheld blocks kept for their content (counted in [`Self::available`]).
    pub fn cached(&self) -> u32 {
        self.cached.len() as u32
    }

    /// Blocks that may be allocated now (cached ones included: allocation
    /// evicts them). Held blocks above the capacity count against it, so this
    /// can be less than the free and cached blocks together.
    pub fn available(&self) -> u32 {
        self.capacity.saturating_sub(self.used)
    }

    /// Holders of block `b` (0 when free, cached or out of range).
    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refcount.get(b as usize).copied().unwrap_or(0)
    }

    /// Takes the lowest free block, else evicts the least recently released
    /// cached one (its key is forgotten), with one holder; `None` when none
    /// is available.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.available() == 0 {
            return None;
        }
        let b = match self.free.pop_first() {
            Some(b) => b,
            None => {
                let (_, b) = self.cached.pop_first()?;
                self.cached_at.remove(&b);
                self.unregister(b);
                b
            }
        };
        self.refcount[b as usize] = 1;
        self.used += 1;
        Some(b)
    }

    /// Adds a holder to a held block (sharing). Returns false, changing
    /// nothing, when the block is not held.
    pub fn retain(&mut self, b: BlockId) -> bool {
        match self.refcount.get_mut(b as usize) {
            Some(rc) if *rc > 0 => {
                *rc += 1;
                true
            }
            _ => false,
        }
    }

    /// Drops one holder of `b`. With its last holder the block becomes
    /// cached when registered, free otherwise (retired either way when at
    /// or above the capacity); returns true when that happened. Releasing an
    /// unheld block changes nothing.
    pub fn release(&mut self, b: BlockId) -> bool {
        let Some(rc) = self.refcount.get_mut(b as usize) else {
            debug_assert!(false, "release of unknown block {b}");
            return false;
        };
        if *rc == 0 {
            debug_assert!(false, "release of free block {b}");
            return false;
        }
        *rc -= 1;
        if *rc > 0 {
            return false;
        }
        self.used -= 1;
        if b >= self.capacity {
            self.unregister(b);
        } else if self.key_of.contains_key(&b) {
            self.clock += 1;
            self.cached.insert(self.clock, b);
            self.cached_at.insert(b, self.clock);
        } else {
            self.free.insert(b);
        }
        true
    }

    /// Registers held block `b` (full, its K/V computed) under `key`, so that
    /// later prompts with the same prefix may take it. False, changing
    /// nothing, when `b` is not held, is registered already, or another block
    /// holds `key` (the same content computed twice: the first one stays).
    pub fn register(&mut self, b: BlockId, key: BlockKey) -> bool {
        if self.refcount(b) == 0 || self.key_of.contains_key(&b) || self.by_key.contains_key(&key) {
            return false;
        }
        self.by_key.insert(key, b);
        self.key_of.insert(b, key);
        true
    }

    /// The block registered under `key`, held or cached.
    pub fn lookup(&self, key: &BlockKey) -> Option<BlockId> {
        self.by_key.get(key).copied()
    }

    /// Adds a holder to registered block `b`: a held one is shared, a cached
    /// one taken back (it is no longer evictable). False, changing nothing,
    /// when `b` is not registered.
    pub fn acquire(&mut self, b: BlockId) -> bool {
        if !self.key_of.contains_key(&b) {
            return false;
        }
        if let Some(t) = self.cached_at.remove(&b) {
            self.cached.remove(&t);
            self.refcount[b as usize] = 1;
            self.used += 1;
            return true;
        }
        self.retain(b)
    }

    /// True when acquiring registered `b` would take an available block
    /// (it is cached rather than held).
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.cached_at.contains_key(&b)
    }

    fn unregister(&mut self, b: BlockId) {
        if let Some(k) = self.key_of.remove(&b) {
            self.by_key.remove(&k);
        }
    }

    /// Changes the number of usable ids. Held blocks are untouched; free and
    /// cached ids at or above the new capacity leave (the cached ones
    /// forgotten), unheld ids below it join the free list.
    pub fn set_capacity(&mut self, capacity: u32) {
        if capacity as usize > self.refcount.len() {
            self.refcount.resize(capacity as usize, 0);
        }
        if capacity < self.capacity {
            // Everything from `capacity` up is no longer ours to hand out.
            let _retired = self.free.split_off(&capacity);
            let gone: Vec<BlockId> = self.cached_at.range(capacity..).map(|(&b, _)| b).collect();
            for b in gone {
                if let Some(t) = self.cached_at.remove(&b) {
                    self.cached.remove(&t);
                }
                self.unregister(b);
            }
        } else {
            for b in self.capacity..capacity {
                if self.refcount[b as usize] == 0 {
                    self.free.insert(b);
                }
            }
        }
        self.capacity = capacity;
    }

    /// Forgets every holder and every key: all blocks below the capacity are
    /// free (the device's memory is gone, and with it every block's contents).
    pub fn reset(&mut self) {
        *self = BlockAllocator::new(self.capacity);
    }

    /// Internal consistency: `used` matches the counts; every id below the
    /// capacity is exactly one of held, free (unregistered) or cached
    /// (registered, unheld); the registry is one to one and names no free
    /// block.
    pub fn check(&self) -> Result<(), String> {
        let held = self.refcount.iter().filter(|&&rc| rc > 0).count() as u32;
        if held != self.used {
            return Err(format!(
                "allocator: used = {} but {held} blocks are held",
                self.used
            ));
        }
        for &b in &self.free {
            if b >= self.capacity {
                return Err(format!(
                    "allocator: free block {b} >= capacity {}",
                    self.capacity
                ));
            }
            if self.refcount(b) != 0 {
                return Err(format!("allocator: block {b} is free and held"));
            }
            if self.key_of.contains_key(&b) || self.cached_at.contains_key(&b) {
                return Err(format!("allocator: free block {b} is registered or cached"));
            }
        }
        for (&b, &t) in &self.cached_at {
            if b >= self.capacity || self.refcount(b) != 0 || !self.key_of.contains_key(&b) {
                return Err(format!(
                    "allocator: cached block {b} is out of range, held or unregistered"
                ));
            }
            if self.cached.get(&t) != Some(&b) {
                return Err(format!("allocator: cached block {b} lost its release time"));
            }
        }
        if self.cached.len() != self.cached_at.len() {
            return Err("allocator: cached order and times disagree".into());
        }
        for (b, k) in &self.key_of {
            if self.by_key.get(k) != Some(b) {
                return Err(format!("allocator: block {b}'s key points elsewhere"));
            }
            if self.refcount(*b) == 0 && !self.cached_at.contains_key(b) {
                return Err(format!(
                    "allocator: registered block {b} is neither held nor cached"
                ));
            }
        }
        if self.by_key.len() != self.key_of.len() {
            return Err("allocator: keys and blocks are not one to one".into());
        }
        let held_below = (0..self.capacity).filter(|&b| self.refcount(b) > 0).count();
        if self.free.len() + self.cached.len() + held_below != self.capacity as usize {
            return Err(format!(
                "allocator: {} free + {} cached + {held_below} held != capacity {}",
                self.free.len(),
                self.cached.len(),
                self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use proptest::prelude::*;
    use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};

    use super::*;

    #[test]
    fn allocates_lowest_first_and_frees() {
        let mut a = BlockAllocator::new(4);
        assert_eq!(a.allocate(), Some(0));
        assert_eq!(a.allocate(), Some(1));
        assert_eq!(a.allocate(), Some(2));
        assert!(a.release(1));
        assert_eq!(a.allocate(), Some(1));
        assert_eq!(a.allocate(), Some(3));
        assert_eq!(a.allocate(), None);
        assert_eq!((a.used(), a.available()), (4, 0));
        a.check().expect("consistent");
    }

    #[test]
    fn refcounts_keep_shared_blocks() {
        let mut a = BlockAllocator::new(2);
        let b = a.allocate().expect("a block");
        assert!(a.retain(b));
        assert!(!a.retain(1), "cannot retain a free block");
        assert!(!a.release(b));
        assert_eq!(a.used(), 1);
        assert!(a.release(b));
        assert_eq!(a.used(), 0);
        a.check().expect("consistent");
    }

    #[test]
    fn registered_blocks_are_cached_when_let_go_and_evicted_last_oldest_first() {
        let mut a = BlockAllocator::new(3);
        let (b0, b1) = (a.allocate().expect("b0"), a.allocate().expect("b1"));
        let k = |n: u8| [n; 32];
        assert!(a.register(b0, k(1)));
        assert!(a.register(b1, k(2)));
        assert!(!a.register(b1, k(3)), "one key per block");
        assert!(a.release(b1));
        assert!(a.release(b0));
        assert_eq!((a.used(), a.cached(), a.available()), (0, 2, 3));
        // A cached block comes back with its content.
        assert_eq!(a.lookup(&k(1)), Some(b0));
        assert!(a.acquire(b0));
        assert_eq!((a.used(), a.cached()), (1, 1));
        assert!(a.acquire(b0), "a held registered block is shared");
        assert_eq!(a.refcount(b0), 2);
        // Allocation takes the free block first, then evicts the cached one.
        assert_eq!(a.allocate(), Some(2));
        assert_eq!(a.allocate(), Some(b1));
        assert_eq!(a.lookup(&k(2)), None, "evicted with its key");
        assert_eq!(a.allocate(), None);
        a.check().expect("consistent");
        // Shrinking forgets cached blocks above the new capacity.
        let mut a = BlockAllocator::new(4);
        let held: Vec<_> = (0..4).map(|_| a.allocate().expect("block")).collect();
        a.register(held[3], k(9));
        for &b in &held {
            a.release(b);
        }
        a.set_capacity(3);
        assert_eq!(a.lookup(&k(9)), None);
        a.check().expect("consistent");
        let key = block_key(None, &[1, 2, 3]);
        assert_ne!(key, block_key(None, &[1, 2, 4]));
        assert_ne!(block_key(Some(&key), &[5]), block_key(None, &[5]));
    }

    #[test]
    fn shrink_retires_high_ids_and_grow_returns_them() {
        let mut a = BlockAllocator::new(6);
        let held: Vec<_> = (0..6).map(|_| a.allocate().expect("block")).collect();
        for &b in &held[..4] {
            a.release(b);
        }
        // Blocks 4 and 5 are held; shrink to 3 leaves them with their holders.
        a.set_capacity(3);
        a.check().expect("consistent");
        assert_eq!(a.used(), 2);
        assert_eq!(a.available(), 1);
        assert_eq!(a.allocate(), Some(0));
        assert_eq!(
            a.allocate(),
            None,
            "held high blocks count against capacity"
        );
        // Released high blocks are retired, not freed.
        assert!(a.release(5));
        assert_eq!(a.allocate(), Some(1));
        assert_eq!(a.allocate(), None);
        a.check().expect("consistent");
        // Grow past the old size: 5 and the new ids come back, 4 is still held.
        a.set_capacity(8);
        a.check().expect("consistent");
        assert_eq!(a.available(), 8 - 3);
        let got: Vec<_> = std::iter::from_fn(|| a.allocate()).collect();
        assert_eq!(got, vec![2, 3, 5, 6, 7]);
        a.reset();
        assert_eq!((a.used(), a.available()), (0, 8));
        a.check().expect("consistent");
    }

    /// Largest capacity the state machine sets; random ids go past it, and
    /// past the refcount table, to reach the out-of-range paths.
    const MAX_CAP: u32 = 12;
    const ID_RANGE: u32 = MAX_CAP + 4;
    /// Distinct content keys the state machine uses.
    const KEYS: u8 = 4;

    fn key(k: u8) -> BlockKey {
        [k; 32]
    }

    /// What the state machine does to the allocator.
    #[derive(Debug, Clone)]
    enum AllocOp {
        Allocate,
        /// A held block (from the model), or any id.
        Retain(BlockId),
        /// A held block (from the model), or any id (held or not).
        Release(BlockId),
        /// A block (held, or any id) under a key.
        Register(BlockId, u8),
        Lookup(u8),
        /// A registered block (from the model), or any id.
        Acquire(BlockId),
        SetCapacity(u32),
        Reset,
    }

    /// What the model says the last operation returns.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Returned {
        Nothing,
        Allocated(Option<BlockId>),
        Retained(bool),
        Released(bool),
        Registered(bool),
        Found(Option<BlockId>),
        Acquired(bool),
    }

    /// The reference model of the allocator: a capacity, the holders of
    /// every held block, the registry, and the cached blocks in release
    /// order, nothing else. Free ids are the unheld unregistered ids below
    /// the capacity; held ids at or above it (after a shrink) still count
    /// as used.
    #[derive(Debug, Clone)]
    struct AllocModel {
        capacity: u32,
        held: BTreeMap<BlockId, u32>,
        registry: BTreeMap<u8, BlockId>,
        /// Cached (unheld, registered) blocks, least recently released first.
        lru: Vec<BlockId>,
        returned: Returned,
    }

    impl AllocModel {
        fn available(&self) -> u32 {
            self.capacity.saturating_sub(self.held.len() as u32)
        }

        fn registered(&self, b: BlockId) -> bool {
            self.registry.values().any(|&r| r == b)
        }

        fn unregister(&mut self, b: BlockId) {
            self.registry.retain(|_, r| *r != b);
        }

        /// Lowest never-cached free id first, else the least recently
        /// released cached block (evicted: its key goes).
        fn take_block(&mut self) -> Option<BlockId> {
            if self.available() == 0 {
                return None;
            }
            let free =
                (0..self.capacity).find(|b| !self.held.contains_key(b) && !self.registered(*b));
            match free {
                Some(b) => Some(b),
                None if !self.lru.is_empty() => {
                    let b = self.lru.remove(0);
                    self.unregister(b);
                    Some(b)
                }
                None => None,
            }
        }
    }

    impl ReferenceStateMachine for AllocModel {
        type State = AllocModel;
        type Transition = AllocOp;

        fn init_state() -> BoxedStrategy<AllocModel> {
            (0..=MAX_CAP)
                .prop_map(|capacity| AllocModel {
                    capacity,
                    held: BTreeMap::new(),
                    registry: BTreeMap::new(),
                    lru: Vec::new(),
                    returned: Returned::Nothing,
                })
                .boxed()
        }

        fn transitions(m: &AllocModel) -> BoxedStrategy<AllocOp> {
            let any_id = 0..ID_RANGE;
            let mut ops = vec![
                (6, Just(AllocOp::Allocate).boxed()),
                (1, any_id.clone().prop_map(AllocOp::Retain).boxed()),
                (1, any_id.clone().prop_map(AllocOp::Release).boxed()),
                (
                    1,
                    (any_id.clone(), 0..KEYS)
                        .prop_map(|(b, k)| AllocOp::Register(b, k))
                        .boxed(),
                ),
                (2, (0..KEYS).prop_map(AllocOp::Lookup).boxed()),
                (1, any_id.prop_map(AllocOp::Acquire).boxed()),
                (2, (0..=MAX_CAP).prop_map(AllocOp::SetCapacity).boxed()),
                (1, Just(AllocOp::Reset).boxed()),
            ];
            if !m.held.is_empty() {
                let held = proptest::sample::select(m.held.keys().copied().collect::<Vec<_>>());
                ops.push((2, held.clone().prop_map(AllocOp::Retain).boxed()));
                ops.push((5, held.clone().prop_map(AllocOp::Release).boxed()));
                ops.push((
                    3,
                    (held, 0..KEYS)
                        .prop_map(|(b, k)| AllocOp::Register(b, k))
                        .boxed(),
                ));
            }
            if !m.registry.is_empty() {
                let reg =
                    proptest::sample::select(m.registry.values().copied().collect::<Vec<_>>());
                ops.push((3, reg.prop_map(AllocOp::Acquire).boxed()));
            }
            proptest::strategy::Union::new_weighted(ops).boxed()
        }

        fn apply(mut m: AllocModel, op: &AllocOp) -> AllocModel {
            m.returned = match *op {
                AllocOp::Allocate => {
                    let b = m.take_block();
                    if let Some(b) = b {
                        m.held.insert(b, 1);
                    }
                    Returned::Allocated(b)
                }
                AllocOp::Retain(b) => Returned::Retained(match m.held.get_mut(&b) {
                    Some(rc) => {
                        *rc += 1;
                        true
                    }
                    None => false,
                }),
                AllocOp::Release(b) => Returned::Released(match m.held.get_mut(&b) {
                    Some(1) => {
                        m.held.remove(&b);
                        if m.registered(b) {
                            if b < m.capacity {
                                m.lru.push(b);
                            } else {
                                m.unregister(b);
                            }
                        }
                        true
                    }
                    Some(rc) => {
                        *rc -= 1;
                        false
                    }
                    None => false,
                }),
                AllocOp::Register(b, k) => {
                    let ok =
                        m.held.contains_key(&b) && !m.registered(b) && !m.registry.contains_key(&k);
                    if ok {
                        m.registry.insert(k, b);
                    }
                    Returned::Registered(ok)
                }
                AllocOp::Lookup(k) => Returned::Found(m.registry.get(&k).copied()),
                AllocOp::Acquire(b) => Returned::Acquired(if !m.registered(b) {
                    false
                } else if let Some(i) = m.lru.iter().position(|&c| c == b) {
                    m.lru.remove(i);
                    m.held.insert(b, 1);
                    true
                } else {
                    *m.held.entry(b).or_insert(0) += 1;
                    true
                }),
                AllocOp::SetCapacity(n) => {
                    if n < m.capacity {
                        let gone: Vec<BlockId> =
                            m.lru.iter().copied().filter(|&b| b >= n).collect();
                        m.lru.retain(|&b| b < n);
                        for b in gone {
                            m.unregister(b);
                        }
                    }
                    m.capacity = n;
                    Returned::Nothing
                }
                AllocOp::Reset => {
                    m.held.clear();
                    m.registry.clear();
                    m.lru.clear();
                    Returned::Nothing
                }
            };
            m
        }
    }

    /// Drives the real `BlockAllocator` with the model's operations.
    struct AllocTest;

    impl StateMachineTest for AllocTest {
        type SystemUnderTest = BlockAllocator;
        type Reference = AllocModel;

        fn init_test(m: &AllocModel) -> BlockAllocator {
            BlockAllocator::new(m.capacity)
        }

        fn apply(mut a: BlockAllocator, m: &AllocModel, op: AllocOp) -> BlockAllocator {
            let returned = match op {
                AllocOp::Allocate => {
                    let held_before: Vec<BlockId> =
                        (0..ID_RANGE).filter(|&b| a.refcount(b) > 0).collect();
                    let got = a.allocate();
                    if let Some(b) = got {
                        assert!(!held_before.contains(&b), "block {b} handed out twice");
                    }
                    Returned::Allocated(got)
                }
                AllocOp::Retain(b) => Returned::Retained(a.retain(b)),
                AllocOp::Release(b) => {
                    let rc = a.refcount(b);
                    // An unheld id is a caller's bug: debug builds say so,
                    // release builds ignore it. Either way nothing changes.
                    let freed = catch_unwind(AssertUnwindSafe(|| a.release(b)));
                    match freed {
                        Ok(freed) => Returned::Released(freed),
                        Err(_) => {
                            assert!(
                                cfg!(debug_assertions) && rc == 0,
                                "release({b}) panicked with refcount {rc}"
                            );
                            Returned::Released(false)
                        }
                    }
                }
                AllocOp::Register(b, k) => Returned::Registered(a.register(b, key(k))),
                AllocOp::Lookup(k) => Returned::Found(a.lookup(&key(k))),
                AllocOp::Acquire(b) => Returned::Acquired(a.acquire(b)),
                AllocOp::SetCapacity(n) => {
                    a.set_capacity(n);
                    Returned::Nothing
                }
                AllocOp::Reset => {
                    a.reset();
                    Returned::Nothing
                }
            };
            assert_eq!(returned, m.returned, "{op:?}");
            a
        }

        fn check_invariants(a: &BlockAllocator, m: &AllocModel) {
            if let Err(e) = a.check() {
                panic!("{e}");
            }
            assert_eq!(a.capacity(), m.capacity);
            assert_eq!(a.used(), m.held.len() as u32);
            assert_eq!(a.available(), m.available());
            assert_eq!(a.cached(), m.lru.len() as u32);
            for b in 0..ID_RANGE {
                let want = m.held.get(&b).copied().unwrap_or(0);
                assert_eq!(a.refcount(b), want, "refcount of block {b}");
            }
            for k in 0..KEYS {
                assert_eq!(a.lookup(&key(k)), m.registry.get(&k).copied(), "key {k}");
            }
        }

        /// Nothing lost: once every holder lets go, the whole pool is
        /// allocatable again: the never-cached blocks lowest first, then the
        /// cached ones, least recently released first.
        fn teardown(mut a: BlockAllocator, m: AllocModel) {
            let mut m = m;
            for (&b, &rc) in &m.held.clone() {
                for left in (0..rc).rev() {
                    assert_eq!(a.release(b), left == 0, "release of {b}");
                }
                m = AllocModel::apply(m, &AllocOp::Release(b));
                for _ in 1..rc {
                    m = AllocModel::apply(m, &AllocOp::Release(b));
                }
            }
            assert_eq!((a.used(), a.available()), (0, m.capacity));
            let all: Vec<BlockId> = std::iter::from_fn(|| a.allocate()).collect();
            let want: Vec<BlockId> = std::iter::from_fn(|| {
                let b = m.take_block();
                if let Some(b) = b {
                    m.held.insert(b, 1);
                }
                b
            })
            .collect();
            assert_eq!(all, want);
            let mut sorted = all.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..m.capacity).collect::<Vec<_>>());
            if let Err(e) = a.check() {
                panic!("{e}");
            }
        }
    }

    prop_state_machine! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn allocator_matches_its_model(sequential 1..100 => AllocTest);
    }
}
