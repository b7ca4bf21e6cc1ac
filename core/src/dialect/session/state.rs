//! What `session` keeps host-wide: which connection holds each live session
//! id, and the tokens each verified job has used.

use std::collections::BTreeMap;

use crate::config::HostConfig;
use crate::conn::ConnId;
use crate::dialect::state::HostWide;
use crate::lru::Lru;
use crate::principal::Principal;

/// Everything `session` keeps across connections.
#[derive(Debug)]
pub struct SessionState {
    /// Which connection holds each live session id on this host.
    pub sessions: SessionRegistry,
    /// Tokens each verified job has used on this host, against its budget.
    pub jobs: JobLedger,
}

impl SessionState {
    /// Empty state sized by `config`.
    pub fn new(config: &HostConfig) -> SessionState {
        SessionState {
            sessions: SessionRegistry::new(config.max_sessions),
            jobs: JobLedger::new(config.max_jobs),
        }
    }
}

impl HostWide for SessionState {
    fn live_sessions(&self) -> usize {
        self.sessions.len()
    }
}

/// Live `session` ids, per principal, and the connection holding each (ids
/// only: the conversation stays with its connection and goes with it). Two
/// principals may use the same id without meeting: each sees only its own.
#[derive(Debug)]
pub struct SessionRegistry {
    live: BTreeMap<(Principal, String), ConnId>,
    capacity: usize,
}

/// Why a session id could not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimError {
    /// It is live on this host already.
    Exists,
    /// The host holds as many sessions as it may.
    Full,
}

impl SessionRegistry {
    /// A registry of at most `capacity` sessions.
    pub fn new(capacity: usize) -> SessionRegistry {
        SessionRegistry {
            live: BTreeMap::new(),
            capacity,
        }
    }

    /// Takes `owner`'s session `id` for `conn`.
    pub fn claim(&mut self, owner: &Principal, id: &str, conn: ConnId) -> Result<(), ClaimError> {
        let key = (owner.clone(), id.to_string());
        if self.live.contains_key(&key) {
            return Err(ClaimError::Exists);
        }
        if self.live.len() >= self.capacity {
            return Err(ClaimError::Full);
        }
        self.live.insert(key, conn);
        Ok(())
    }

    /// Gives `owner`'s `id` back if `conn` holds it.
    pub fn release(&mut self, owner: &Principal, id: &str, conn: ConnId) {
        let key = (owner.clone(), id.to_string());
        if self.live.get(&key) == Some(&conn) {
            self.live.remove(&key);
        }
    }

    /// The connection holding `owner`'s session `id`.
    #[cfg(test)]
    fn holder(&self, owner: &Principal, id: &str) -> Option<ConnId> {
        self.live.get(&(owner.clone(), id.to_string())).copied()
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when no session is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

/// One job's account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Account {
    budget: Option<u64>,
    used: u64,
    /// Held for replies in flight: the most each may still use.
    reserved: u64,
}

/// Tokens used per verified job on this host, least recently used forgotten
/// first past its capacity (a forgotten job starts again from zero when it
/// is verified again: the verifier, not this host, is the budget's authority).
#[derive(Debug)]
pub struct JobLedger {
    accounts: Lru<String, Account>,
}

impl JobLedger {
    /// A ledger of at most `capacity` jobs.
    pub fn new(capacity: usize) -> JobLedger {
        JobLedger {
            accounts: Lru::new(capacity.max(1)),
        }
    }

    /// Records a verifier's grant for `job` (the budget it gave; tokens used
    /// so far are kept).
    pub fn grant(&mut self, job: &str, budget: Option<u64>) {
        let key = job.to_string();
        match self.accounts.get(&key) {
            Some(a) => a.budget = budget,
            None => {
                self.accounts.put(
                    key,
                    Account {
                        budget,
                        used: 0,
                        reserved: 0,
                    },
                );
            }
        }
    }

    /// Tokens `job` may still use: its budget less what it used and what
    /// replies in flight hold (`None`: no cap, or an unknown job).
    pub fn remaining(&self, job: &str) -> Option<u64> {
        let a = self.accounts.peek(&job.to_string())?;
        a.budget
            .map(|b| b.saturating_sub(a.used).saturating_sub(a.reserved))
    }

