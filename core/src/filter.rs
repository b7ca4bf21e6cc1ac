//! Content filtering (`--content-filter`): operator rules, each a regular
//! expression matched case-insensitively, that refuse a prompt before any
//! compute (`refuse`) or end a generation before its text matches (`stop`).
//!
//! A `stop` rule works like a stop string ([`crate::gen::stop`]) with a
//! regular expression's reach: [`FilterGuard`] holds back generated text
//! from the first place a match could still start (an anchored DFA from
//! that place is not dead yet) and releases what no match can cover any
//! more. When a match completes, the text from its start on is dropped and
//! the generation ends with finish reason `content_filter`. So matched text
//! never reaches a client, even split across tokens; and no rule's text is
//! ever logged, only its name.
//!
//! `\b` in a `stop` rule is an ASCII word boundary (the DFA cannot look at
//! Unicode word characters); a guard that meets a byte it cannot decide on
//! counts that start as no match.

use std::fmt;
use std::sync::Arc;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::util::syntax;
use regex_automata::{meta, Anchored, MatchKind};

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterAction {
    /// A prompt or message that matches is refused before any compute.
    Refuse,
    /// Generated text that would match ends the generation before it.
    Stop,
}

impl FilterAction {
    /// Its name in the rules file and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterAction::Refuse => "refuse",
            FilterAction::Stop => "stop",
        }
    }
}

/// One rule as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRule {
    /// Its name (errors and metrics name it; never its pattern or the text).
    pub name: String,
    /// A regular expression, matched case-insensitively.
    pub pattern: String,
    /// What a match does.
    pub action: FilterAction,
}

/// Most bytes one rule set's DFA may take (a pattern that needs more is
/// refused at load, not discovered at run time).
const DFA_SIZE_LIMIT: usize = 16 << 20;

/// The compiled rules: one unanchored matcher for `refuse` rules, one
/// anchored DFA for `stop` rules.
pub struct ContentFilter {
    rules: Vec<FilterRule>,
    refuse: Option<(meta::Regex, Vec<usize>)>,
    stop: Option<(dense::DFA<Vec<u32>>, Vec<usize>)>,
    /// The `stop` rules as an unanchored search (an oracle's question:
    /// does this text contain a match?).
    stop_search: Option<(meta::Regex, Vec<usize>)>,
}

impl fmt::Debug for ContentFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.rules.iter().map(|r| r.name.as_str()).collect();
        f.debug_struct("ContentFilter")
            .field("rules", &names)
            .finish()
    }
}

impl PartialEq for ContentFilter {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
}

impl ContentFilter {
    /// Compiles `rules`. An error names the rule and what is wrong with it.
    pub fn new(rules: Vec<FilterRule>) -> Result<ContentFilter, String> {
        let mut seen = std::collections::BTreeSet::new();
        for r in &rules {
            if r.name.is_empty() {
                return Err("a rule needs a `name`".into());
            }
            if !seen.insert(r.name.as_str()) {
                return Err(format!("rule `{}` is named twice", r.name));
            }
            // Each alone first, so an error names its rule.
            meta::Regex::builder()
                .syntax(syntax::Config::new().case_insensitive(true))
                .build(&r.pattern)
                .map_err(|e| format!("rule `{}`: invalid pattern: {e}", r.name))?;
        }
        let pick = |a: FilterAction| -> (Vec<&str>, Vec<usize>) {
            rules
                .iter()
                .enumerate()
                .filter(|(_, r)| r.action == a)
                .map(|(i, r)| (r.pattern.as_str(), i))
                .unzip()
        };
        let search = |a: FilterAction| -> Result<Option<(meta::Regex, Vec<usize>)>, String> {
            let (patterns, ids) = pick(a);
            if patterns.is_empty() {
                return Ok(None);
            }
            let re = meta::Regex::builder()
                .syntax(syntax::Config::new().case_insensitive(true))
                .build_many(&patterns)
                .map_err(|e| format!("the {} rules: {e}", a.as_str()))?;
            Ok(Some((re, ids)))
        };
        let refuse = search(FilterAction::Refuse)?;
        let stop_search = search(FilterAction::Stop)?;
        let (patterns, ids) = pick(FilterAction::Stop);
        let stop = if patterns.is_empty() {
            None
        } else {
            let dfa = dense::Builder::new()
                .syntax(syntax::Config::new().case_insensitive(true))
                .configure(
                    dense::Config::new()
                        .start_kind(StartKind::Anchored)
                        .match_kind(MatchKind::All)
                        .unicode_word_boundary(true)
                        .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                        .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
                )
                .build_many(&patterns)
                .map_err(|e| {
                    format!("the stop rules are too complex to match while streaming: {e}")
                })?;
            Some((dfa, ids))
        };
        Ok(ContentFilter {
            rules,
            refuse,
            stop,
            stop_search,
        })
    }

