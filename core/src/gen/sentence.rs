//! Sentence segmentation of streamed text, for dialects that tell a client
//! where sentences end (`cai`'s `SENTENCE_BOUNDARY`, a text-to-speech pace).
//!
//! A sentence ends at terminal punctuation (`.`, `!`, `?`, `…` and their
//! full-width forms), with any closing quotes or brackets after it, when
//! whitespace or the end of the text follows; CJK full stops (`。！？`) end a
//! sentence by themselves. A `.` never ends one inside a number (`3.14`)
//! or after a common abbreviation (`e.g.`, `Dr.`) or a single-letter
//! initial (`J. Smith`, `U.S.`). Text is pushed in pieces as generated; a
//! sentence is released as soon as the character after it shows that it ended.
//!
//! Each sentence carries the whitespace that came before it, so the
//! sentences and the remainder [`SentenceSplitter::finish`] flushes
//! concatenate to exactly the text pushed without its trailing whitespace.

/// Lowercase words whose `.` does not end a sentence.
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "no", "fig", "approx", "dept", "inc",
    "ltd", "co", "mt", "cf", "al",
];

fn is_terminal(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '…' | '！' | '？' | '．')
}

/// Ends a sentence with nothing after it (CJK).
fn is_self_terminal(c: char) -> bool {
    matches!(c, '。' | '！' | '？')
}

fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | ')' | ']' | '}' | '”' | '’' | '»' | '」' | '』'
    )
}

/// What a scan of pending text found.
enum Scan {
    /// A sentence ends just before this byte.
    Boundary(usize),
    /// None yet; the next scan may start at this byte.
    Wait(usize),
}

/// Looks for the first sentence end in `text` from byte `from` on.
fn scan(text: &str, from: usize) -> Scan {
    let mut it = text[from..]
        .char_indices()
        .map(|(i, c)| (i + from, c))
        .peekable();
    while let Some((i, c)) = it.next() {
        let self_terminal = is_self_terminal(c);
        if !self_terminal && !is_terminal(c) {
            continue;
        }
        // What may follow the mark before we know: closers, and after an
        // ordinary terminal more terminals (`?!`, `...`).
        while let Some(&(_, n)) = it.peek() {
            if is_closer(n) || (!self_terminal && is_terminal(n)) {
                it.next();
            } else {
                break;
            }
        }
        let Some(&(after_at, after)) = it.peek() else {
            // What follows decides; wait for it.
            return Scan::Wait(i);
        };
        if self_terminal {
            return Scan::Boundary(after_at);
        }
        if after.is_whitespace() && !(c == '.' && abbreviation_before(text, i)) {
            return Scan::Boundary(after_at);
        }
    }
    Scan::Wait(text.len())
}

/// True when the word ending at byte `dot` of `text` is an abbreviation or
/// an initial.
fn abbreviation_before(text: &str, dot: usize) -> bool {
    let word: String = text[..dot]
        .chars()
        .rev()
        .take_while(|c| c.is_alphabetic())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if word.is_empty() {
        return false;
    }
    if word.chars().count() == 1 {
        return true;
    }
    let lower = word.to_lowercase();
    ABBREVIATIONS.contains(&lower.as_str())
}

/// Splits streamed text into sentences.
#[derive(Debug, Clone, Default)]
pub struct SentenceSplitter {
    /// Text not yet released as a sentence.
    pending: String,
    /// Bytes of `pending` already scanned (no boundary before them).
    scanned: usize,
}

impl SentenceSplitter {
    /// A splitter with nothing pushed.
    pub fn new() -> SentenceSplitter {
        SentenceSplitter::default()
    }

    /// Adds generated text; returns the sentences it completed, in order.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while let Some(end) = self.next_boundary() {
            let rest = self.pending.split_off(end);
            out.push(std::mem::replace(&mut self.pending, rest));
            self.scanned = 0;
        }
        out
    }

    /// The text left at the end (the last sentence, which may lack terminal
    /// punctuation) without trailing whitespace, or `None` when only
    /// whitespace is left.
    pub fn finish(&mut self) -> Option<String> {
        let mut rest = std::mem::take(&mut self.pending);
        self.scanned = 0;
        rest.truncate(rest.trim_end().len());
        (!rest.is_empty()).then_some(rest)
    }

    /// The byte offset just after the first sentence that `pending` shows
    /// complete, scanning from `scanned` on. Each byte is scanned once
    /// (plus the lookahead at a terminal, and the word before a `.`), so a
    /// long reply costs linear time however it is pushed.
    fn next_boundary(&mut self) -> Option<usize> {
        match scan(&self.pending, self.scanned) {
            Scan::Boundary(at) => Some(at),
            Scan::Wait(from) => {
                self.scanned = from;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<String> {
        let mut s = SentenceSplitter::new();
        let mut out = s.push(text);
        out.extend(s.finish());
        out
    }

    #[test]
    fn sentences_end_at_punctuation_before_whitespace() {
        assert_eq!(
            split("Hi there. How are you? Fine!"),
            ["Hi there.", " How are you?", " Fine!"]
        );
        assert_eq!(
            split("He said \"stop.\" Then left."),
            ["He said \"stop.\"", " Then left."]
        );
        assert_eq!(
            split("Wait... what?! Yes."),
            ["Wait...", " what?!", " Yes."]
        );
        assert_eq!(split("no punctuation at all"), ["no punctuation at all"]);
        assert_eq!(split("你好。再见！"), ["你好。", "再见！"]);
    }

    #[test]
    fn numbers_abbreviations_and_initials_do_not_end_sentences() {
        assert_eq!(
            split("Pi is 3.14 today. Next."),
            ["Pi is 3.14 today.", " Next."]
        );
        assert_eq!(
            split("Use tools, e.g. a hammer. Done."),
            ["Use tools, e.g. a hammer.", " Done."]
        );
        assert_eq!(
            split("Dr. Who met J. Smith in the U.S. Army. End."),
            ["Dr. Who met J. Smith in the U.S. Army.", " End."]
        );
        assert_eq!(
            split("It cost $3. Then more."),
            ["It cost $3.", " Then more."]
        );
    }

    #[test]
    fn streaming_releases_a_sentence_once_what_follows_is_seen() {
        let mut s = SentenceSplitter::new();
        assert!(s.push("One").is_empty());
        assert!(
            s.push(".").is_empty(),
            "3.14 or a sentence end: not known yet"
        );
        assert_eq!(s.push(" Tw"), ["One."]);
        assert!(s.push("o").is_empty());
        assert_eq!(s.finish().as_deref(), Some(" Two"));
        let mut s = SentenceSplitter::new();
        assert!(s.push("Done. ").len() == 1);
        assert_eq!(s.finish(), None, "only whitespace left");
    }

    #[test]
    fn any_split_of_the_text_gives_the_same_sentences_and_they_concatenate_back() {
        let texts = [
            "Hi there. How are you? Fine! Pi is 3.14, e.g. twice. \"Yes.\" Done",
            "A. B. C. Mr. X went home... Later!? Yes.  Two spaces.\nNew line. 終わり。次",
        ];
        for text in texts {
            let whole = split(text);
            assert_eq!(whole.concat(), text.trim_end());
            let chars: Vec<char> = text.chars().collect();
            for step in 1..6 {
                let mut s = SentenceSplitter::new();
                let mut got = Vec::new();
                for piece in chars.chunks(step) {
                    got.extend(s.push(&piece.iter().collect::<String>()));
                }
                got.extend(s.finish());
                assert_eq!(got, whole, "pieces of {step} chars");
            }
        }
    }
}
