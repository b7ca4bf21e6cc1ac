//! Stop strings with hold-back: text that could be the start of a stop string
//! is held until it is resolved, so a stop string is never streamed.

/// What a piece of text did to the stop matcher.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that can be streamed now.
    pub emit: String,
    /// True when a stop string was found: the generation ends; text from the
    /// stop string on is dropped.
    pub stopped: bool,
    /// Which stop string was found (its index in the list), when one was;
    /// the first in the text, and of those starting there the first listed.
    pub matched: Option<usize>,
}

/// Finds stop strings across token boundaries.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (may be empty: then nothing is ever held).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    /// Replaces the stop strings (a `modify`); held text is re-examined on the next push.
    pub fn set_stops(&mut self, stops: Vec<String>) {
        self.stops = stops;
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.push_checking(text, true)
    }

    /// Feeds newly decoded text, matching stop strings only when `check`
    /// (vLLM's `min_tokens`: none ends the text before that many tokens).
    /// Unchecked, all is released but what could begin a stop string, so a
    /// stop string that ends in the first checked text is still found
    /// (from up to its length less one before, as vLLM looks back).
    pub fn push_checking(&mut self, text: &str, check: bool) -> StopOutcome {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return StopOutcome {
                emit: std::mem::take(&mut self.held),
                ..StopOutcome::default()
            };
        }
        let first_match = self
            .stops
            .iter()
            .enumerate()
            .filter(|_| check)
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i)))
            .min();
        if let Some((at, index)) = first_match {
            let emit = self.held[..at].to_string();
            self.held.clear();
            return StopOutcome {
                emit,
                stopped: true,
                matched: Some(index),
            };
        }
        let keep = self.longest_stop_prefix_suffix();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome {
            emit,
            ..StopOutcome::default()
        }
    }

    /// The stop string at `index` (as [`StopOutcome::matched`] names it).
    pub fn stop(&self, index: usize) -> Option<&str> {
        self.stops.get(index).map(String::as_str)
    }

    /// Releases held text at the end of a generation that did not stop on a string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(held.len());
            for len in (best + 1..=max).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start)
                    && stop.as_bytes().starts_with(&held.as_bytes()[start..])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.emit);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces_is_caught_and_never_emitted() {
        assert_eq!(
            run(&["THE END"], &["once", " THE", " E", "ND more"]),
            ("once ".into(), true)
        );
    }

    #[test]
    fn a_false_start_is_released() {
        assert_eq!(run(&["\n\n"], &["a\n", "b", "c"]), ("a\nbc".into(), false));
        assert_eq!(run(&["abc"], &["ab", "ab", "x"]), ("ababx".into(), false));
    }

    #[test]
    fn held_text_is_not_streamed_until_resolved() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("go ST").emit, "go ");
        assert_eq!(m.push("O").emit, "");
        assert_eq!(m.finish(), "STO");
    }

    #[test]
    fn unchecked_text_never_stops_but_a_stop_ending_in_checked_text_does() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        let o = m.push_checking("the END is E", false);
        assert_eq!((o.emit.as_str(), o.stopped), ("the END is ", false));
        let o = m.push_checking("ND", true);
        assert_eq!((o.emit.as_str(), o.stopped), ("", true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push_checking("x", false).emit, "x");
        assert_eq!(m.push_checking("y END", true).emit, "y ");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["c", "ab"], &["xxabc"]), ("xx".into(), true));
    }

    #[test]
    fn the_outcome_names_the_stop_that_matched() {
        let mut m = StopMatcher::new(vec!["c".into(), "ab".into(), "a".into()]);
        let o = m.push("xxa");
        assert_eq!((o.stopped, o.matched), (true, Some(2)));
        // Two stops starting at one place: the first listed.
        let mut m = StopMatcher::new(vec!["zz".into(), "ab".into(), "a".into()]);
        let o = m.push("xxab");
        assert_eq!((o.matched, m.stop(1)), (Some(1), Some("ab")));
        assert_eq!(m.stop(3), None);
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("the E").matched, None, "held, not matched");
        assert_eq!(m.push("ND").matched, Some(0));
    }
}
