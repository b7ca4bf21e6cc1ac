//! The content-filter file (`--content-filter FILE`): TOML with one
//! `[[rule]]` table per rule (PROTOCOLS.md's common rules).
//!
//! ```toml
//! [[rule]]
//! name = "no-secrets"          # named in errors and metrics, never the text
//! pattern = "top\\s+secret"    # a regular expression, case-insensitive
//! action = "refuse"            # refuse the prompt before any compute
//!
//! [[rule]]
//! name = "no-dragons"
//! pattern = "\\bdragons?\\b"
//! action = "stop"              # end the generation before the text
//! ```

use std::path::Path;

use serde::Deserialize;
use tokenwire_core::filter::{ContentFilter, FilterAction, FilterRule};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterFile {
    #[serde(default)]
    rule: Vec<RuleEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    name: String,
    pattern: String,
    action: String,
}

/// Reads and compiles the rules file at `path`; the error names the file,
/// and the rule and what is wrong with it.
pub fn load(path: &Path) -> Result<ContentFilter, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the content-filter file {}: {e}",
            path.display()
        )
    })?;
    parse(&text).map_err(|e| format!("content-filter file {}: {e}", path.display()))
}

/// Parses and compiles a rules file's text.
pub fn parse(text: &str) -> Result<ContentFilter, String> {
    let file: FilterFile =
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    if file.rule.is_empty() {
        return Err("no [[rule]] tables: the file must list at least one rule".into());
    }
    let rules = file
        .rule
        .into_iter()
        .map(|r| {
            let action = match r.action.as_str() {
                "refuse" => FilterAction::Refuse,
                "stop" => FilterAction::Stop,
                other => {
                    return Err(format!(
                        "rule `{}`: `action` must be \"refuse\" or \"stop\", got \"{other}\"",
                        r.name
                    ))
                }
            };
            Ok(FilterRule {
                name: r.name,
                pattern: r.pattern,
                action,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    ContentFilter::new(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rules_file_compiles_and_bad_ones_name_the_problem() {
        let f = parse(
            "[[rule]]\nname = \"s\"\npattern = \"top\\\\s+secret\"\naction = \"refuse\"\n\n\
             [[rule]]\nname = \"d\"\npattern = \"dragon\"\naction = \"stop\"\n",
        )
        .expect("parses");
        assert_eq!(f.rules().len(), 2);
        assert_eq!(f.refused("Top  SECRET").map(|r| r.name.as_str()), Some("s"));
        assert!(f.has_stop_rules());
        let bad = |t: &str| parse(t).expect_err("refused");
        assert!(bad("").contains("at least one rule"));
        assert!(
            bad("[[rule]]\nname = \"x\"\npattern = \"a\"\naction = \"drop\"\n")
                .contains("rule `x`")
        );
        assert!(
            bad("[[rule]]\nname = \"x\"\npattern = \"(\"\naction = \"stop\"\n")
                .contains("rule `x`")
        );
        assert!(
            bad("[[rule]]\nname = \"x\"\npattern = \"a\"\naction = \"stop\"\ncolour = 1\n")
                .contains("colour")
        );
    }
}