    /// The rules, as written.
    pub fn rules(&self) -> &[FilterRule] {
        &self.rules
    }

    /// The first `refuse` rule `text` matches, if any.
    pub fn refused(&self, text: &str) -> Option<&FilterRule> {
        let (re, ids) = self.refuse.as_ref()?;
        let m = re.find(text)?;
        ids.get(m.pattern().as_usize())
            .and_then(|&i| self.rules.get(i))
    }

    /// The first `stop` rule `text` contains a match of, if any (what a
    /// client must never have received).
    pub fn stopped(&self, text: &str) -> Option<&FilterRule> {
        let (re, ids) = self.stop_search.as_ref()?;
        let m = re.find(text)?;
        ids.get(m.pattern().as_usize())
            .and_then(|&i| self.rules.get(i))
    }

    /// Whether any rule stops generations.
    pub fn has_stop_rules(&self) -> bool {
        self.stop.is_some()
    }
}

/// What a piece of generated text did to a [`FilterGuard`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filtered {
    /// Text that can be streamed now.
    pub emit: String,
    /// The `stop` rule that matched: the generation ends, and nothing from
    /// the match's start on is streamed.
    pub matched: Option<String>,
}

/// One generation's hold-back of text a `stop` rule could still match.
#[derive(Debug, Clone)]
pub struct FilterGuard {
    filter: Arc<ContentFilter>,
    held: String,
    /// The last byte released (a rule's `\b` looks at it).
    before: Option<u8>,
    done: bool,
}

/// Where an anchored run from one start ended.
enum Run {
    /// A match completed, by this rule.
    Match(usize),
    /// No match can start here.
    Dead,
    /// A match may still complete with more text.
    Alive,
}

impl FilterGuard {
    /// A guard for `filter`'s `stop` rules.
    pub fn new(filter: Arc<ContentFilter>) -> FilterGuard {
        FilterGuard {
            filter,
            held: String::new(),
            before: None,
            done: false,
        }
    }

    /// Feeds newly generated text.
    pub fn push(&mut self, text: &str) -> Filtered {
        if self.done {
            return Filtered::default();
        }
        self.held.push_str(text);
        self.scan(false)
    }

    /// Feeds the text that ends the generation: [`Self::push`], then, unless
    /// it matched, [`Self::finish`], as one result.
    pub fn push_last(&mut self, text: &str) -> Filtered {
        let mut out = self.push(text);
        if out.matched.is_none() {
            let rest = self.finish();
            out.emit.push_str(&rest.emit);
            out.matched = rest.matched;
        }
        out
    }

    /// The generation ends: releases held text unless a rule matches it
    /// with the end of the text (a `$` or `\b` at the end).
    pub fn finish(&mut self) -> Filtered {
        if self.done {
            return Filtered::default();
        }
        let out = self.scan(true);
        let mut emit = out.emit;
        if out.matched.is_none() {
            emit.push_str(&std::mem::take(&mut self.held));
        }
        self.done = true;
        Filtered {
            emit,
            matched: out.matched,
        }
    }

    /// Releases what no match can cover; stops at the first match.
    fn scan(&mut self, at_end: bool) -> Filtered {
        let Some((dfa, ids)) = self.filter.stop.as_ref() else {
            return Filtered {
                emit: std::mem::take(&mut self.held),
                matched: None,
            };
        };
        let bytes = self.held.as_bytes();
        let mut release = bytes.len();
        let mut matched = None;
        for start in 0..bytes.len() {
            if !self.held.is_char_boundary(start) {
                continue;
            }
            let before = if start == 0 {
                self.before
            } else {
                Some(bytes[start - 1])
            };
            match run(dfa, &bytes[start..], before, at_end) {
                Run::Match(p) => {
                    release = start;
                    matched = Some(p);
                    break;
                }
                Run::Alive => {
                    release = release.min(start);
                }
                Run::Dead => {}
            }
        }
        let emit = self.held[..release].to_string();
        if let Some(p) = matched {
            self.held.clear();
            self.done = true;
            let name = ids
                .get(p)
                .and_then(|&i| self.filter.rules.get(i))
                .map(|r| r.name.clone())
                .unwrap_or_default();
            return Filtered {
                emit,
                matched: Some(name),
            };
        }
        if release > 0 {
            self.before = Some(bytes[release - 1]);
            self.held.drain(..release);
        }
        Filtered {
            emit,
            matched: None,
        }
    }
}