    /// Holds `tokens` of `job` for a reply about to start (its prompt and
    /// the most it may generate), so that replies running side by side
    /// cannot together pass the budget.
    pub fn reserve(&mut self, job: &str, tokens: u64) {
        if let Some(a) = self.accounts.get(&job.to_string()) {
            a.reserved = a.reserved.saturating_add(tokens);
        }
    }

    /// A reply that held `reserved` tokens of `job` ended having used
    /// `used`: the hold is released and the use charged.
    pub fn settle(&mut self, job: &str, reserved: u64, used: u64) {
        if let Some(a) = self.accounts.get(&job.to_string()) {
            a.reserved = a.reserved.saturating_sub(reserved);
            a.used = a.used.saturating_add(used);
        }
    }

    /// Jobs with an account (the tests' view: nothing in the Host needs the
    /// count, the bound is the LRU's own).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.accounts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_held_by_one_connection_until_it_lets_go() {
        let me = &Principal::Anonymous;
        let mut r = SessionRegistry::new(2);
        assert!(r.is_empty());
        r.claim(me, "a", ConnId(1)).expect("free");
        assert!(!r.is_empty());
        assert_eq!(r.claim(me, "a", ConnId(2)), Err(ClaimError::Exists));
        r.release(me, "a", ConnId(2));
        assert_eq!(
            r.holder(me, "a"),
            Some(ConnId(1)),
            "only its holder releases it"
        );
        r.claim(me, "b", ConnId(2)).expect("room");
        assert_eq!(r.claim(me, "c", ConnId(3)), Err(ClaimError::Full));
        r.release(me, "a", ConnId(1));
        r.claim(me, "c", ConnId(3)).expect("room again");
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn principals_do_not_see_each_others_session_ids() {
        let alice = Principal::Conn(ConnId(1));
        let bob = Principal::Conn(ConnId(2));
        let mut r = SessionRegistry::new(4);
        r.claim(&alice, "s", ConnId(1)).expect("free");
        r.claim(&bob, "s", ConnId(2))
            .expect("bob's own `s`: alice's says nothing to him");
        assert_eq!(r.holder(&alice, "s"), Some(ConnId(1)));
        assert_eq!(r.holder(&bob, "s"), Some(ConnId(2)));
        r.release(&bob, "s", ConnId(1));
        assert_eq!(
            r.holder(&bob, "s"),
            Some(ConnId(2)),
            "not alice's to release"
        );
    }

    #[test]
    fn replies_in_flight_hold_their_most_until_they_settle() {
        let mut l = JobLedger::new(4);
        l.grant("j", Some(300));
        l.settle("j", 0, 150);
        // Two replies side by side: the second sees what the first holds.
        l.reserve("j", 150);
        assert_eq!(l.remaining("j"), Some(0));
        // The first used 63 of its 150: the rest comes back.
        l.settle("j", 150, 63);
        assert_eq!(l.remaining("j"), Some(87));
        l.reserve("j", 87);
        l.settle("j", 87, 87);
        assert_eq!(l.remaining("j"), Some(0));
        // A job without a cap holds nothing that matters.
        l.grant("free", None);
        l.reserve("free", 10);
        assert_eq!(l.remaining("free"), None);
    }

    #[test]
    fn budgets_are_charged_and_the_least_recent_job_is_forgotten() {
        let mut l = JobLedger::new(2);
        l.grant("j1", Some(100));
        l.grant("j2", None);
        l.settle("j1", 0, 60);
        assert_eq!(l.remaining("j1"), Some(40));
        l.settle("j1", 0, 60);
        assert_eq!(l.remaining("j1"), Some(0), "never below zero");
        assert_eq!(l.remaining("j2"), None, "no cap");
        l.settle("j2", 0, 1); // j2 is now the most recent
        l.grant("j3", Some(5));
        assert_eq!(l.len(), 2);
        assert_eq!(l.remaining("j1"), None, "j1 was least recent and forgotten");
        assert_eq!(l.remaining("j3"), Some(5));
        l.grant("j3", Some(10));
        assert_eq!(
            l.remaining("j3"),
            Some(10),
            "a new grant keeps what was used"
        );
    }
}
