//! The local brain's readings: the practical reading of a sign's text
//! (quoted, explained from the glossary) and the quick-recall prompt over
//! the kept phrases.

use std::collections::HashSet;

use super::glossary::{fold, glossary_hits};
use super::MAX_QUOTE_CHARS;
use crate::brain::BrainError;

/// Collapses every run of white space to one space and trims the ends.
pub fn normalise_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// At most `max` characters of `text`, ending with `…` when cut.
pub(super) fn snippet(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

/// The practical reading of one sign's text.
pub(super) fn practical_reading(
    origin: &str,
    sign: &str,
    typed: Option<&str>,
    caption: Option<&str>,
    lang: Option<&str>,
) -> String {
    let quoted = snippet(&normalise_whitespace(sign), MAX_QUOTE_CHARS);
    let mut out = format!("{origin}\nThe sign says: \"{quoted}\"\n");
    if let Some(typed) = typed {
        let typed = normalise_whitespace(typed);
        if !typed.eq_ignore_ascii_case(&normalise_whitespace(sign)) {
            out.push_str(&format!(
                "You typed: \"{}\"\n",
                snippet(&typed, MAX_QUOTE_CHARS)
            ));
        }
    }
    if let Some(caption) = caption.map(normalise_whitespace).filter(|c| !c.is_empty()) {
        out.push_str(&format!("Your note: {}\n", snippet(&caption, 200)));
    }
    let hits = glossary_hits(sign);
    if hits.is_empty() {
        out.push_str(
            "\nNone of these words is in my small offline glossary (exits and entrances, \
             no entry, smoking, parking, doors, opening hours, warnings).",
        );
        if let Some(lang) = lang.filter(|l| !l.trim().is_empty()) {
            out.push_str(&format!(" The language was given as {}.", lang.trim()));
        }
        out.push_str(" For a full translation, ask a model seat.\n");
        return out;
    }
    out.push_str("\nWhat it means:\n");
    for entry in &hits {
        out.push_str(&format!(
            "- \"{}\" ({}): {}. {}\n",
            entry.phrase, entry.lang, entry.meaning, entry.tip
        ));
    }
    let keep: Vec<&str> = hits.iter().map(|e| e.phrase).collect();
    out.push_str(&format!("\nWorth keeping: {}\n", keep.join("; ")));
    out
}

/// The quick-recall practice prompt over the kept phrases in `phrases` (one
/// per line; `;` also separates).
pub(super) fn recall_prompt(origin: &str, phrases: &str) -> Result<String, BrainError> {
    let mut seen = HashSet::new();
    let list: Vec<String> = phrases
        .split(['\n', ';'])
        .map(normalise_whitespace)
        .filter(|p| !p.is_empty())
        .filter(|p| seen.insert(fold(p)))
        .collect();
    if list.is_empty() {
        return Err(BrainError(
            "nothing to read: there are no kept phrases to practise".into(),
        ));
    }
    let count = list.len();
    let mut out = format!(
        "{origin}\nQuick recall: {count} phrase{}. For each one, say aloud what it means and \
         where you would see it, then check the answer.\n",
        if count == 1 { "" } else { "s" }
    );
    for (i, phrase) in list.iter().enumerate() {
        let hits = glossary_hits(phrase);
        let answer = if hits.is_empty() {
            "not in the offline glossary; check your notes".to_string()
        } else {
            hits.iter()
                .map(|e| format!("{} ({})", e.meaning, e.lang))
                .collect::<Vec<_>>()
                .join("; ")
        };
        out.push_str(&format!(
            "{}. {} (answer: {answer})\n",
            i + 1,
            snippet(phrase, 200)
        ));
    }
    Ok(out)
}
