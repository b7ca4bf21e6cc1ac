//! Property tests of sentence segmentation: however the generated text is cut
//! into pieces, the same sentences come out, and they concatenate back to the
//! text (less trailing whitespace nothing followed).

use proptest::prelude::*;
use tokenwire_core::gen::sentence::SentenceSplitter;

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a", "B", "word", " ", "  ", "\n", ".", "!", "?", "...", "3", "14", "e.g.", "Dr.",
            "\"", ")", "。", "中", "…", "ü",
        ]),
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

fn run(pieces: &[String]) -> Vec<String> {
    let mut s = SentenceSplitter::new();
    let mut out: Vec<String> = pieces.iter().flat_map(|p| s.push(p)).collect();
    out.extend(s.finish());
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn pieces_do_not_change_the_sentences(t in text(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let chars: Vec<char> = t.chars().collect();
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(chars.len() + 1)).collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut prev = 0;
        for a in at.into_iter().chain([chars.len()]) {
            pieces.push(chars[prev..a].iter().collect::<String>());
            prev = a;
        }
        let whole = run(std::slice::from_ref(&t));
        prop_assert_eq!(run(&pieces), whole.clone());
        let joined = whole.concat();
        prop_assert_eq!(joined.as_str(), t.trim_end(), "the sentences are the text without its trailing whitespace");
        for s in &whole {
            prop_assert!(!s.trim().is_empty(), "an empty sentence in {:?}", whole);
        }
    }
}