/// Runs the anchored DFA over `hay` from a start whose previous byte is
/// `before`; with `at_end`, the text ends after `hay`.
fn run(dfa: &dense::DFA<Vec<u32>>, hay: &[u8], before: Option<u8>, at_end: bool) -> Run {
    let config = start::Config::new()
        .anchored(Anchored::Yes)
        .look_behind(before);
    let Ok(mut state) = dfa.start_state(&config) else {
        return Run::Dead;
    };
    let matched = |s: StateID| {
        dfa.is_match_state(s)
            .then(|| dfa.match_pattern(s, 0).as_usize())
    };
    for &b in hay {
        state = dfa.next_state(state, b);
        if let Some(p) = matched(state) {
            return Run::Match(p);
        }
        if dfa.is_dead_state(state) || dfa.is_quit_state(state) {
            return Run::Dead;
        }
    }
    if at_end {
        let eoi = dfa.next_eoi_state(state);
        return matched(eoi).map_or(Run::Dead, Run::Match);
    }
    Run::Alive
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[(&str, &str, FilterAction)]) -> Arc<ContentFilter> {
        Arc::new(
            ContentFilter::new(
                rules
                    .iter()
                    .map(|(n, p, a)| FilterRule {
                        name: n.to_string(),
                        pattern: p.to_string(),
                        action: *a,
                    })
                    .collect(),
            )
            .expect("compiles"),
        )
    }

    /// Streams `text` in pieces of `step` chars; returns what was released
    /// and the rule that stopped it.
    fn stream(f: &Arc<ContentFilter>, text: &str, step: usize) -> (String, Option<String>) {
        let mut g = FilterGuard::new(Arc::clone(f));
        let mut out = String::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            let r = g.push(&chunk.iter().collect::<String>());
            out.push_str(&r.emit);
            if r.matched.is_some() {
                return (out, r.matched);
            }
        }
        let r = g.finish();
        out.push_str(&r.emit);
        (out, r.matched)
    }

    #[test]
    fn a_stop_rule_never_releases_its_text_however_it_is_split() {
        let f = filter(&[("no-dragons", r"dragons?", FilterAction::Stop)]);
        for step in 1..8 {
            let (out, m) = stream(&f, "Once a big DRAGON flew by.", step);
            assert_eq!(out, "Once a big ", "step {step}");
            assert_eq!(m.as_deref(), Some("no-dragons"));
        }
        // Text that only starts like a match is released once it cannot
        // match, or at the end.
        let (out, m) = stream(&f, "a drag race, then drag", 3);
        assert_eq!((out.as_str(), m), ("a drag race, then drag", None));
    }

    #[test]
    fn word_boundaries_and_the_end_of_the_text_count() {
        let f = filter(&[("cat", r"\bcat\b", FilterAction::Stop)]);
        assert_eq!(stream(&f, "concatenate", 2), ("concatenate".into(), None));
        assert_eq!(stream(&f, "a cat!", 1), ("a ".into(), Some("cat".into())));
        // Matched only because the text ends right after it.
        assert_eq!(stream(&f, "my cat", 1), ("my ".into(), Some("cat".into())));
    }

    #[test]
    fn refuse_rules_find_text_anywhere_and_name_the_rule() {
        let f = filter(&[
            ("secret", r"top\s+secret", FilterAction::Refuse),
            ("stop-only", r"hello", FilterAction::Stop),
        ]);
        assert_eq!(
            f.refused("this is TOP   Secret stuff")
                .map(|r| r.name.as_str()),
            Some("secret")
        );
        assert!(
            f.refused("hello there").is_none(),
            "stop rules do not refuse"
        );
        assert!(f.has_stop_rules());
    }

    #[test]
    fn bad_rules_are_refused_with_their_name() {
        let bad = |rules: Vec<FilterRule>| ContentFilter::new(rules).expect_err("refused");
        let r = |n: &str, p: &str| FilterRule {
            name: n.into(),
            pattern: p.into(),
            action: FilterAction::Stop,
        };
        assert!(bad(vec![r("x", "(")]).contains("rule `x`"));
        assert!(bad(vec![r("x", "a"), r("x", "b")]).contains("named twice"));
        assert!(bad(vec![r("", "a")]).contains("name"));
    }
}
