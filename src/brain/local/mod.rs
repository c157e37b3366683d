//! The `local` brain: offline, no model (DESIGN.md "Brains").
//!
//! It reads the text off the moment's copy with Tesseract OCR when the
//! `tesseract` program is installed and the copy was uploaded (source `ocr`),
//! and otherwise works from the moment's text (source `text`). The reading is
//! deterministic: it quotes what the sign says (white space normalised) and
//! explains the common sign phrases it recognises from a small built-in
//! glossary (German, French, Spanish, Italian, Czech, Russian, English). In
//! `recall` mode it turns the moment's text (one kept phrase per line) into a
//! short practice prompt instead.
//!
//! The first line of every reading says what it was made from, and why OCR
//! was not used when it was not.
//!
//! - `glossary`: the built-in sign phrases and how text is matched.
//! - `reading`: the practical reading and the recall prompt.
//! - `tesseract`: running the OCR program under supervision.

mod glossary;
mod reading;
mod tesseract;

use std::path::PathBuf;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{millis, Brain, BrainAnswer, BrainError, BrainRequest, CopyImage};
pub use glossary::{glossary, glossary_hits, GlossaryEntry};
pub use reading::normalise_whitespace;
use reading::{practical_reading, recall_prompt};
pub use tesseract::find_on_path;

/// The adapter name the local brain puts on its answers.
pub const ADAPTER: &str = "local";

/// The default time one `tesseract` run may take, in milliseconds.
pub const DEFAULT_OCR_TIMEOUT_MS: u64 = 30_000;

/// The most characters of the sign's text quoted in a reading; longer text is
/// cut at this many characters and ends with `…`.
pub const MAX_QUOTE_CHARS: usize = 600;

/// Settings of the `local` adapter (`adapter = "local"` in a
/// `[[brains.seats]]` block). Every field is optional.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// The `tesseract` program. `None` (the default) looks for `tesseract` on
    /// `PATH`; when it is not found (or this path does not exist) the brain
    /// works from the moment's text.
    pub tesseract_path: Option<PathBuf>,
    /// Tesseract language(s), passed as `-l`, e.g. `deu+fra+eng`. `None` uses
    /// Tesseract's default (`eng`). The languages must be installed.
    pub ocr_lang: Option<String>,
    /// The most time one OCR run may take, in milliseconds (default
    /// [`DEFAULT_OCR_TIMEOUT_MS`]). A run over time is killed and the brain
    /// falls back to the moment's text (or fails when there is none).
    pub timeout_ms: u64,
    /// Whether to try OCR at all (default `true`). `false` always works from
    /// the moment's text.
    pub ocr: bool,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            tesseract_path: None,
            ocr_lang: None,
            timeout_ms: DEFAULT_OCR_TIMEOUT_MS,
            ocr: true,
        }
    }
}

/// The offline brain. Cheap to create; it looks for `tesseract` on every call,
/// so installing it later takes effect without a restart.
#[derive(Clone, Debug)]
pub struct LocalBrain {
    config: LocalConfig,
}

impl LocalBrain {
    /// A local brain with these settings.
    pub fn new(config: LocalConfig) -> Self {
        LocalBrain { config }
    }

    /// The settings this brain was made with.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// The `tesseract` program this brain would run now: the configured path
    /// if it is a file, else `tesseract` found on `PATH`; `Err` says why there
    /// is none (for the reading's first line).
    pub fn tesseract_program(&self) -> Result<PathBuf, String> {
        match &self.config.tesseract_path {
            Some(path) if path.is_file() => Ok(path.clone()),
            Some(path) => Err(format!("tesseract not found at {}", path.display())),
            None => find_on_path("tesseract").ok_or_else(|| "tesseract is not installed".into()),
        }
    }

