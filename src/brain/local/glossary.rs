//! The local brain's built-in glossary of common sign phrases (German,
//! French, Spanish, Italian, Czech, Russian, English), and how a text is
//! matched against it: whole words, case and common diacritics ignored,
//! the longest phrase first.

use std::sync::OnceLock;

/// One known sign phrase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlossaryEntry {
    /// The phrase as usually written, e.g. `Notausgang`.
    pub phrase: &'static str,
    /// The language's English name, e.g. `German`.
    pub lang: &'static str,
    /// What it means, in English, e.g. `emergency exit`.
    pub meaning: &'static str,
    /// What to do about it, one sentence.
    pub tip: &'static str,
}

/// The glossary's text (`glossary.tsv` beside this file): `tip` lines name
/// a tip once, every other line is an entry naming its tip.
const GLOSSARY_TSV: &str = include_str!("glossary.tsv");

/// Reads [`GLOSSARY_TSV`]: its entries in file order.
///
/// # Errors
/// A sentence naming the line (1-based) that is not a tip line or an entry
/// of four fields, or whose tip name is not defined above it.
fn parse_glossary(text: &'static str) -> Result<Vec<GlossaryEntry>, String> {
    let mut tips: Vec<(&str, &'static str)> = Vec::new();
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split('\t').collect::<Vec<_>>()[..] {
            ["tip", name, tip] => tips.push((name, tip)),
            [phrase, lang, meaning, tip_name] => {
                let tip = tips
                    .iter()
                    .find(|(name, _)| *name == tip_name)
                    .map(|(_, tip)| *tip)
                    .ok_or_else(|| {
                        format!("glossary.tsv line {number}: no tip named {tip_name:?} above it")
                    })?;
                entries.push(GlossaryEntry {
                    phrase,
                    lang,
                    meaning,
                    tip,
                });
            }
            _ => {
                let why = "neither `tip NAME TEXT` nor four tab-separated fields";
                return Err(format!("glossary.tsv line {number}: {why}"));
            }
        }
    }
    Ok(entries)
}

/// The built-in glossary of common sign phrases, in file order.
pub fn glossary() -> &'static [GlossaryEntry] {
    static ENTRIES: OnceLock<Vec<GlossaryEntry>> = OnceLock::new();
    // The file is part of the binary and a unit test reads it whole, so a
    // bad line is a build that never passed its tests.
    ENTRIES.get_or_init(|| parse_glossary(GLOSSARY_TSV).expect("the built-in glossary.tsv parses"))
}

/// Lower-cases and strips common diacritics, so that OCR output without
/// accents (`Zakaz vstupu`) still matches (`Zákaz vstupu`).
pub(super) fn fold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().flat_map(char::to_lowercase) {
        match c {
            'ä' | 'á' | 'à' | 'â' | 'ã' | 'å' | 'ą' => out.push('a'),
            'é' | 'è' | 'ê' | 'ë' | 'ě' | 'ę' => out.push('e'),
            'í' | 'ì' | 'î' | 'ï' => out.push('i'),
            'ö' | 'ó' | 'ò' | 'ô' | 'õ' => out.push('o'),
            'ü' | 'ú' | 'ù' | 'û' | 'ů' => out.push('u'),
            'ý' | 'ÿ' => out.push('y'),
            'ç' | 'č' | 'ć' => out.push('c'),
            'ñ' | 'ň' | 'ń' => out.push('n'),
            'ř' => out.push('r'),
            'š' | 'ś' => out.push('s'),
            'ž' | 'ź' | 'ż' => out.push('z'),
            'ť' => out.push('t'),
            'ď' => out.push('d'),
            'ł' => out.push('l'),
            'ß' => out.push_str("ss"),
            'œ' => out.push_str("oe"),
            'ё' => out.push('е'),
            'й' => out.push('и'),
            other => out.push(other),
        }
    }
    out
}

/// The folded words of `text`, split at everything that is not a letter or
/// digit.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(fold)
        .collect()
}

/// The glossary's phrases as folded words, longest first.
fn glossary_words() -> &'static [(Vec<String>, &'static GlossaryEntry)] {
    static WORDS: OnceLock<Vec<(Vec<String>, &'static GlossaryEntry)>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let mut all: Vec<_> = glossary().iter().map(|e| (words(e.phrase), e)).collect();
        all.sort_by_key(|(words, _)| std::cmp::Reverse(words.len()));
        all
    })
}

/// The glossary entries found in `text`, in the order they appear, each once.
/// Matching is on whole words, ignores case and common diacritics, and
/// prefers the longest phrase at each place (`Notausgang` over `Ausgang`,
/// `Sortie de secours` over `Sortie`).
pub fn glossary_hits(text: &str) -> Vec<&'static GlossaryEntry> {
    let text_words = words(text);
    let mut hits: Vec<&'static GlossaryEntry> = Vec::new();
    let mut i = 0;
    while i < text_words.len() {
        let found = glossary_words().iter().find(|(phrase, _)| {
            !phrase.is_empty()
                && text_words.len() - i >= phrase.len()
                && text_words[i..i + phrase.len()] == phrase[..]
        });
        match found {
            Some((phrase, entry)) => {
                if !hits.iter().any(|h| std::ptr::eq(*h, *entry)) {
                    hits.push(entry);
                }
                i += phrase.len();
            }
            None => i += 1,
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_glossary_line_is_named() {
        let error = parse_glossary("tip\tA\tDo it.\nx\tGerman\tx\tB\n").unwrap_err();
        assert!(
            error.contains("line 2") && error.contains("\"B\""),
            "{error}"
        );
        let error = parse_glossary("# c\n\nonly two\tfields\n").unwrap_err();
        assert!(error.contains("line 3"), "{error}");
        let entries = parse_glossary("tip\tA\tDo it.\nHalt\tGerman\tstop\tA\n").unwrap();
        assert_eq!(
            entries,
            [GlossaryEntry {
                phrase: "Halt",
                lang: "German",
                meaning: "stop",
                tip: "Do it.",
            }]
        );
    }

    #[test]
    fn glossary_matches_whole_words_longest_first() {
        let hits = glossary_hits("NOTAUSGANG  –  bitte\nAusfahrt   freihalten!");
        let phrases: Vec<_> = hits.iter().map(|h| h.phrase).collect();
        assert_eq!(phrases, ["Notausgang", "Ausfahrt freihalten"]);
        let hits = glossary_hits("Sortie de secours");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].meaning, "emergency exit");
        assert!(glossary_hits("PUSHED").is_empty());
    }

    #[test]
    fn glossary_ignores_case_and_diacritics() {
        assert_eq!(glossary_hits("ZAKAZ VSTUPU")[0].phrase, "Zákaz vstupu");
        assert_eq!(
            glossary_hits("stationnement INTERDIT")[0].meaning,
            "no parking"
        );
        assert_eq!(glossary_hits("ВЫХОД")[0].meaning, "exit");
        assert_eq!(glossary_hits("Ausser Betrieb")[0].meaning, "out of order");
    }

    #[test]
    fn every_glossary_phrase_finds_itself() {
        assert!(glossary().len() > 100, "{} entries", glossary().len());
        for entry in glossary() {
            let hits = glossary_hits(entry.phrase);
            assert_eq!(hits.first().map(|h| h.phrase), Some(entry.phrase));
        }
    }
}
