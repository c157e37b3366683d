//! Kept phrases (SPEC section 4). A phrase is normalised (Unicode NFKC,
//! lower case, trimmed, runs of white space to one space; 1 to
//! [`PHRASE_MAX_CHARS`] characters) and its mark id is `keep:<phrase>`
//! ([`crate::ids::mark_id`]), so keeping it twice finds the active mark and
//! writes nothing.

use unicode_normalization::UnicodeNormalization;

use super::{answer, refuse, Decision, Plan};
use crate::command::{DropPhrase, KeepPhrase};
use crate::error::EngineError;
use crate::ids::mark_id;
use crate::mirror::Mirror;
use crate::op::{MarkDrop, MarkKeep, OpBody};
use crate::outcome::{Outcome, Replay};

/// Longest normalised phrase, in characters (SPEC section 4).
pub const PHRASE_MAX_CHARS: usize = 200;

/// Why a phrase cannot be kept. Its `Display` is the sentence of the
/// `400 invalid_request` problem body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PhraseError {
    /// Nothing is left once normalised (empty or only white space).
    #[error("the phrase is empty once normalised")]
    Empty,
    /// Longer than [`PHRASE_MAX_CHARS`] characters once normalised.
    #[error("the phrase is {chars} characters once normalised; the limit is {PHRASE_MAX_CHARS}")]
    TooLong {
        /// Its length once normalised, in characters.
        chars: usize,
    },
}

/// Normalises a phrase: NFKC, lower case, trimmed, white space runs to one
/// space.
///
/// # Errors
/// [`PhraseError`] when the result is empty or over [`PHRASE_MAX_CHARS`].
pub fn normalise_phrase(text: &str) -> Result<String, PhraseError> {
    let folded: String = text.nfkc().collect::<String>().to_lowercase();
    let phrase = folded.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars = phrase.chars().count();
    if chars == 0 {
        return Err(PhraseError::Empty);
    }
    if chars > PHRASE_MAX_CHARS {
        return Err(PhraseError::TooLong { chars });
    }
    Ok(phrase)
}

/// `mark.keep`: keeping an active phrase writes nothing.
pub fn decide_keep(mirror: &Mirror, c: KeepPhrase) -> Decision {
    let phrase = match normalise_phrase(&c.phrase) {
        Ok(phrase) => phrase,
        Err(why) => return refuse(EngineError::Invalid(why.to_string())),
    };
    let id = mark_id(&phrase);
    if let Some(mark) = mirror.marks.get(&id).filter(|m| m.active) {
        // Keeping an active phrase again writes nothing.
        return answer(Outcome::PhraseKept {
            created: false,
            replayed: Some(Replay::of(mirror, mark.kept_seq, mark.kept_ts_ms)),
            mark: mark.view(),
        });
    }
    if let Some(moment_id) = c.moment_id {
        if mirror.moment(moment_id).is_none() {
            return refuse(EngineError::MomentNotFound(moment_id));
        }
    }
    Decision::Write(
        vec![OpBody::MarkKeep(MarkKeep {
            id: id.clone(),
            phrase,
            moment_id: c.moment_id,
            device: c.device,
        })],
        Plan::Kept(id),
    )
}

/// `mark.drop`: dropping an inactive mark writes nothing.
pub fn decide_drop(mirror: &Mirror, c: DropPhrase) -> Decision {
    match mirror.marks.get(&c.mark_id) {
        None => refuse(EngineError::Missing(format!("mark {:?}", c.mark_id))),
        Some(mark) if !mark.active => answer(Outcome::PhraseDropped {
            dropped: false,
            mark: mark.view(),
        }),
        Some(_) => Decision::Write(
            vec![OpBody::MarkDrop(MarkDrop {
                id: c.mark_id.clone(),
                device: c.device,
            })],
            Plan::Dropped(c.mark_id),
        ),
    }
}

#[cfg(test)]
mod tests;
