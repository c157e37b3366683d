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

const fn e(
    phrase: &'static str,
    lang: &'static str,
    meaning: &'static str,
    tip: &'static str,
) -> GlossaryEntry {
    GlossaryEntry {
        phrase,
        lang,
        meaning,
        tip,
    }
}

const EMERGENCY: &str = "Keep the way clear; use it only in an emergency.";
const EXIT: &str = "This is the way out.";
const ENTRANCE: &str = "This is the way in.";
const NO_ENTRY: &str = "Don't go in unless you are allowed to.";
const NO_SMOKING: &str = "Don't smoke here (usually e-cigarettes too).";
const NO_PARKING: &str = "Don't park here; you may be towed or fined.";
const KEEP_CLEAR: &str = "Don't park or stand in front of it; vehicles need to get through.";
const PUSH: &str = "Push the door away from you.";
const PULL: &str = "Pull the door towards you.";
const CAUTION: &str = "Look out for a hazard nearby.";
const OPEN: &str = "It is open now.";
const CLOSED: &str = "It is closed now; check the opening hours.";
const OUT_OF_ORDER: &str = "It does not work; find another one.";
const PRIVATE: &str = "Not for the public.";
const TOILETS: &str = "Toilets are this way.";
const PLATFORM: &str = "Trains leave from here; check the number against your ticket.";
const DETOUR: &str = "The usual way is closed; follow the detour signs.";
const ONE_WAY: &str = "Vehicles may only go one way; don't drive against it.";

