//! The paged KV cache's block allocator: which block ids are free, and how many
//! holders each used block has.
//!
//! Block ids are handed out lowest first. That keeps the pool's low ids busy and
//! its high ids idle, so shrinking the pool (memory pressure) usually finds the
//! blocks above the new capacity already free.
//!
//! Reference counts are kept (rather than a plain owned/free bit) so that prefix
//! sharing and copy-on-write can be added without changing the accounting.

use std::collections::BTreeSet;

use crate::engine::BlockId;

/// Free list and reference counts of the KV blocks.
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
    /// Unheld ids below `capacity`, allocated lowest first.
    free: BTreeSet<BlockId>,
    /// Blocks with at least one holder (including any at or above `capacity`).
    used: u32,
}

impl BlockAllocator {
    /// A pool of `capacity` blocks, all free.
    pub fn new(capacity: u32) -> Self {
        BlockAllocator {
            capacity,
            refcount: vec![0; capacity as usize],
            free: (0..capacity).collect(),
            used: 0,
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

    /// Blocks that may be allocated now. Held blocks above the capacity count
    /// against it, so this can be less than the length of the free list.
    pub fn available(&self) -> u32 {
        self.capacity.saturating_sub(self.used)
    }

    /// Holders of block `b` (0 when free or out of range).
    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refcount.get(b as usize).copied().unwrap_or(0)
    }

    /// Takes the lowest free block, with one holder; `None` when none is available.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.available() == 0 {
            return None;
        }
        let b = self.free.pop_first()?;
        self.refcount[b as usize] = 1;
        self.used += 1;
        Some(b)
    }

    /// Adds a holder to a held block (prefix sharing). Returns false, changing
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

    /// Drops one holder of `b`; the block becomes free (or retired, when at or
    /// above the capacity) with its last holder. Returns true when that
    /// happened. Releasing an unheld block changes nothing.
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
        if b < self.capacity {
            self.free.insert(b);
        }
        true
    }

    /// Changes the number of usable ids. Held blocks are untouched; free ids at
    /// or above the new capacity leave the free list, unheld ids below it join.
    pub fn set_capacity(&mut self, capacity: u32) {
        if capacity as usize > self.refcount.len() {
            self.refcount.resize(capacity as usize, 0);
        }
        if capacity < self.capacity {
            // Everything from `capacity` up is no longer ours to hand out.
            let _retired = self.free.split_off(&capacity);
        } else {
            for b in self.capacity..capacity {
                if self.refcount[b as usize] == 0 {
                    self.free.insert(b);
                }
            }
        }
        self.capacity = capacity;
    }

    /// Forgets every holder: all blocks below the capacity are free (the
    /// device's memory is gone, and with it every block's contents).
    pub fn reset(&mut self) {
        *self = BlockAllocator::new(self.capacity);
    }

    /// Internal consistency: `used` matches the counts, the free list is
    /// exactly the unheld ids below the capacity.
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
        }
        let held_below = (0..self.capacity).filter(|&b| self.refcount(b) > 0).count();
        if self.free.len() + held_below != self.capacity as usize {
            return Err(format!(
                "allocator: {} free + {held_below} held != capacity {}",
                self.free.len(),
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

    /// What the state machine does to the allocator.
    #[derive(Debug, Clone)]
    enum AllocOp {
        Allocate,
        /// A held block (from the model), or any id.
        Retain(BlockId),
        /// A held block (from the model), or any id (held or not).
        Release(BlockId),
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
    }

    /// The reference model of the allocator: a capacity and the holders of
    /// every held block, nothing else. Free ids are the unheld ids below the
    /// capacity; held ids at or above it (after a shrink) still count as used.
    #[derive(Debug, Clone)]
    struct AllocModel {
        capacity: u32,
        held: BTreeMap<BlockId, u32>,
        returned: Returned,
    }

    impl AllocModel {
        fn available(&self) -> u32 {
            self.capacity.saturating_sub(self.held.len() as u32)
        }

        /// Lowest first: the lowest unheld id below the capacity, while the
        /// blocks held (above the capacity too) leave room.
        fn next_block(&self) -> Option<BlockId> {
            if self.available() == 0 {
                return None;
            }
            (0..self.capacity).find(|b| !self.held.contains_key(b))
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
                    returned: Returned::Nothing,
                })
                .boxed()
        }

        fn transitions(m: &AllocModel) -> BoxedStrategy<AllocOp> {
            let any_id = 0..ID_RANGE;
            let mut ops = vec![
                (6, Just(AllocOp::Allocate).boxed()),
                (1, any_id.clone().prop_map(AllocOp::Retain).boxed()),
                (1, any_id.prop_map(AllocOp::Release).boxed()),
                (2, (0..=MAX_CAP).prop_map(AllocOp::SetCapacity).boxed()),
                (1, Just(AllocOp::Reset).boxed()),
            ];
            if !m.held.is_empty() {
                let held = proptest::sample::select(m.held.keys().copied().collect::<Vec<_>>());
                ops.push((2, held.clone().prop_map(AllocOp::Retain).boxed()));
                ops.push((5, held.prop_map(AllocOp::Release).boxed()));
            }
            proptest::strategy::Union::new_weighted(ops).boxed()
        }

        fn apply(mut m: AllocModel, op: &AllocOp) -> AllocModel {
            m.returned = match *op {
                AllocOp::Allocate => {
                    let b = m.next_block();
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
                        true
                    }
                    Some(rc) => {
                        *rc -= 1;
                        false
                    }
                    None => false,
                }),
                AllocOp::SetCapacity(n) => {
                    m.capacity = n;
                    Returned::Nothing
                }
                AllocOp::Reset => {
                    m.held.clear();
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
            for b in 0..ID_RANGE {
                let want = m.held.get(&b).copied().unwrap_or(0);
                assert_eq!(a.refcount(b), want, "refcount of block {b}");
            }
        }

        /// Nothing lost: once every holder lets go, the whole pool is
        /// allocatable again, lowest first.
        fn teardown(mut a: BlockAllocator, m: AllocModel) {
            for (&b, &rc) in &m.held {
                for left in (0..rc).rev() {
                    assert_eq!(a.release(b), left == 0, "release of {b}");
                }
            }
            assert_eq!((a.used(), a.available()), (0, m.capacity));
            let all: Vec<BlockId> = std::iter::from_fn(|| a.allocate()).collect();
            assert_eq!(all, (0..m.capacity).collect::<Vec<_>>());
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
