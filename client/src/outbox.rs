//! The outbox on the device: one directory per capture, written durably
//! before `capture` returns, and updated durably as each step succeeds.
//!
//! ```text
//! <outbox>/entries/<entry id>/entry.json   ids, texts, step states, parked reason
//! <outbox>/entries/<entry id>/copy.jpg     the small copy
//! <outbox>/entries/<entry id>/original.*   the photo as taken
//! <outbox>/messages/<order>-<id>.json      outgoing messages (see `messages`)
//! ```
//!
//! A capture is assembled in a hidden temporary directory (every file
//! fsynced, the directory fsynced), then renamed into `entries/` and
//! `entries/` fsynced: it appears whole or not at all.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clock::ClientClock;
use crate::fsio::{
    create_dir_durably, io_error, sync_dir, write_file_durably, write_new_file_synced,
};
use crate::ClientError;
use spark_core::ids::Id;
use spark_core::time::format_rfc3339_ms;

/// Version of the `entry.json` layout this build writes and reads.
pub const ENTRY_FORMAT: u32 = 1;

/// Name of an entry's record file inside its directory.
pub const ENTRY_FILE: &str = "entry.json";

/// The send steps, in the order they go (SPEC section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// `POST /api/moments` with the minted moment id and the entry id as
    /// the request id.
    CreateMoment,
    /// `PUT /api/media/{copy id}`: the small copy, with its SHA-256.
    UploadCopy,
    /// `POST /api/moments/{id}/turns`: the practical reading.
    StartTurn,
    /// `PUT /api/media/{original id}`: the photo as taken, with its SHA-256.
    UploadOriginal,
}

impl Step {
    /// Every step, in send order.
    pub const ORDER: [Step; 4] = [
        Step::CreateMoment,
        Step::UploadCopy,
        Step::StartTurn,
        Step::UploadOriginal,
    ];

    /// A short name (`create`, `copy`, `turn`, `original`).
    pub fn name(self) -> &'static str {
        match self {
            Step::CreateMoment => "create",
            Step::UploadCopy => "copy",
            Step::StartTurn => "turn",
            Step::UploadOriginal => "original",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes handed to [`Outbox::capture`], with their media type.
#[derive(Debug, Clone)]
pub struct MediaBytes {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their media type (e.g. `image/jpeg`).
    pub content_type: String,
}

/// What the person captured: the photo (as a small copy and the original)
/// and what they typed.
#[derive(Debug, Clone)]
pub struct Capture {
    /// The small copy the brain reads (see [`crate::image::make_copy`]).
    pub copy: MediaBytes,
    /// The photo as taken.
    pub original: MediaBytes,
    /// What the sign says, as typed or recognised on the phone.
    pub text: Option<String>,
    /// A caption.
    pub caption: Option<String>,
    /// The language of the text (e.g. `de`).
    pub lang: Option<String>,
    /// When the photo was taken, in Unix ms (default: now by the client
    /// clock).
    pub captured_at_ms: Option<u64>,
}

/// One stored media file of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaFile {
    /// File name inside the entry's directory.
    pub file: String,
    /// Media type sent as `Content-Type`.
    pub content_type: String,
    /// SHA-256 of the bytes, lower-case hex, sent as `X-Content-SHA256`.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// Why an entry is parked: a permanent answer the person has to see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// The step that was refused.
    pub step: Step,
    /// The HTTP status (`None` when the outbox itself could not build the
    /// request, e.g. a media file went missing).
    pub status: Option<u16>,
    /// The problem's `code`, when the server sent one.
    pub code: Option<String>,
    /// What went wrong, in words.
    pub detail: String,
    /// When it was parked (client clock, RFC 3339).
    pub at: String,
}

impl fmt::Display for Parked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: ", self.step)?;
        if let Some(status) = self.status {
            write!(f, "{status} ")?;
        }
        if let Some(code) = &self.code {
            write!(f, "{code}: ")?;
        }
        f.write_str(&self.detail)
    }
}

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Waiting to send; the step is the next one.
    Pending(Step),
    /// Every step is done.
    Done,
    /// Refused for good until the person acts; see [`Entry::parked`].
    Parked,
}

impl fmt::Display for EntryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryState::Pending(step) => write!(f, "pending (next: {step})"),
            EntryState::Done => f.write_str("done"),
            EntryState::Parked => f.write_str("parked"),
        }
    }
}

/// One capture in the outbox, as stored in its `entry.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Layout version ([`ENTRY_FORMAT`]).
    pub format: u32,
    /// The entry id: a ULID minted at capture, sent as the moment create's
    /// `client_request_id`.
    pub id: String,
    /// The moment id minted at capture; final.
    pub moment_id: Id,
    /// The small copy's media id.
    pub copy_id: Id,
    /// The original's media id.
    pub original_id: Id,
    /// The practical turn's request id.
    pub turn_request_id: String,
    /// What the sign says.
    pub text: Option<String>,
    /// A caption.
    pub caption: Option<String>,
    /// The text's language.
    pub lang: Option<String>,
    /// When the photo was taken (RFC 3339).
    pub captured_at: String,
    /// The small copy.
    pub copy: MediaFile,
    /// The original.
    pub original: MediaFile,
    /// Steps that succeeded, in the order they did.
    pub done: Vec<Step>,
    /// Set when a permanent answer parked the entry.
    pub parked: Option<Parked>,
    /// Requests sent for this entry that got no usable answer (waits).
    pub failed_attempts: u32,
    /// The last passing trouble (a dropped link, a `503`, a `429`), for
    /// the listing.
    pub last_error: Option<String>,
    /// The turn id the server gave the practical turn, once started.
    pub turn_id: Option<String>,
}