/// The built-in glossary of common sign phrases.
pub const GLOSSARY: &[GlossaryEntry] = &[
    // Exits and entrances
    e("Notausgang", "German", "emergency exit", EMERGENCY),
    e("Ausgang", "German", "exit", EXIT),
    e("Eingang", "German", "entrance", ENTRANCE),
    e("Sortie de secours", "French", "emergency exit", EMERGENCY),
    e("Sortie", "French", "exit", EXIT),
    e("Entrée", "French", "entrance", ENTRANCE),
    e(
        "Salida de emergencia",
        "Spanish",
        "emergency exit",
        EMERGENCY,
    ),
    e("Salida", "Spanish", "exit", EXIT),
    e("Entrada", "Spanish", "entrance", ENTRANCE),
    e(
        "Uscita di sicurezza",
        "Italian",
        "emergency exit",
        EMERGENCY,
    ),
    e("Uscita", "Italian", "exit", EXIT),
    e("Ingresso", "Italian", "entrance", ENTRANCE),
    e("Nouzový východ", "Czech", "emergency exit", EMERGENCY),
    e("Východ", "Czech", "exit", EXIT),
    e("Vchod", "Czech", "entrance", ENTRANCE),
    e("Запасный выход", "Russian", "emergency exit", EMERGENCY),
    e("Аварийный выход", "Russian", "emergency exit", EMERGENCY),
    e("Выход", "Russian", "exit", EXIT),
    e("Вход", "Russian", "entrance", ENTRANCE),
    e("Emergency exit", "English", "emergency exit", EMERGENCY),
    e("Exit", "English", "exit", EXIT),
    // Keep clear
    e(
        "Ausfahrt freihalten",
        "German",
        "keep the exit clear",
        KEEP_CLEAR,
    ),
    e(
        "Einfahrt freihalten",
        "German",
        "keep the entrance clear",
        KEEP_CLEAR,
    ),
    e("Ausfahrt", "German", "vehicle exit / driveway", KEEP_CLEAR),
    e(
        "Einfahrt",
        "German",
        "vehicle entrance / driveway",
        KEEP_CLEAR,
    ),
    e("Sortie de véhicules", "French", "vehicle exit", KEEP_CLEAR),
    e(
        "Vado permanente",
        "Italian",
        "driveway in constant use",
        KEEP_CLEAR,
    ),
    // No entry
    e("Kein Zutritt", "German", "no entry", NO_ENTRY),
    e("Zutritt verboten", "German", "no entry", NO_ENTRY),
    e(
        "Betreten verboten",
        "German",
        "keep out / no trespassing",
        NO_ENTRY,
    ),
    e("Nur für Personal", "German", "staff only", NO_ENTRY),
    e("Entrée interdite", "French", "no entry", NO_ENTRY),
    e("Accès interdit", "French", "no entry", NO_ENTRY),
    e("Prohibido el paso", "Spanish", "no entry", NO_ENTRY),
    e("Vietato l'accesso", "Italian", "no entry", NO_ENTRY),
    e("Zákaz vstupu", "Czech", "no entry", NO_ENTRY),
    e("Вход воспрещён", "Russian", "no entry", NO_ENTRY),
    e(
        "Посторонним вход воспрещён",
        "Russian",
        "no entry for outsiders / staff only",
        NO_ENTRY,
    ),
    e("No entry", "English", "no entry", NO_ENTRY),
    // No smoking
    e("Rauchen verboten", "German", "no smoking", NO_SMOKING),
    e(
        "Bitte nicht rauchen",
        "German",
        "please don't smoke",
        NO_SMOKING,
    ),
    e("Nichtraucher", "German", "non-smoking", NO_SMOKING),
    e("Défense de fumer", "French", "no smoking", NO_SMOKING),
    e("Interdit de fumer", "French", "no smoking", NO_SMOKING),
    e("Prohibido fumar", "Spanish", "no smoking", NO_SMOKING),
    e("Vietato fumare", "Italian", "no smoking", NO_SMOKING),
    e("Kouření zakázáno", "Czech", "no smoking", NO_SMOKING),
    e("Zákaz kouření", "Czech", "no smoking", NO_SMOKING),
    e("Не курить", "Russian", "no smoking", NO_SMOKING),
    e("Курение запрещено", "Russian", "no smoking", NO_SMOKING),
    e("No smoking", "English", "no smoking", NO_SMOKING),
    // No parking
    e("Parken verboten", "German", "no parking", NO_PARKING),
    e("Halteverbot", "German", "no stopping", NO_PARKING),
    e("Stationnement interdit", "French", "no parking", NO_PARKING),
    e("Prohibido aparcar", "Spanish", "no parking", NO_PARKING),
    e("Prohibido estacionar", "Spanish", "no parking", NO_PARKING),
    e("Divieto di sosta", "Italian", "no parking", NO_PARKING),
    e("Zákaz parkování", "Czech", "no parking", NO_PARKING),
    e("Парковка запрещена", "Russian", "no parking", NO_PARKING),
    e("No parking", "English", "no parking", NO_PARKING),
    // Doors
    e("Drücken", "German", "push", PUSH),
    e("Ziehen", "German", "pull", PULL),
    e("Poussez", "French", "push", PUSH),
    e("Tirez", "French", "pull", PULL),
    e("Empujar", "Spanish", "push", PUSH),
    e("Empuje", "Spanish", "push", PUSH),
    e("Tirar", "Spanish", "pull", PULL),
    e("Spingere", "Italian", "push", PUSH),
    e("Tirare", "Italian", "pull", PULL),
    e("От себя", "Russian", "push", PUSH),
    e("К себе", "Russian", "pull", PULL),
    e("Push", "English", "push", PUSH),
    e("Pull", "English", "pull", PULL),
    // Warnings
    e("Achtung", "German", "attention / caution", CAUTION),
    e("Vorsicht", "German", "caution", CAUTION),
    e(
        "Frisch gestrichen",
        "German",
        "wet paint",
        "Don't touch it.",
    ),
    e(
        "Rutschgefahr",
        "German",
        "slippery surface",
        "Watch your step.",
    ),
    e("Attention", "French", "caution", CAUTION),
    e("Atención", "Spanish", "caution", CAUTION),
    e("Attenzione", "Italian", "caution", CAUTION),
    e("Pozor", "Czech", "caution", CAUTION),
    e("Внимание", "Russian", "attention / caution", CAUTION),
    e("Осторожно", "Russian", "careful", CAUTION),
    // Open, closed, out of order
    e("Geöffnet", "German", "open", OPEN),
    e("Geschlossen", "German", "closed", CLOSED),
    e("Außer Betrieb", "German", "out of order", OUT_OF_ORDER),
    e("Ouvert", "French", "open", OPEN),
    e("Fermé", "French", "closed", CLOSED),
    e("Hors service", "French", "out of order", OUT_OF_ORDER),
    e("Abierto", "Spanish", "open", OPEN),
    e("Cerrado", "Spanish", "closed", CLOSED),
    e("Fuera de servicio", "Spanish", "out of order", OUT_OF_ORDER),
    e("Aperto", "Italian", "open", OPEN),
    e("Chiuso", "Italian", "closed", CLOSED),
    e("Guasto", "Italian", "out of order", OUT_OF_ORDER),
    e("Otevřeno", "Czech", "open", OPEN),
    e("Zavřeno", "Czech", "closed", CLOSED),
    e("Mimo provoz", "Czech", "out of order", OUT_OF_ORDER),
    e("Открыто", "Russian", "open", OPEN),
    e("Закрыто", "Russian", "closed", CLOSED),
    e("Не работает", "Russian", "out of order", OUT_OF_ORDER),
    e("Out of order", "English", "out of order", OUT_OF_ORDER),
    // Private, toilets
    e("Privat", "German", "private", PRIVATE),
    e("Privé", "French", "private", PRIVATE),
    e("Privado", "Spanish", "private", PRIVATE),
    e("Privato", "Italian", "private", PRIVATE),
    e("Soukromé", "Czech", "private", PRIVATE),
    e("Toiletten", "German", "toilets", TOILETS),
    e("Toilettes", "French", "toilets", TOILETS),
    e("Aseos", "Spanish", "toilets", TOILETS),
    e("Bagni", "Italian", "toilets", TOILETS),
    e("Туалет", "Russian", "toilet", TOILETS),
    e("WC", "international", "toilets", TOILETS),
    // Getting around
    e("Gleis", "German", "platform / track", PLATFORM),
    e("Voie", "French", "platform / track", PLATFORM),
    e("Binario", "Italian", "platform", PLATFORM),
    e("Andén", "Spanish", "platform", PLATFORM),
    e("Umleitung", "German", "diversion", DETOUR),
    e("Déviation", "French", "diversion", DETOUR),
    e("Desvío", "Spanish", "diversion", DETOUR),
    e("Deviazione", "Italian", "diversion", DETOUR),
    e("Objížďka", "Czech", "diversion", DETOUR),
    e("Einbahnstraße", "German", "one-way street", ONE_WAY),
    e("Sens unique", "French", "one-way street", ONE_WAY),
    e("Senso unico", "Italian", "one-way street", ONE_WAY),
    e("Baustelle", "German", "road works / building site", CAUTION),
];

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
        let mut all: Vec<_> = GLOSSARY.iter().map(|e| (words(e.phrase), e)).collect();
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
        for entry in GLOSSARY {
            let hits = glossary_hits(entry.phrase);
            assert_eq!(hits.first().map(|h| h.phrase), Some(entry.phrase));
        }
    }
}
