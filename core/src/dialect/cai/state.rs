//! What `cai` keeps across connections: conversations per (organisation,
//! `conversationId`) for a time-to-live, bounded by count (least recently
//! used go first, per organisation too) and by length.

use std::collections::{BTreeMap, BTreeSet};

use crate::lru::Lru;
use crate::text::{ChatMessage, Role};
use crate::time::{Duration, Instant};

type ConvKey = (String, String);

#[derive(Debug)]
struct Conversation {
    messages: Vec<ChatMessage>,
    expires: Instant,
}

/// Conversations kept in memory, per (organisation, conversation id).
/// Bounded three ways: in all (`max_conversations`, least recently used
/// first out), per organisation (`max_conversations_per_org`: a full
/// organisation pushes out its own least recently used, never another's)
/// and in messages and bytes per conversation (`conversation_max_messages`,
/// `conversation_max_bytes`: the oldest non-system messages go first;
/// prompts are cut to the context window anyway).
#[derive(Debug)]
pub struct Conversations {
    map: Lru<ConvKey, Conversation>,
    by_expiry: BTreeSet<(Instant, ConvKey)>,
    per_org: BTreeMap<String, usize>,
    ttl: Duration,
    max_per_org: usize,
    max_messages: usize,
    max_bytes: usize,
}

/// How many conversations a [`Conversations`] keeps, and how much of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationBounds {
    /// In all.
    pub total: usize,
    /// Per organisation.
    pub per_org: usize,
    /// Messages per conversation.
    pub messages: usize,
    /// Bytes of message text per conversation.
    pub bytes: usize,
    /// How long one is kept after it was last used.
    pub ttl: Duration,
}

impl Conversations {
    /// An empty store within `bounds`.
    pub fn new(bounds: ConversationBounds) -> Conversations {
        Conversations {
            map: Lru::new(bounds.total.max(1)),
            by_expiry: BTreeSet::new(),
            per_org: BTreeMap::new(),
            ttl: bounds.ttl,
            max_per_org: bounds.per_org.max(1),
            max_messages: bounds.messages,
            max_bytes: bounds.bytes,
        }
    }

    fn forget(&mut self, key: &ConvKey, c: &Conversation) {
        self.by_expiry.remove(&(c.expires, key.clone()));
        if let Some(n) = self.per_org.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.per_org.remove(&key.0);
            }
        }
    }

    fn remove(&mut self, key: &ConvKey) {
        if let Some(c) = self.map.remove(key) {
            self.forget(key, &c);
        }
    }

    /// Forgets every conversation whose time ran out by `now`.
    fn expire(&mut self, now: Instant) {
        while let Some((at, key)) = self.by_expiry.first().cloned() {
            if at > now {
                break;
            }
            self.remove(&key);
        }
    }

    /// The messages of a live conversation.
    pub fn get(&mut self, now: Instant, org: &str, id: &str) -> Option<Vec<ChatMessage>> {
        self.expire(now);
        let key = (org.to_string(), id.to_string());
        self.map.peek(&key).map(|c| c.messages.clone())
    }

    /// Stores `messages` as the conversation, alive for the TTL from `now`,
    /// its oldest messages dropped past the bounds (and nothing kept when
    /// its system messages alone are over the byte bound).
    pub fn put(&mut self, now: Instant, org: &str, id: &str, mut messages: Vec<ChatMessage>) {
        self.expire(now);
        let key = (org.to_string(), id.to_string());
        self.remove(&key);
        if !trim(&mut messages, self.max_messages, self.max_bytes) {
            return;
        }
        if self.per_org.get(org).copied().unwrap_or(0) >= self.max_per_org {
            let oldest = self.map.least_recent_where(|(o, _)| o == org);
            if let Some(oldest) = oldest {
                self.remove(&oldest);
            }
        }
        let expires = now + self.ttl;
        self.by_expiry.insert((expires, key.clone()));
        *self.per_org.entry(org.to_string()).or_default() += 1;
        for (gone, c) in self.map.put(key, Conversation { messages, expires }) {
            self.forget(&gone, &c);
        }
    }

    /// Live conversations (as of the last call that expired them).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }

    /// Conversations `org` keeps (as of the last call that expired them).
    #[cfg(test)]
    fn of_org(&self, org: &str) -> usize {
        self.per_org.get(org).copied().unwrap_or(0)
    }

    /// True when none is kept.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Drops the oldest non-system messages past `max_messages` messages and
