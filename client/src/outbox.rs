//! The outbox on the device: one directory per capture, written durably
//! before `capture` returns, and updated durably as each step succeeds.
//!
//! ```text
//! <outbox>/entries/<entry id>/entry.json   ids, texts, step states, parked reason
//! <outbox>/entries/<entry id>/copy.jpg     the small copy
//! <outbox>/entries/<entry id>/original.*   the photo as taken
//! <outbox>/entries/<entry id>/copy-N.jpg   photo N's copy (N from 1; issue 27)
//! <outbox>/entries/<entry id>/original-N.* photo N as taken
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

/// Newest version of the `entry.json` layout this build reads. It writes
/// version 1 for a capture of one photo (as every build before several
/// photos did) and version 2 for more, so that an older build refuses an
/// entry with photos it would not send instead of sending photo 0 alone
/// and calling it done.
pub const ENTRY_FORMAT: u32 = 2;

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
    /// `PUT /api/media/{id}` with `X-Photo: N`: the small copy of photo N
    /// (from 1) of a capture of several photos (issue 27). Every copy goes
    /// before the turn, so that the brain reads them all.
    UploadCopyOf(u8),
    /// `PUT /api/media/{id}` with `X-Photo: N`: photo N (from 1) as taken.
    UploadOriginalOf(u8),
}

impl Step {
    /// The steps of a capture of one photo, in send order (SPEC section
    /// 6); [`Entry::steps`] gives any entry's.
    pub const ORDER: [Step; 4] = [
        Step::CreateMoment,
        Step::UploadCopy,
        Step::StartTurn,
        Step::UploadOriginal,
    ];