impl Entry {
    /// Where the entry stands.
    pub fn state(&self) -> EntryState {
        if self.parked.is_some() {
            return EntryState::Parked;
        }
        match self.next_step() {
            Some(step) => EntryState::Pending(step),
            None => EntryState::Done,
        }
    }

    /// The first step not yet done, in send order.
    pub fn next_step(&self) -> Option<Step> {
        Step::ORDER.into_iter().find(|s| !self.done.contains(s))
    }

    /// Whether `step` succeeded already.
    pub fn is_done(&self, step: Step) -> bool {
        self.done.contains(&step)
    }
}

/// What [`Outbox::scan`] found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Entries that read cleanly, in capture order (entry id order).
    pub entries: Vec<Entry>,
    /// Entry directories whose record could not be read, with the reason.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// The outbox directory. One process drains it at a time.
#[derive(Debug, Clone)]
pub struct Outbox {
    root: PathBuf,
}

/// Mints a ULID from the client clock.
pub(crate) fn mint(clock: &dyn ClientClock) -> Id {
    Id::from_parts(clock.now_ms(), rand::random::<u128>())
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A file name extension for a media type.
fn extension_for(content_type: &str) -> &'static str {
    match content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "image/heic" => "heic",
        "image/webp" => "webp",
        _ => "bin",
    }
}

