//! The dialects' host-wide state: what outlives one connection's callback
//! but belongs to no single generation. Each dialect's part is its own type,
//! in its own module, made by its row of [`super::registry::DIALECTS`]; this
//! module only holds them. Each part is bounded, and none holds conversation
//! text beyond the connection that brought it.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;

use crate::conn::Dialect;
use crate::rate::RateLimits;

/// One dialect's host-wide state. Any bounded type will do; the Host hands
/// it back to the dialect's connections through
/// [`super::Cx::state`], by its type.
pub trait HostWide: Any + Send + Debug {
    /// Live sessions it holds (the health report's `sessions`).
    fn live_sessions(&self) -> usize {
        0
    }
}

/// Everything the dialects keep across connections.
#[derive(Debug)]
pub struct DialectState {
    /// Each dialect's own part, for the dialects that keep one.
    parts: BTreeMap<Dialect, Box<dyn HostWide>>,
    /// Each organisation's request and token buckets (the keys file's
    /// limits), shared by every dialect its keys are used on.
    pub limits: RateLimits,
}

impl DialectState {
    /// State made of these parts ([`super::registry::dialect_state`] makes
    /// each dialect's as its row says).
    pub fn new(parts: impl IntoIterator<Item = (Dialect, Box<dyn HostWide>)>) -> DialectState {
        DialectState {
            parts: parts.into_iter().collect(),
            limits: RateLimits::default(),
        }
    }

    /// `dialect`'s part, if it keeps one of type `T`.
    pub fn part<T: HostWide>(&mut self, dialect: Dialect) -> Option<&mut T> {
        let part: &mut dyn Any = self.parts.get_mut(&dialect)?.as_mut();
        part.downcast_mut()
    }

    /// Live sessions across the dialects (the health report's `sessions`).
    pub fn live_sessions(&self) -> usize {
        self.parts.values().map(|p| p.live_sessions()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostConfig;
    use crate::dialect::registry::dialect_state;
    use crate::dialect::responses::store::ResponseStore;
    use crate::dialect::session::state::SessionState;

    #[test]
    fn each_dialect_finds_its_own_part_by_its_type() {
        let mut state = dialect_state(&HostConfig::default());
        assert!(state.part::<SessionState>(Dialect::Session).is_some());
        assert!(state.part::<ResponseStore>(Dialect::Responses).is_some());
        assert!(
            state.part::<ResponseStore>(Dialect::Session).is_none(),
            "another dialect's type is not there"
        );
        assert!(
            state.part::<SessionState>(Dialect::Generate).is_none(),
            "generate keeps nothing"
        );
        assert_eq!(state.live_sessions(), 0);
    }
}