    async fn answer(&self, request: BrainRequest) -> Result<BrainAnswer, BrainError> {
        let typed = request
            .moment_text
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let recall = request.mode == "recall";

        // Decide what to read: OCR of the copy if possible, else the text.
        let (ocr_text, why_not_ocr) = match self.read_copy(&request).await {
            Ok(text) => (Some(text), None),
            Err(why) => (None, Some(why)),
        };

        let (source, body, origin) = match (ocr_text, typed) {
            (Some(text), _) => (
                "ocr",
                text,
                "Read off the photo with OCR (tesseract).".to_string(),
            ),
            (None, Some(text)) => (
                "text",
                text.to_string(),
                format!(
                    "Worked from the moment's text ({}).",
                    why_not_ocr.as_deref().unwrap_or("no OCR")
                ),
            ),
            (None, None) => {
                let why = why_not_ocr.unwrap_or_default();
                return Err(BrainError(format!(
                    "nothing to read: the moment has no text and no text could be read off a photo ({why})"
                )));
            }
        };

        let text = if recall {
            recall_prompt(&origin, &body)?
        } else {
            practical_reading(
                &origin,
                &body,
                typed.filter(|_| source == "ocr"),
                request.caption.as_deref(),
                request.lang.as_deref(),
            )
        };
        Ok(BrainAnswer {
            text,
            adapter: ADAPTER.into(),
            source: source.into(),
        })
    }

    /// The text OCR reads off the moment's copies, in photo order (the
    /// texts of several photos one after the other, a blank line between),
    /// or why there is none (no copy, OCR off, no `tesseract`, failed or
    /// empty runs), as the reading's first line says it. A photo whose run
    /// fails or finds nothing is left out while another one reads.
    async fn read_copy(&self, request: &BrainRequest) -> Result<String, String> {
        let copies: Vec<&CopyImage> = request
            .copies
            .iter()
            .filter(|c| !c.bytes.is_empty())
            .collect();
        if copies.is_empty() {
            return Err(if request.copies.is_empty() {
                "no photo was uploaded".into()
            } else {
                "the uploaded photo is empty".into()
            });
        }
        if !self.config.ocr {
            return Err("OCR is switched off".into());
        }
        let program = self.tesseract_program()?;
        let mut texts = Vec::new();
        let mut first_failure = None;
        for copy in copies {
            let read = tesseract::run_ocr(
                &program,
                self.config.ocr_lang.as_deref(),
                millis(self.config.timeout_ms),
                &copy.bytes,
                Some(copy.content_type.as_str()),
            )
            .await;
            match read {
                Ok(text) if !text.trim().is_empty() => texts.push(text.trim_end().to_owned()),
                Ok(_) => {
                    first_failure.get_or_insert_with(|| "OCR found no text in the photo".into());
                }
                Err(why) => {
                    first_failure.get_or_insert(why);
                }
            }
        }
        if texts.is_empty() {
            return Err(first_failure.unwrap_or_default());
        }
        Ok(texts.join("\n\n"))
    }
}

impl Brain for LocalBrain {
    fn read(&self, request: BrainRequest) -> BoxFuture<'_, Result<BrainAnswer, BrainError>> {
        Box::pin(self.answer(request))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn copy(bytes: Vec<u8>) -> CopyImage {
        CopyImage {
            bytes,
            content_type: "image/png".into(),
        }
    }

    fn request(text: Option<&str>, mode: &str) -> BrainRequest {
        BrainRequest {
            moment_text: text.map(Into::into),
            mode: mode.into(),
            ..BrainRequest::default()
        }
    }

    #[tokio::test]
    async fn text_reading_quotes_and_explains() {
        let brain = LocalBrain::new(LocalConfig::default());
        let answer = brain
            .read(request(
                Some("  Bitte   nicht rauchen\n PUSH "),
                "practical",
            ))
            .await
            .unwrap();
        assert_eq!(answer.adapter, "local");
        assert_eq!(answer.source, "text");
        assert!(answer
            .text
            .starts_with("Worked from the moment's text (no photo was uploaded)."));
        assert!(answer
            .text
            .contains("The sign says: \"Bitte nicht rauchen PUSH\""));
        assert!(answer.text.contains("please don't smoke"));
        assert!(answer.text.contains("\"Push\" (English): push"));
        // Deterministic.
        let again = brain
            .read(request(
                Some("  Bitte   nicht rauchen\n PUSH "),
                "practical",
            ))
            .await
            .unwrap();
        assert_eq!(answer, again);
    }