    /// A short name (`create`, `copy`, `turn`, `original`, `copy 2`,
    /// `original 2`).
    pub fn name(self) -> String {
        match self {
            Step::CreateMoment => "create".into(),
            Step::UploadCopy => "copy".into(),
            Step::StartTurn => "turn".into(),
            Step::UploadOriginal => "original".into(),
            Step::UploadCopyOf(photo) => format!("copy {photo}"),
            Step::UploadOriginalOf(photo) => format!("original {photo}"),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
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

/// One more photo of a capture: its small copy and the photo as taken.
#[derive(Debug, Clone)]
pub struct PhotoBytes {
    /// The small copy the brain reads (see [`crate::image::make_copy`]).
    pub copy: MediaBytes,
    /// The photo as taken.
    pub original: MediaBytes,
}

/// What the person captured: the photo (as a small copy and the original),
/// any more photos of the same sign, and what they typed.
#[derive(Debug, Clone)]
pub struct Capture {
    /// The small copy the brain reads (see [`crate::image::make_copy`]).
    pub copy: MediaBytes,
    /// The photo as taken.
    pub original: MediaBytes,
    /// Photos 1, 2, ... of the same moment, in order (issue 27): at most
    /// [`spark_core::wire::PHOTOS_PER_MOMENT`] photos in all.
    pub more_photos: Vec<PhotoBytes>,
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

/// Photo N (from 1) of an entry: its media ids and files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryPhoto {
    /// The photo's number in its moment (`X-Photo`), from 1.
    pub photo: u8,
    /// The small copy's media id.
    pub copy_id: Id,
    /// The original's media id.
    pub original_id: Id,
    /// The small copy.
    pub copy: MediaFile,
    /// The original.
    pub original: MediaFile,
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
    /// Photos 1, 2, ... of the moment (none in an entry of format 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_photos: Vec<EntryPhoto>,
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

    /// Every step of the entry, in send order: the create, every photo's
    /// copy, the turn (so the brain reads every copy), every photo's
    /// original.
    pub fn steps(&self) -> Vec<Step> {
        let more = || self.more_photos.iter().map(|p| p.photo);
        let mut steps = vec![Step::CreateMoment, Step::UploadCopy];
        steps.extend(more().map(Step::UploadCopyOf));
        steps.extend([Step::StartTurn, Step::UploadOriginal]);
        steps.extend(more().map(Step::UploadOriginalOf));
        steps
    }

    /// The first step not yet done, in send order.
    pub fn next_step(&self) -> Option<Step> {
        self.steps().into_iter().find(|s| !self.done.contains(s))
    }

    /// The media id, photo number, role and file of an upload step;
    /// `None` for the create, the turn, and a photo the entry does not
    /// have.
    pub fn upload(&self, step: Step) -> Option<(Id, u8, &'static str, &MediaFile)> {
        use spark_core::wire::{MEDIA_ROLE_COPY as COPY, MEDIA_ROLE_ORIGINAL as ORIGINAL};
        let of = |n: u8| self.more_photos.iter().find(|p| p.photo == n);
        match step {
            Step::UploadCopy => Some((self.copy_id, 0, COPY, &self.copy)),
            Step::UploadOriginal => Some((self.original_id, 0, ORIGINAL, &self.original)),
            Step::UploadCopyOf(n) => of(n).map(|p| (p.copy_id, n, COPY, &p.copy)),
            Step::UploadOriginalOf(n) => of(n).map(|p| (p.original_id, n, ORIGINAL, &p.original)),
            Step::CreateMoment | Step::StartTurn => None,
        }
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
        let max = usize::from(spark_core::wire::PHOTOS_PER_MOMENT);
        if capture.more_photos.len() + 1 > max {
            return Err(ClientError::Invalid(format!(
                "{} photos: a moment holds at most {max}",
                capture.more_photos.len() + 1
            )));
        }
        let photos = std::iter::once((&capture.copy, &capture.original))
            .chain(capture.more_photos.iter().map(|p| (&p.copy, &p.original)));
        for (n, (copy, original)) in photos.enumerate() {
            for (what, media) in [("copy", copy), ("original", original)] {
                if media.content_type.trim().is_empty() {
                    return Err(ClientError::Invalid(format!(
                        "the {what} of photo {n} needs a content type"
                    )));
                }
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
        let more_photos: Vec<EntryPhoto> = (1u8..)
            .zip(&capture.more_photos)
            .map(|(photo, bytes)| EntryPhoto {
                photo,
                copy_id: mint(clock),
                original_id: mint(clock),
                copy: media_file(&format!("copy-{photo}"), &bytes.copy),
                original: media_file(&format!("original-{photo}"), &bytes.original),
            })
            .collect();
        let entry = Entry {
            format: if more_photos.is_empty() { 1 } else { 2 },
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
            more_photos,
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
            for (photo, bytes) in entry.more_photos.iter().zip(&capture.more_photos) {
                write_new_file_synced(&temp.join(&photo.copy.file), &bytes.copy.bytes)?;
                write_new_file_synced(&temp.join(&photo.original.file), &bytes.original.bytes)?;
            }
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
            more_photos: Vec::new(),
            text: Some("Ausfahrt freihalten".into()),
            caption: None,
            lang: Some("de".into()),
            captured_at_ms: None,
        }
    }

    fn photo(n: u8) -> PhotoBytes {
        PhotoBytes {
            copy: MediaBytes {
                bytes: format!("copy {n}").into_bytes(),
                content_type: "image/jpeg".into(),
            },
            original: MediaBytes {
                bytes: format!("original {n}").into_bytes(),
                content_type: "image/png".into(),
            },
        }
    }

    /// Issue 27: a capture of three photos keeps each one's files and ids,
    /// sends every copy before the turn and every original after it, and
    /// is written as format 2 (a one-photo capture stays format 1).
    #[test]
    fn a_capture_of_several_photos_sends_every_copy_before_the_turn() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(1_767_225_600_000);
        let outbox = Outbox::open(dir.path()).unwrap();
        let one = outbox.capture(&clock, capture()).unwrap();
        assert_eq!(one.format, 1);
        assert_eq!(one.steps(), Step::ORDER);
        let three = outbox
            .capture(
                &clock,
                Capture {
                    more_photos: vec![photo(1), photo(2)],
                    ..capture()
                },
            )
            .unwrap();
        assert_eq!(three.format, 2);
        assert_eq!(
            three.steps(),
            [
                Step::CreateMoment,
                Step::UploadCopy,
                Step::UploadCopyOf(1),
                Step::UploadCopyOf(2),
                Step::StartTurn,
                Step::UploadOriginal,
                Step::UploadOriginalOf(1),
                Step::UploadOriginalOf(2),
            ]
        );
        let again = Outbox::open(dir.path()).unwrap().load(&three.id).unwrap();
        assert_eq!(again, three);
        let (id, n, role, file) = again.upload(Step::UploadOriginalOf(2)).unwrap();
        assert_eq!(
            (id, n, role),
            (three.more_photos[1].original_id, 2, "original")
        );
        assert_eq!(
            fs::read(outbox.media_path(&again, file)).unwrap(),
            b"original 2"
        );
        assert!(again.upload(Step::UploadCopyOf(3)).is_none());
        let ids: std::collections::HashSet<Id> = again
            .more_photos
            .iter()
            .flat_map(|p| [p.copy_id, p.original_id])
            .chain([again.copy_id, again.original_id, again.moment_id])
            .collect();
        assert_eq!(ids.len(), 7);
        // Eleven photos are refused, nothing stored.
        let before = outbox.scan().unwrap().entries.len();
        let eleven = Capture {
            more_photos: (1..=10).map(photo).collect(),
            ..capture()
        };
        assert!(matches!(
            outbox.capture(&clock, eleven),
            Err(ClientError::Invalid(_))
        ));
        assert_eq!(outbox.scan().unwrap().entries.len(), before);
    }

    /// An entry written before several photos (format 1, no
    /// `more_photos`, steps by name) reads and sends as it did.
    #[test]
    fn an_entry_of_format_1_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(1_767_225_600_000);
        let outbox = Outbox::open(dir.path()).unwrap();
        let entry = outbox.capture(&clock, capture()).unwrap();
        let path = outbox.entry_dir(&entry.id).join(ENTRY_FILE);
        let mut json: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert!(json.get("more_photos").is_none(), "{json}");
        json["done"] = serde_json::json!(["create_moment", "upload_copy"]);
        fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let read = outbox.load(&entry.id).unwrap();
        assert_eq!(read.next_step(), Some(Step::StartTurn));
        // A format this build does not know is refused, not half sent.
        json["format"] = serde_json::json!(ENTRY_FORMAT + 1);
        fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        assert!(matches!(
            outbox.load(&entry.id),
            Err(ClientError::Corrupt { .. })
        ));
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
