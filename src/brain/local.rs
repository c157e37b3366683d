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

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{millis, Brain, BrainAnswer, BrainError, BrainRequest};

/// The adapter name the local brain puts on its answers.
pub const ADAPTER: &str = "local";

/// The default time one `tesseract` run may take, in milliseconds.
pub const DEFAULT_OCR_TIMEOUT_MS: u64 = 30_000;

/// The most characters of the sign's text quoted in a reading; longer text is
/// cut at this many characters and ends with `…`.
pub const MAX_QUOTE_CHARS: usize = 600;

/// The most bytes of `tesseract` output read (1 MiB); the rest is ignored.
const MAX_OCR_OUTPUT_BYTES: u64 = 1 << 20;

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
        let mut why_not_ocr: Option<String> = None;
        let mut ocr_text: Option<String> = None;
        match request.copy.as_deref() {
            None => why_not_ocr = Some("no photo was uploaded".into()),
            Some([]) => why_not_ocr = Some("the uploaded photo is empty".into()),
            Some(_) if !self.config.ocr => why_not_ocr = Some("OCR is switched off".into()),
            Some(bytes) => match self.tesseract_program() {
                Err(why) => why_not_ocr = Some(why),
                Ok(program) => {
                    match self
                        .run_ocr(&program, bytes, request.copy_content_type.as_deref())
                        .await
                    {
                        Ok(text) if text.trim().is_empty() => {
                            why_not_ocr = Some("OCR found no text in the photo".into())
                        }
                        Ok(text) => ocr_text = Some(text),
                        Err(why) => why_not_ocr = Some(why),
                    }
                }
            },
        }

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

    /// Runs `tesseract <file> stdout [-l lang]` on the bytes and returns what
    /// it printed, or why it failed.
    async fn run_ocr(
        &self,
        program: &Path,
        bytes: &[u8],
        content_type: Option<&str>,
    ) -> Result<String, String> {
        let file = TempImage::write(bytes, content_type)
            .await
            .map_err(|e| format!("could not write the photo for OCR: {e}"))?;
        let mut command = Command::new(program);
        command
            .arg(file.path())
            .arg("stdout")
            .env("OMP_THREAD_LIMIT", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(lang) = self.config.ocr_lang.as_deref().filter(|l| !l.is_empty()) {
            command.arg("-l").arg(lang);
        }
        let timeout = millis(self.config.timeout_ms);
        let output = run_with_timeout(command, timeout).await?;
        drop(file);
        if !output.success {
            let err = String::from_utf8_lossy(&output.stderr);
            return Err(format!(
                "OCR failed ({}): {}",
                output.status,
                snippet(&normalise_whitespace(&err), 200)
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Brain for LocalBrain {
    fn read(&self, request: BrainRequest) -> BoxFuture<'_, Result<BrainAnswer, BrainError>> {
        Box::pin(self.answer(request))
    }
}

// ---------------------------------------------------------------------------
// Running tesseract

/// The outcome of a finished child process.
struct Finished {
    success: bool,
    status: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Kills (and reaps) the child if the future running it is dropped early,
/// e.g. by the engine's timeout.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                std::thread::spawn(move || {
                    let _ = child.wait();
                });
            }
        }
    }
}

/// Spawns the command, collects its output and waits at most `timeout`;
/// kills it when over time.
async fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<Finished, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut guard = ChildGuard(Some(child));
    let read_out = tokio::task::spawn_blocking(move || read_all(stdout));
    let read_err = tokio::task::spawn_blocking(move || read_all(stderr));

    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    let status = loop {
        let Some(child) = guard.0.as_mut() else {
            return Err("OCR process vanished".into());
        };
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("could not wait for {program}: {e}")),
        }
        if started.elapsed() >= timeout {
            drop(guard); // kills it
            return Err(format!(
                "OCR timed out after {} ms and was stopped",
                timeout.as_millis()
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    guard.0 = None;
    let stdout = read_out.await.unwrap_or_default();
    let stderr = read_err.await.unwrap_or_default();
    Ok(Finished {
        success: status.success(),
        status: status.to_string(),
        stdout,
        stderr,
    })
}

fn read_all<R: Read>(pipe: Option<R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(pipe) = pipe {
        let _ = pipe.take(MAX_OCR_OUTPUT_BYTES).read_to_end(&mut buf);
    }
    buf
}

/// A uniquely named file in the temp directory, removed on drop.
struct TempImage(PathBuf);

impl TempImage {
    async fn write(bytes: &[u8], content_type: Option<&str>) -> std::io::Result<TempImage> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let ext = match content_type.map(|c| c.trim().to_ascii_lowercase()) {
            Some(c) if c.starts_with("image/png") => "png",
            Some(c) if c.starts_with("image/jpeg") || c.starts_with("image/jpg") => "jpg",
            Some(c) if c.starts_with("image/webp") => "webp",
            Some(c) if c.starts_with("image/gif") => "gif",
            Some(c) if c.starts_with("image/tiff") => "tif",
            _ => "img",
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "spark-ocr-{}-{}-{nanos}.{ext}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        let image = TempImage(path);
        tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await?;
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        Ok(image)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Finds an executable file called `name` in the directories of `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for candidate in [dir.join(name), dir.join(format!("{name}.exe"))] {
            if is_executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

// ---------------------------------------------------------------------------
// Readings

/// Collapses every run of white space to one space and trims the ends.
pub fn normalise_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// At most `max` characters of `text`, ending with `…` when cut.
fn snippet(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

/// The practical reading of one sign's text.
fn practical_reading(
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
fn recall_prompt(origin: &str, phrases: &str) -> Result<String, BrainError> {
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

// ---------------------------------------------------------------------------
// The glossary

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
fn fold(text: &str) -> String {
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

    fn request(text: Option<&str>, mode: &str) -> BrainRequest {
        BrainRequest {
            moment_text: text.map(Into::into),
            mode: mode.into(),
            ..BrainRequest::default()
        }
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
        for entry in GLOSSARY {
            let hits = glossary_hits(entry.phrase);
            assert_eq!(hits.first().map(|h| h.phrase), Some(entry.phrase));
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
        req.copy = Some(vec![1, 2, 3]);
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
        std::fs::write(&script, "#!/bin/sh\nexec sleep 5\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let brain = LocalBrain::new(LocalConfig {
            tesseract_path: Some(script.clone()),
            timeout_ms: 200,
            ..LocalConfig::default()
        });
        let mut req = request(Some("Ausgang"), "practical");
        req.copy = Some(vec![0x89, b'P', b'N', b'G']);
        let started = Instant::now();
        let answer = brain.read(req.clone()).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
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
        req.copy = Some(vec![1]);
        let err = brain.read(req).await.unwrap_err();
        assert!(err.0.contains("nothing to read"), "{err}");
        assert!(err.0.contains("bad image"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