    #[tokio::test]
    async fn unknown_words_say_so() {
        let brain = LocalBrain::new(LocalConfig::default());
        let mut req = request(Some("Schöne Aussicht"), "practical");
        req.lang = Some("de".into());
        let answer = brain.read(req).await.unwrap();
        assert!(answer
            .text
            .contains("None of these words is in my small offline glossary"));
        assert!(answer.text.contains("given as de"));
    }

    #[tokio::test]
    async fn recall_lists_the_phrases() {
        let brain = LocalBrain::new(LocalConfig::default());
        let answer = brain
            .read(request(
                Some("Notausgang\nzákaz vstupu\n\nNOTAUSGANG\nSchöne Aussicht"),
                "recall",
            ))
            .await
            .unwrap();
        assert!(
            answer.text.contains("Quick recall: 3 phrases."),
            "{}",
            answer.text
        );
        assert!(answer
            .text
            .contains("1. Notausgang (answer: emergency exit (German))"));
        assert!(answer
            .text
            .contains("2. zákaz vstupu (answer: no entry (Czech))"));
        assert!(answer
            .text
            .contains("3. Schöne Aussicht (answer: not in the offline glossary"));
    }

    #[tokio::test]
    async fn nothing_to_read_is_an_error() {
        let brain = LocalBrain::new(LocalConfig::default());
        let err = brain
            .read(request(Some("  \n "), "practical"))
            .await
            .unwrap_err();
        assert!(err.0.contains("nothing to read"), "{err}");
        let err = brain.read(request(None, "recall")).await.unwrap_err();
        assert!(err.0.contains("nothing to read"), "{err}");
    }

    #[tokio::test]
    async fn ocr_switched_off_uses_text() {
        let brain = LocalBrain::new(LocalConfig {
            ocr: false,
            ..LocalConfig::default()
        });
        let mut req = request(Some("Kein Zutritt"), "practical");
        req.copies = vec![copy(vec![1, 2, 3])];
        let answer = brain.read(req).await.unwrap();
        assert_eq!(answer.source, "text");
        assert!(answer.text.contains("OCR is switched off"));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn slow_ocr_is_killed_and_falls_back() {
        let dir = std::env::temp_dir().join(format!("spark-fake-tess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("tesseract");
        // Would answer after a minute; killed at 200 ms.
        std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let brain = LocalBrain::new(LocalConfig {
            tesseract_path: Some(script.clone()),
            timeout_ms: 200,
            ..LocalConfig::default()
        });
        let mut req = request(Some("Ausgang"), "practical");
        req.copies = vec![copy(vec![0x89, b'P', b'N', b'G'])];
        let started = Instant::now();
        let answer = brain.read(req.clone()).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(answer.source, "text");
        assert!(
            answer.text.contains("OCR timed out after 200 ms"),
            "{}",
            answer.text
        );
        req.moment_text = None;
        let err = brain.read(req).await.unwrap_err();
        assert!(err.0.contains("timed out"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn failing_ocr_reports_why() {
        let dir = std::env::temp_dir().join(format!("spark-bad-tess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("tesseract");
        std::fs::write(&script, "#!/bin/sh\necho 'Error: bad image' >&2\nexit 1\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let brain = LocalBrain::new(LocalConfig {
            tesseract_path: Some(script),
            ..LocalConfig::default()
        });
        let mut req = request(None, "practical");
        req.copies = vec![copy(vec![1])];
        let err = brain.read(req).await.unwrap_err();
        assert!(err.0.contains("nothing to read"), "{err}");
        assert!(err.0.contains("bad image"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