/// past `max_bytes` of text; false when the system messages alone are over
/// `max_bytes` (nothing may be kept).
fn trim(messages: &mut Vec<ChatMessage>, max_messages: usize, max_bytes: usize) -> bool {
    let mut count_excess = messages.len().saturating_sub(max_messages);
    let mut bytes: usize = messages.iter().map(|m| m.content.len()).sum();
    messages.retain(|m| {
        if m.role != Role::System && (count_excess > 0 || bytes > max_bytes) {
            count_excess = count_excess.saturating_sub(1);
            bytes -= m.content.len();
            false
        } else {
            true
        }
    });
    bytes <= max_bytes
}

/// Everything `cai` keeps host-wide (its organisations' rate limits are
/// every dialect's: the rate buckets in the dialect state).
#[derive(Debug)]
pub struct CaiState {
    /// Conversations per (organisation, conversation id).
    pub conversations: Conversations,
}

impl CaiState {
    /// Empty state with the bounds `config` sets.
    pub fn for_host(config: &crate::config::HostConfig) -> CaiState {
        CaiState::new(ConversationBounds {
            total: config.max_conversations,
            per_org: config.max_conversations_per_org,
            messages: config.conversation_max_messages,
            bytes: config.conversation_max_bytes,
            ttl: config.conversation_ttl,
        })
    }

    /// Empty state.
    pub fn new(bounds: ConversationBounds) -> CaiState {
        CaiState {
            conversations: Conversations::new(bounds),
        }
    }
}

impl crate::dialect::state::HostWide for CaiState {}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(secs)
    }

    /// Bounds with 256 messages a conversation.
    fn bounds(total: usize, per_org: usize, bytes: usize) -> ConversationBounds {
        ConversationBounds {
            total,
            per_org,
            messages: 256,
            bytes,
            ttl: Duration::from_secs(60),
        }
    }

    #[test]
    fn one_organisation_pushes_out_only_its_own_and_bytes_are_bounded() {
        let mut c = Conversations::new(bounds(10, 2, 12));
        c.put(at(0), "big", "1", vec![]);
        c.put(at(0), "small", "x", vec![]);
        c.put(at(1), "big", "2", vec![]);
        c.put(at(2), "big", "3", vec![]);
        assert_eq!(c.of_org("big"), 2);
        assert!(c.get(at(2), "big", "1").is_none(), "its own oldest went");
        assert!(c.get(at(2), "small", "x").is_some(), "never another's");
        c.put(
            at(3),
            "small",
            "x",
            vec![
                msg(Role::System, "sys"),
                msg(Role::User, "1234567"),
                msg(Role::Assistant, "abc"),
            ],
        );
        let kept = c.get(at(3), "small", "x").expect("kept");
        assert_eq!(kept.len(), 2, "the oldest non-system message went");
        assert_eq!(kept[1].content, "abc");
        c.put(
            at(4),
            "small",
            "y",
            vec![msg(Role::System, "thirteen byte")],
        );
        assert!(c.get(at(4), "small", "y").is_none(), "too big even trimmed");
        assert_eq!(c.of_org("small"), 1);
    }

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    #[test]
    fn conversations_live_for_their_ttl_per_organisation() {
        let mut c = Conversations::new(bounds(10, 10, 1 << 20));
        c.put(at(0), "org", "c1", vec![msg(Role::User, "hi")]);
        assert_eq!(c.get(at(59), "org", "c1").map(|m| m.len()), Some(1));
        assert_eq!(
            c.get(at(59), "other", "c1"),
            None,
            "another org's id is another conversation"
        );
        c.put(
            at(30),
            "org",
            "c1",
            vec![msg(Role::User, "a"), msg(Role::Assistant, "b")],
        );
        assert_eq!(
            c.get(at(89), "org", "c1").map(|m| m.len()),
            Some(2),
            "a put renews it"
        );
        assert_eq!(c.get(at(90), "org", "c1"), None, "expired");
        assert!(c.is_empty());
    }

    #[test]
    fn conversations_are_bounded_by_count_and_length() {
        let mut c = Conversations::new(bounds(2, 2, 1 << 20));
        c.put(at(0), "o", "a", vec![]);
        c.put(at(1), "o", "b", vec![]);
        c.put(at(2), "o", "a", vec![]); // a is now the most recent
        c.put(at(3), "o", "c", vec![]);
        assert_eq!(c.len(), 2);
        assert!(
            c.get(at(3), "o", "b").is_none(),
            "least recently used went first"
        );
        assert!(c.get(at(3), "o", "a").is_some());
        let mut long = vec![msg(Role::System, "sys")];
        long.extend((0..256 + 5).map(|i| msg(Role::User, &i.to_string())));
        c.put(at(4), "o", "long", long);
        let kept = c.get(at(4), "o", "long").expect("kept");
        assert_eq!(kept.len(), 256);
        assert_eq!(kept[0].role, Role::System, "system messages stay");
        assert_eq!(kept[1].content, "6", "the oldest went");
    }
}
