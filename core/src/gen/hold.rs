//! Why a generation is held (not scheduled, its results kept back): a set of
//! reasons, each set and cleared by whoever owns it, so that one reason
//! clearing never releases a generation another still holds.

/// One reason to hold a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HoldReason {
    /// Its client paused it (`control pause`, a dialect's pause message).
    ClientPause,
    /// Its connection's outbound queue is full (a slow reader).
    OutboundFull,
    /// A dialect's flow window is spent (credit-based flow control).
    FlowWindow,
    /// Its dialect waits for the generations it moves in step with (a beam
    /// waiting for the rest of its round). The server releases it, so no
    /// pause timeout bounds it.
    Siblings,
}

impl HoldReason {
    /// Every reason.
    pub const ALL: [HoldReason; 4] = [
        HoldReason::ClientPause,
        HoldReason::OutboundFull,
        HoldReason::FlowWindow,
        HoldReason::Siblings,
    ];

    fn bit(self) -> u8 {
        match self {
            HoldReason::ClientPause => 1,
            HoldReason::OutboundFull => 2,
            HoldReason::FlowWindow => 4,
            HoldReason::Siblings => 8,
        }
    }
}

/// A set of [`HoldReason`]s; empty means the generation may run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Holds(u8);

impl Holds {
    /// No reason: runnable.
    pub const NONE: Holds = Holds(0);

    /// Adds `reason`; true if it was not there.
    pub fn insert(&mut self, reason: HoldReason) -> bool {
        let had = self.contains(reason);
        self.0 |= reason.bit();
        !had
    }

    /// Removes `reason`; true if it was there.
    pub fn remove(&mut self, reason: HoldReason) -> bool {
        let had = self.contains(reason);
        self.0 &= !reason.bit();
        had
    }

    /// True when `reason` is in the set.
    pub fn contains(self, reason: HoldReason) -> bool {
        self.0 & reason.bit() != 0
    }

    /// True when nothing holds the generation.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The reasons in the set.
    pub fn iter(self) -> impl Iterator<Item = HoldReason> {
        HoldReason::ALL
            .into_iter()
            .filter(move |r| self.contains(*r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_cleared_leaves_the_others_holding() {
        let mut h = Holds::NONE;
        assert!(h.insert(HoldReason::ClientPause));
        assert!(h.insert(HoldReason::OutboundFull));
        assert!(!h.insert(HoldReason::OutboundFull), "already there");
        assert!(h.remove(HoldReason::OutboundFull));
        assert!(!h.is_empty(), "the client pause still holds it");
        assert_eq!(h.iter().collect::<Vec<_>>(), vec![HoldReason::ClientPause]);
        assert!(!h.remove(HoldReason::FlowWindow), "never set");
        assert!(h.remove(HoldReason::ClientPause));
        assert!(h.is_empty());
    }
}