impl Outbox {
    /// Opens (creating when missing) the outbox at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Outbox, ClientError> {
        let root = root.into();
        create_dir_durably(&root)?;
        create_dir_durably(&root.join("entries"))?;
        create_dir_durably(&root.join("messages"))?;
        Ok(Outbox { root })
    }

    /// The outbox directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn entries_dir(&self) -> PathBuf {
        self.root.join("entries")
    }

    pub(crate) fn messages_dir(&self) -> PathBuf {
        self.root.join("messages")
    }

    /// The directory of the entry `id`.
    pub fn entry_dir(&self, id: &str) -> PathBuf {
        self.entries_dir().join(id)
    }

    /// The path of one of an entry's media files.
    pub fn media_path(&self, entry: &Entry, media: &MediaFile) -> PathBuf {
        self.entry_dir(&entry.id).join(&media.file)
    }

    /// Stores a capture durably and returns its entry. Everything the send
    /// needs is minted here, from the client clock, before any request: the
    /// moment id, the copy and original ids, the entry id (the create's
    /// request id) and the practical turn's request id. When this returns
    /// `Ok`, the capture survives a crash and its moment id is final.
    pub fn capture(&self, clock: &dyn ClientClock, capture: Capture) -> Result<Entry, ClientError> {
        for (what, media) in [("copy", &capture.copy), ("original", &capture.original)] {
            if media.content_type.trim().is_empty() {
                return Err(ClientError::Invalid(format!(
                    "the {what} needs a content type"
                )));
            }
        }
        let entry_id = mint(clock).to_string();
        let captured_at_ms = capture.captured_at_ms.unwrap_or_else(|| clock.now_ms());
        let media_file = |name: &str, media: &MediaBytes| MediaFile {
            file: format!("{name}.{}", extension_for(&media.content_type)),
            content_type: media.content_type.clone(),
            sha256: sha256_hex(&media.bytes),
            size: media.bytes.len() as u64,
        };
        let entry = Entry {
            format: ENTRY_FORMAT,
            id: entry_id.clone(),
            moment_id: mint(clock),
            copy_id: mint(clock),
            original_id: mint(clock),
            turn_request_id: mint(clock).to_string(),
            text: capture.text,
            caption: capture.caption,
            lang: capture.lang,
            captured_at: format_rfc3339_ms(i64::try_from(captured_at_ms).unwrap_or(i64::MAX)),
            copy: media_file("copy", &capture.copy),
            original: media_file("original", &capture.original),
            done: Vec::new(),
            parked: None,
            failed_attempts: 0,
            last_error: None,
            turn_id: None,
        };
        let entries = self.entries_dir();
        let temp = entries.join(format!(".capture-{entry_id}"));
        let assembled = (|| {
            fs::create_dir(&temp).map_err(|e| io_error(&temp, e))?;
            write_new_file_synced(&temp.join(&entry.copy.file), &capture.copy.bytes)?;
            write_new_file_synced(&temp.join(&entry.original.file), &capture.original.bytes)?;
            write_new_file_synced(&temp.join(ENTRY_FILE), &entry_json(&entry)?)?;
            sync_dir(&temp)?;
            let final_dir = entries.join(&entry_id);
            fs::rename(&temp, &final_dir).map_err(|e| io_error(&final_dir, e))?;
            sync_dir(&entries)
        })();
        if let Err(e) = assembled {
            let _ = fs::remove_dir_all(&temp);
            return Err(e);
        }
        Ok(entry)
    }

    /// Reads every entry, in capture order; unreadable ones are listed
    /// apart so one damaged record does not hide the rest.
    pub fn scan(&self) -> Result<Scan, ClientError> {
        let dir = self.entries_dir();
        let mut names = Vec::new();
        for item in fs::read_dir(&dir).map_err(|e| io_error(&dir, e))? {
            let item = item.map_err(|e| io_error(&dir, e))?;
            let name = item.file_name().to_string_lossy().into_owned();
            // Hidden names are captures being assembled (or abandoned by a
            // crash before their rename): not part of the outbox.
            if !name.starts_with('.') && item.path().is_dir() {
                names.push(name);
            }
        }
        names.sort();
        let mut scan = Scan::default();
        for name in names {
            match self.load(&name) {
                Ok(entry) => scan.entries.push(entry),
                Err(e) => scan.unreadable.push((dir.join(&name), e.to_string())),
            }
        }
        Ok(scan)
    }

    /// Reads one entry by id.
    pub fn load(&self, id: &str) -> Result<Entry, ClientError> {
        let path = self.entry_dir(id).join(ENTRY_FILE);
        let bytes = fs::read(&path).map_err(|e| io_error(&path, e))?;
        let entry: Entry = serde_json::from_slice(&bytes).map_err(|e| ClientError::Corrupt {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        if entry.format > ENTRY_FORMAT {
            return Err(ClientError::Corrupt {
                path,
                detail: format!(
                    "entry format {} is newer than this build reads ({ENTRY_FORMAT})",
                    entry.format
                ),
            });
        }
        Ok(entry)
    }

    /// Writes an entry's record durably (atomic replace).
    pub fn save(&self, entry: &Entry) -> Result<(), ClientError> {
        let path = self.entry_dir(&entry.id).join(ENTRY_FILE);
        write_file_durably(&path, &entry_json(entry)?)
    }

    /// Clears a parked entry's reason so the next drain tries again from
    /// its first step not yet done. Returns the entry.
    pub fn unpark(&self, id: &str) -> Result<Entry, ClientError> {
        let mut entry = self.load(id)?;
        entry.parked = None;
        self.save(&entry)?;
        Ok(entry)
    }
}

fn entry_json(entry: &Entry) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec_pretty(entry).map_err(|e| ClientError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn capture() -> Capture {
        Capture {
            copy: MediaBytes {
                bytes: b"copy".to_vec(),
                content_type: "image/jpeg".into(),
            },
            original: MediaBytes {
                bytes: b"original".to_vec(),
                content_type: "image/png".into(),
            },
            text: Some("Ausfahrt freihalten".into()),
            caption: None,
            lang: Some("de".into()),
            captured_at_ms: None,
        }
    }

    #[test]
    fn capture_is_whole_and_readable_again() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(1_767_225_600_000);
        let outbox = Outbox::open(dir.path()).unwrap();
        let entry = outbox.capture(&clock, capture()).unwrap();
        assert_eq!(entry.moment_id.time_ms(), 1_767_225_600_000);
        assert_eq!(entry.captured_at, "2026-01-01T00:00:00Z");
        assert_eq!(entry.state(), EntryState::Pending(Step::CreateMoment));
        let ids = [
            entry.id.clone(),
            entry.moment_id.to_string(),
            entry.copy_id.to_string(),
            entry.original_id.to_string(),
            entry.turn_request_id.clone(),
        ];
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), 5);

        let again = Outbox::open(dir.path()).unwrap();
        let scan = again.scan().unwrap();
        assert_eq!(scan.entries, vec![entry.clone()]);
        let copy = fs::read(again.media_path(&entry, &entry.copy)).unwrap();
        assert_eq!(copy, b"copy");
        assert_eq!(entry.copy.sha256, sha256_hex(b"copy"));
        assert_eq!(entry.original.file, "original.png");
        // No temporary names are left behind.
        for item in fs::read_dir(again.entries_dir()).unwrap() {
            let name = item.unwrap().file_name();
            assert!(!name.to_string_lossy().starts_with('.'), "{name:?}");
        }
    }

    #[test]
    fn leftover_temp_dirs_and_damaged_records_do_not_hide_entries() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(1_767_225_600_000);
        let outbox = Outbox::open(dir.path()).unwrap();
        let entry = outbox.capture(&clock, capture()).unwrap();
        fs::create_dir(outbox.entries_dir().join(".capture-crashed")).unwrap();
        let broken = outbox.entries_dir().join("01BROKEN");
        fs::create_dir(&broken).unwrap();
        fs::write(broken.join(ENTRY_FILE), b"{ not json").unwrap();
        let scan = outbox.scan().unwrap();
        assert_eq!(scan.entries.len(), 1);
        assert_eq!(scan.entries[0].id, entry.id);
        assert_eq!(scan.unreadable.len(), 1);
    }
}
