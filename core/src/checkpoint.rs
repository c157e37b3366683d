//! Checkpoints: the mirror and its request index at a seq, in one file
//! under `<data>/checkpoint/`, so that startup replays only the ops after
//! it. The byte layout is `log-format/CHECKPOINT.md`.
//!
//! A checkpoint is derived state. It is trusted only when its checksum
//! holds, its format version is this build's, and the chain value it names
//! equals the log's at the end of its seq's record; anything else is
//! ignored (the caller warns, naming the file) and the log is replayed
//! instead. Deleting checkpoints changes nothing but time.
//!
//! The moments and the request index are written in a compact hand-written
//! encoding (the mirror's packed structures as they are); the other maps'
//! items go through [`crate::codec`], each length-prefixed.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spark_log_format::format::{chain_value, record_size};
use spark_log_format::format::{segment_file_name, HeaderError, SegmentHeader};
use spark_log_format::{ChainValue, Fs, LogError, LogReader, OsFs, ScanOptions, HEADER_LEN};
use thin_vec::ThinVec;

use crate::codec::CodecError;
use crate::ids::Id;
use crate::len_prefixed::{checked_read, checked_read_leb128, push, push_leb128};
use crate::mirror::PackedMomentError;
use crate::mirror::{Job, Mark, Media, Message, Mirror, Moment, Recall, Turn};
use crate::replay::ReplayError;
use crate::request_index::stored::{self, Backing};
use crate::request_index::{RequestIndex, StoredIndexError};

/// The checkpoint format version this build writes and reads; a file with
/// another one is ignored (the log is replayed instead). Version 2 stores
/// the request index as the engine's own table, used in place (issue 28),
/// and each media's photo number (issue 27).
pub const FORMAT_VERSION: u16 = 2;

/// Why a checkpoint file was not used, or could not be built or written.
/// The texts do not name the checkpoint file (the caller does, as
/// [`Ignored`] does); they name a log segment when one is at fault. Body
/// offsets are bytes from the start of the body.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The log segment a checkpoint stands in cannot be opened.
    #[error("segment {} cannot be read: {source}", .path.display())]
    SegmentUnreadable {
        /// The segment file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The log segment a checkpoint stands in cannot be mapped.
    #[error("segment {} cannot be mapped: {source}", .path.display())]
    SegmentUnmappable {
        /// The segment file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The point's offset lies past the segment's end (or inside its
    /// header).
    #[error("offset {end} is beyond the log (segment {} holds {len_bytes} bytes)", .path.display())]
    BeyondSegment {
        /// The segment file.
        path: PathBuf,
        /// The point's offset in the segment, bytes.
        end: u64,
        /// The segment's length, bytes.
        len_bytes: u64,
    },
    /// The point's offset lies past the segment's mapping.
    #[error("offset {end} is beyond the log")]
    BeyondMap {
        /// The segment file.
        path: PathBuf,
        /// The point's offset in the segment, bytes.
        end: u64,
    },
    /// The segment's header does not decode (FORMAT.md "Segment header").
    #[error("segment {} header: {error:?}", .path.display())]
    SegmentHeader {
        /// The segment file.
        path: PathBuf,
        /// Why the header does not decode.
        error: HeaderError,
    },
    /// The checkpoint file cannot be opened or its length read.
    #[error("cannot be read: {source}")]
    Unreadable {
        /// The checkpoint file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The checkpoint file cannot be mapped.
    #[error("cannot be mapped: {source}")]
    Unmappable {
        /// The checkpoint file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The name is a checkpoint's but the path is not a regular file (a
    /// directory, a FIFO, a socket, a device): never opened, so a FIFO
    /// cannot hang a start.
    #[error("not a regular file")]
    NotAFile,
    /// Fewer bytes than a header and a trailer.
    #[error("{len_bytes} bytes: shorter than a checkpoint")]
    TooShort {
        /// The file's length, bytes.
        len_bytes: u64,
    },
    /// The first 8 bytes are not [`MAGIC`].
    #[error("not a checkpoint (bad magic)")]
    BadMagic,
    /// Another format version than [`FORMAT_VERSION`].
    #[error("format version {found}, this build reads {}", FORMAT_VERSION)]
    Version {
        /// The file's version.
        found: u16,
    },
    /// The header's reserved bytes are not zero.
    #[error("reserved header bytes are not zero")]
    ReservedBytes,
    /// The header's body length is not the bytes between header and
    /// trailer (the whole file read).
    #[error("header says {body_bytes} body bytes, the file holds {held_bytes}")]
    BodyLength {
        /// The header's body length, bytes.
        body_bytes: u64,
        /// The bytes between header and trailer.
        held_bytes: u64,
    },
    /// The header's body length does not give the file's length (only
    /// the header read).
    #[error("header says {body_bytes} body bytes, the file holds {file_bytes} bytes in all")]
    FileLength {
        /// The header's body length, bytes.
        body_bytes: u64,
        /// The file's length, bytes.
        file_bytes: u64,
    },
    /// The BLAKE3 trailer is not the hash of the bytes before it.
    #[error("checksum mismatch (BLAKE3 trailer)")]
    Checksum,
    /// A decoding thread panicked (`what` names it).
    #[error("{what} panicked")]
    Panicked {
        /// The thread, e.g. "the checksum thread".
        what: &'static str,
    },
    /// The body ends inside an item.
    #[error("body ends inside an item at byte {at}")]
    BodyEnds {
        /// Where the item starts in the body.
        at: usize,
    },
    /// A LEB128 number does not decode.
    #[error("{what}: bad number at body byte {at}")]
    BadNumber {
        /// What the number is.
        what: &'static str,
        /// Where it starts in the body.
        at: usize,
    },
    /// A length-prefixed item runs past the body.
    #[error("{what}: runs past the body at byte {at}")]
    RunsPast {
        /// What the item is.
        what: &'static str,
        /// Where it starts in the body.
        at: usize,
    },
    /// A count of items the rest of the body cannot hold.
    #[error("{what}: {count} items do not fit the body")]
    TooMany {
        /// What the items are.
        what: &'static str,
        /// The count read.
        count: u64,
    },
    /// An item does not decode ([`crate::codec`]).
    #[error("{what}: {source}")]
    Item {
        /// What the items are.
        what: &'static str,
        /// Why it does not decode.
        source: CodecError,
    },
    /// A moment's version does not fit a `u32`.
    #[error("version above u32")]
    VersionAboveU32,
    /// A moment's deleted flag is neither 0 nor 1.
    #[error("moment {id}: deleted flag {flag}")]
    DeletedFlag {
        /// The moment.
        id: Id,
        /// The flag byte.
        flag: u8,
    },
    /// A moment's packed parts do not check.
    #[error(transparent)]
    Moment(#[from] PackedMomentError),
    /// Moments are not in strictly rising id order.
    #[error("moment {id} out of id order")]
    MomentOrder {
        /// The first moment out of order.
        id: Id,
    },
    /// The request index section does not check (it names the row or
    /// slot).
    #[error(transparent)]
    Requests(#[from] StoredIndexError),
    /// The body's prelude (moment count, split and offsets) does not fit
    /// the body.
    #[error("prelude: {why}")]
    Prelude {
        /// What does not fit.
        why: &'static str,
    },
    /// A run of moments does not end where the prelude says.
    #[error("moments end at body byte {found}, the prelude says {expected}")]
    MomentsEnd {
        /// Where they end.
        found: usize,
        /// Where the prelude says.
        expected: usize,
    },
    /// An item's id appears twice (`what`: media, turn, mark, job,
    /// recall, message).
    #[error("a {what} id appears twice")]
    IdTwice {
        /// What the item is.
        what: &'static str,
    },
    /// Bytes are left after the last item.
    #[error("{trailing_bytes} bytes after the body")]
    TrailingBytes {
        /// How many.
        trailing_bytes: usize,
    },
    /// The file name's seq is not the header's.
    #[error("the file name does not match the header's seq {seq}")]
    NameMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// The header's seq.
        seq: u64,
    },
    /// The header names a segment that cannot hold its seq.
    #[error("segment {segment_first_seq} cannot hold seq {seq}")]
    SegmentCannotHold {
        /// The header's segment (its first seq).
        segment_first_seq: u64,
        /// The header's seq.
        seq: u64,
    },
    /// The header's chain value is not the log's at its point.
    #[error(
        "chain value at seq {seq} does not match the log (segment {} offset {frame_end_offset}): \
         the checkpoint is stale, from another log, or beyond the log's end",
        segment_file_name(*.segment_first_seq)
    )]
    ChainMismatch {
        /// The header's seq.
        seq: u64,
        /// The header's segment (its first seq).
        segment_first_seq: u64,
        /// The header's offset in that segment, bytes.
        frame_end_offset: u64,
    },
    /// The checkpoint directory cannot be created or fsynced (`what`:
    /// "create", "fsync").
    #[error("{what} {}: {source}", .path.display())]
    Dir {
        /// The operation.
        what: &'static str,
        /// The directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The checkpoint file cannot be written durably (the error names
    /// the file).
    #[error("{source}")]
    Write {
        /// The checkpoint file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The log cannot be opened or read while building.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A committed record does not fold while building.
    #[error("seq {seq}: {source}")]
    Fold {
        /// The record's seq.
        seq: u64,
        /// Why it does not fold.
        source: ReplayError,
    },
}

/// The first 8 bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"SPKCKPT\0";

/// Bytes of the fixed header (magic to the request index's seed).
pub const HEADER_BYTES: usize = 96;

/// Bytes of the body's prelude: moment count, split, split offset,
/// request index offset.
const PRELUDE_BYTES: usize = 32;

/// Bytes of the trailer: the BLAKE3 hash of everything before it.
pub const TRAILER_BYTES: usize = 32;

/// Suffix of a checkpoint file: `<seq, 20 digits>.ckpt`.
pub const SUFFIX: &str = ".ckpt";

/// Suffix of a checkpoint being written; never read, removed by the next
/// write.
pub const TMP_SUFFIX: &str = ".ckpt.tmp";

/// `<data_dir>/checkpoint`, where checkpoints live.
pub fn checkpoint_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The file name of the checkpoint at `seq`: 20 digits and [`SUFFIX`].
pub fn file_name(seq: u64) -> String {
    format!("{seq:020}{SUFFIX}")
}

/// The seq a checkpoint file name gives, if it is one.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Where in the log a checkpoint stands (defined by the log, whose
/// recovery starts from it: [`spark_log_format::Log::open_from`]).
pub use spark_log_format::LogPoint;

/// The fixed header of a checkpoint file, as decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Where the checkpoint stands in the log.
    pub at: LogPoint,
    /// The mirror's `ts_ms` (server time of the op at `seq`, Unix ms).
    pub ts_ms: u64,
    /// Bytes of the body.
    pub body_bytes: u64,
    /// The seed of the request index's hash (its stored table is placed by
    /// it): a mirror that folds the ops after the checkpoint hashes its
    /// request ids with it ([`Mirror::with_request_seed`]).
    pub request_seed: u64,
}

/// The chain value at byte `end` of segment `segment_first_seq` in
/// `log_dir`: BLAKE3 over the header's `chain_start` and the segment's bytes
/// up to `end`. Errors ([`CheckpointError`], naming the segment): the
/// segment is missing, shorter than `end` ("beyond the log"), or its header
/// does not decode.
///
/// The segment is mapped, not copied: at startup this runs on up to 64 MiB
/// of the segment recovery reads next, and a copy cost a fresh process
/// that much zeroed memory and a copy.
pub fn chain_at(
    log_dir: &Path,
    segment_first_seq: u64,
    end: u64,
) -> Result<ChainValue, CheckpointError> {
    let path = log_dir.join(segment_file_name(segment_first_seq));
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(source) => return Err(CheckpointError::SegmentUnreadable { path, source }),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if end > len || end < HEADER_LEN as u64 {
        return Err(CheckpointError::BeyondSegment {
            path,
            end,
            len_bytes: len,
        });
    }
    // SAFETY: a segment's bytes are only ever appended after its last
    // acknowledged frame (or cut after it by recovery, which holds the
    // data directory's lock); the bytes below `end` read here are checked
    // against a chain value, so a change under the map is at worst a
    // mismatch (the reader maps live segments the same way).
    let map = match unsafe { memmap2::Mmap::map(&file) } {
        Ok(map) => map,
        Err(source) => return Err(CheckpointError::SegmentUnmappable { path, source }),
    };
    let Some(prefix) = usize::try_from(end).ok().and_then(|end| map.get(..end)) else {
        return Err(CheckpointError::BeyondMap { path, end });
    };
    let header = match SegmentHeader::decode(prefix) {
        Ok(header) => header,
        Err(error) => return Err(CheckpointError::SegmentHeader { path, error }),
    };
    Ok(chain_value(&header.chain_start, prefix))
}

// ---- Encoding -------------------------------------------------------------

/// The whole file for `mirror` standing at `at` (`at.seq` must be
/// `mirror.seq`): header, body, trailer.
pub fn encode(mirror: &Mirror, at: &LogPoint) -> Vec<u8> {
    debug_assert_eq!(mirror.seq, at.seq);
    let mut out = Vec::with_capacity(
        HEADER_BYTES + mirror.moments.len() * 96 + mirror.requests.len() * 72 + TRAILER_BYTES,
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(&at.seq.to_le_bytes());
    out.extend_from_slice(&mirror.ts_ms.to_le_bytes());
    out.extend_from_slice(&at.segment_first_seq.to_le_bytes());
    out.extend_from_slice(&at.frame_end_offset.to_le_bytes());
    out.extend_from_slice(&at.chain);
    // The body's length, filled in below.
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&mirror.requests.seed().to_le_bytes());
    debug_assert_eq!(out.len(), HEADER_BYTES);
    encode_body(mirror, &mut out);
    let body_bytes = (out.len() - HEADER_BYTES) as u64;
    out[80..88].copy_from_slice(&body_bytes.to_le_bytes());
    let hash = blake3::hash(&out);
    out.extend_from_slice(hash.as_bytes());
    out
}

/// Appends the body to `out`, which holds the header: the prelude, the
/// moments, the request index section at a multiple of 8 bytes from the
/// file's start (so its table and rows can be read in place), the other
/// maps' items.
fn encode_body(mirror: &Mirror, out: &mut Vec<u8>) {
    let body = out.len();
    let moments = mirror.moments.len();
    let split = moments / 2;
    out.extend_from_slice(&[0; PRELUDE_BYTES]);
    let mut split_at = out.len() - body;
    for (k, moment) in mirror.moments.values().enumerate() {
        if k == split {
            split_at = out.len() - body;
        }
        let (texts, captured_at_ms, present, media_count, ids) = moment.packed_parts();
        out.extend_from_slice(&moment.id.0.to_le_bytes());
        push(out, texts);
        out.extend_from_slice(&captured_at_ms.to_le_bytes());
        push_leb128(out, moment.created_at_ms);
        push_leb128(out, u64::from(moment.version));
        out.push(u8::from(moment.deleted));
        out.push(present);
        out.push(media_count);
        push_leb128(out, ids.len() as u64);
        for id in ids {
            out.extend_from_slice(&id.0.to_le_bytes());
        }
    }
    if split == moments {
        split_at = out.len() - body;
    }
    out.resize(out.len().next_multiple_of(8), 0);
    let requests_at = out.len() - body;
    stored::encode_section(&mirror.requests, out);
    let prelude = [
        moments as u64,
        split as u64,
        split_at as u64,
        requests_at as u64,
    ];
    for (k, value) in prelude.into_iter().enumerate() {
        out[body + 8 * k..body + 8 * k + 8].copy_from_slice(&value.to_le_bytes());
    }
    items(out, sorted(mirror.media.values(), |m| m.id));
    items(out, sorted(mirror.turns.values(), |t| t.id));
    items(out, mirror.marks.values().collect());
    items(out, sorted(mirror.jobs.values(), |j| j.job_id.clone()));
    items(out, sorted(mirror.recalls.values(), |r| r.id.clone()));
    items(out, sorted(mirror.messages.values(), |m| m.id));
}

/// `values` sorted by `key`, so that one state always gives one file.
fn sorted<'a, T, K: Ord>(values: impl Iterator<Item = &'a T>, key: impl Fn(&T) -> K) -> Vec<&'a T>
where
    T: 'a,
{
    let mut out: Vec<&T> = values.collect();
    out.sort_by_key(|item| key(item));
    out
}

/// A count, then each item's [`crate::codec`] bytes, length-prefixed.
fn items<T: serde::Serialize>(out: &mut Vec<u8>, values: Vec<&T>) {
    push_leb128(out, values.len() as u64);
    for value in values {
        // Plain data into memory: encoding cannot fail.
        let bytes = crate::codec::encode(value).expect("mirror items encode");
        push(out, &bytes);
    }
}

// ---- Decoding -------------------------------------------------------------

/// Decodes the header of a whole checkpoint file and checks, in order:
/// length, magic, format version, reserved bytes, body length and the
/// BLAKE3 trailer. Errors: [`CheckpointError`] (the caller names the file).
pub fn decode_header(bytes: &[u8]) -> Result<Header, CheckpointError> {
    let header = header_fields(bytes)?;
    check_trailer(bytes)?;
    Ok(header)
}

/// The BLAKE3 trailer of a whole file (at least [`HEADER_BYTES`] +
/// [`TRAILER_BYTES`] long) against the hash of the bytes before it.
fn check_trailer(bytes: &[u8]) -> Result<(), CheckpointError> {
    let trailer_start = bytes.len() - TRAILER_BYTES;
    let computed = blake3::hash(&bytes[..trailer_start]);
    if computed.as_bytes()[..] != bytes[trailer_start..] {
        return Err(CheckpointError::Checksum);
    }
    Ok(())
}

/// [`decode_header`] without the trailer: length, magic, format version,
/// reserved bytes and body length.
fn header_fields(bytes: &[u8]) -> Result<Header, CheckpointError> {
    if bytes.len() < HEADER_BYTES + TRAILER_BYTES {
        return Err(CheckpointError::TooShort {
            len_bytes: bytes.len() as u64,
        });
    }
    if bytes[..8] != MAGIC {
        return Err(CheckpointError::BadMagic);
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FORMAT_VERSION {
        return Err(CheckpointError::Version { found: version });
    }
    if bytes[10..16] != [0; 6] {
        return Err(CheckpointError::ReservedBytes);
    }
    let (body_start, trailer_start) = (HEADER_BYTES, bytes.len() - TRAILER_BYTES);
    let body_bytes = u64_at(80);
    if body_bytes != (trailer_start - body_start) as u64 {
        return Err(CheckpointError::BodyLength {
            body_bytes,
            held_bytes: (trailer_start - body_start) as u64,
        });
    }
    Ok(Header {
        at: LogPoint {
            seq: u64_at(16),
            segment_first_seq: u64_at(32),
            frame_end_offset: u64_at(40),
            chain: bytes[48..80].try_into().expect("32 bytes"),
        },
        ts_ms: u64_at(24),
        body_bytes,
        request_seed: u64_at(88),
    })
}

/// Decodes a whole checkpoint file into `mirror`, which must be empty (its
/// request index is replaced by the file's, with the file's seed). Checks
/// the header ([`decode_header`]) and every item: the prelude against the
/// body, moments in strictly rising id order with well-formed packed
/// texts, each half ending where the prelude says, the request index
/// section (rows in strictly rising seq order, no request id twice, known
/// op kinds, a table that finds every row: [`StoredIndexError`]), every
/// count within the bytes, no byte left over. Errors: [`CheckpointError`];
/// a checksum mismatch is the error whenever the trailer does not match.
///
/// The request index section is copied out of `bytes` and used from the
/// copy ([`load`] uses it in place through the file's mapping instead).
///
/// On several threads (the load was one thread's work, mostly the kernel
/// zeroing the pages of a fresh mirror, while the other core waited): the
/// trailer's hash, each half of the moments, and the request index section
/// with the other items are checked and decoded at once. The body is only
/// ever read with bounds checks, so decoding it before its hash is known
/// is safe; nothing decoded is returned unless the hash matches.
pub fn decode(bytes: &[u8], mirror: Mirror) -> Result<(Header, Mirror), CheckpointError> {
    decode_with(bytes, None, mirror)
}

/// [`decode`] of `bytes`, which are `shared`'s own when given: then the
/// request index section is used where it lies in `shared`, not copied.
fn decode_with(
    bytes: &[u8],
    shared: Option<&Arc<Backing>>,
    mut mirror: Mirror,
) -> Result<(Header, Mirror), CheckpointError> {
    let header = header_fields(bytes)?;
    let body_end = bytes.len() - TRAILER_BYTES;
    let (trailer, decoded) = std::thread::scope(|scope| {
        let trailer = scope.spawn(|| check_trailer(bytes));
        let decoded = decode_body(bytes, body_end, shared, &header, &mut mirror, scope);
        (trailer.join(), decoded)
    });
    trailer.map_err(|_| CheckpointError::Panicked {
        what: "the checksum thread",
    })??;
    decoded?;
    Ok((header, mirror))
}

/// Moments decoded on one thread: the moments of a stretch of the body, in
/// order, and how many of them are live.
type MomentRun = (Vec<(Id, Box<Moment>)>, usize);

/// Decodes `count` moments from `r`, in strictly rising id order, into a
/// vector with room for `capacity`; they must end at body byte `end`, or
/// for `None` in the zero padding before the 8-byte boundary (of the
/// file) after them, at body byte `padded_to`.
fn decode_moments(
    r: &mut Reader<'_>,
    count: usize,
    capacity: usize,
    (end, padded_to): (Option<usize>, usize),
) -> Result<MomentRun, CheckpointError> {
    let mut list: Vec<(Id, Box<Moment>)> = Vec::with_capacity(capacity.max(count));
    let mut live = 0;
    for _ in 0..count {
        let id = Id(r.u128()?);
        let texts: Box<[u8]> = r.bytes("moment texts")?.into();
        let captured_at_ms = i64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let created_at_ms = r.leb("created_at_ms")?;
        let version =
            u32::try_from(r.leb("version")?).map_err(|_| CheckpointError::VersionAboveU32)?;
        let flags = r.take(3)?;
        let deleted = match flags[0] {
            0 => false,
            1 => true,
            flag => return Err(CheckpointError::DeletedFlag { id, flag }),
        };
        let id_count = r.count("moment ids", 16)?;
        let mut ids = ThinVec::with_capacity(id_count);
        for _ in 0..id_count {
            ids.push(Id(r.u128()?));
        }
        let moment = Moment::from_packed_parts(
            id,
            texts,
            captured_at_ms,
            (created_at_ms, version, deleted),
            flags[1],
            flags[2],
            ids,
        )?;
        if list.last().is_some_and(|(last, _)| *last >= id) {
            return Err(CheckpointError::MomentOrder { id });
        }
        live += usize::from(!deleted);
        list.push((id, Box::new(moment)));
    }
    let expected = end.unwrap_or_else(|| {
        // The body starts at a multiple of 8 in the file.
        let padded = r.at.next_multiple_of(8);
        let zeros = r
            .buf
            .get(r.at..padded)
            .is_some_and(|p| p.iter().all(|&b| b == 0));
        if zeros && padded == padded_to {
            r.at
        } else {
            padded_to
        }
    });
    if r.at != expected {
        return Err(CheckpointError::MomentsEnd {
            found: r.at,
            expected,
        });
    }
    Ok((list, live))
}

/// Fewest bytes of one encoded moment (id, texts' length, capture time,
/// created_at, version, three flags, id count).
const MIN_MOMENT_BYTES: usize = 16 + 1 + 8 + 1 + 1 + 3 + 1;

/// The body of [`decode`] (the file's bytes up to `body_end`): the prelude;
/// the second half of the moments on a thread of `scope` and the first
/// half on another, each from where the prelude says it starts; the
/// request index section and the other items on the caller's, which joins
/// both. Body offsets in errors count from the body's start.
fn decode_body<'scope, 'env>(
    file: &'env [u8],
    body_end: usize,
    shared: Option<&Arc<Backing>>,
    header: &Header,
    mirror: &mut Mirror,
    scope: &'scope std::thread::Scope<'scope, 'env>,
) -> Result<(), CheckpointError> {
    let body = &file[HEADER_BYTES..body_end];
    let prelude = |k: usize| {
        body.get(8 * k..8 * k + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or(CheckpointError::Prelude {
                why: "the body is shorter than its prelude",
            })
    };
    let (moments, split, split_at, requests_at) =
        (prelude(0)?, prelude(1)?, prelude(2)?, prelude(3)?);
    let fits = |value: u64| usize::try_from(value).ok().filter(|&v| v <= body.len());
    let bad = |why| CheckpointError::Prelude { why };
    let (Some(split_at), Some(requests_at)) = (fits(split_at), fits(requests_at)) else {
        return Err(bad("an offset lies past the body"));
    };
    if split_at < PRELUDE_BYTES || requests_at < split_at {
        return Err(bad("its offsets are out of order"));
    }
    if !(HEADER_BYTES + requests_at).is_multiple_of(8) {
        return Err(bad("the request index is not at a multiple of 8 bytes"));
    }
    // The moments must fit their bytes (no huge allocation for a forged
    // count); the split is the middle.
    let moments = usize::try_from(moments)
        .ok()
        .filter(|&m| m <= (requests_at - PRELUDE_BYTES) / MIN_MOMENT_BYTES)
        .ok_or(bad("more moments than their bytes hold"))?;
    if split != (moments / 2) as u64 {
        return Err(bad("the split is not the middle moment"));
    }
    let split = moments / 2;
    // Each half reads only its own stretch; the second half ends in the
    // zero padding before the request index.
    let mut early = Reader {
        buf: &body[..split_at],
        at: PRELUDE_BYTES,
    };
    let mut late = Reader {
        buf: &body[..requests_at],
        at: split_at,
    };
    let late =
        scope.spawn(move || decode_moments(&mut late, moments - split, 0, (None, requests_at)));
    let early =
        scope.spawn(move || decode_moments(&mut early, split, moments, (Some(split_at), split_at)));
    let rest = decode_rest(file, body_end, requests_at, shared, header, mirror);
    let panicked = |_| CheckpointError::Panicked {
        what: "a moment decoding thread",
    };
    let early = early.join().map_err(panicked)?;
    let late = late.join().map_err(panicked)?;
    rest?;
    let (mut list, early_live) = early?;
    let (late_list, late_live) = late?;
    if let (Some((last, _)), Some((first, _))) = (list.last(), late_list.first()) {
        if last >= first {
            return Err(CheckpointError::MomentOrder { id: *first });
        }
    }
    list.extend(late_list);
    mirror.moments = list.into_iter().collect();
    mirror.live_moments = early_live + late_live;
    Ok(())
}

/// The request index section at body byte `requests_at` and the other
/// items after it; checks that no byte is left over, and sets the mirror's
/// request index, seq and time.
fn decode_rest(
    file: &[u8],
    body_end: usize,
    requests_at: usize,
    shared: Option<&Arc<Backing>>,
    header: &Header,
    mirror: &mut Mirror,
) -> Result<(), CheckpointError> {
    let section_at = HEADER_BYTES + requests_at;
    let (backing, start, limit) = match shared {
        Some(shared) => (Arc::clone(shared), section_at, body_end),
        None => {
            let len = stored::section_extent(file, section_at, body_end)?;
            let copy = file[section_at..section_at + len].to_vec();
            (Arc::new(Backing::Owned(copy)), 0, len)
        }
    };
    let (requests, section_end) =
        stored::decode_section(&backing, start, limit, header.request_seed, header.at.seq)?;
    mirror.requests = RequestIndex::from_stored(header.request_seed, requests);
    let body = &file[HEADER_BYTES..body_end];
    let mut r = Reader {
        buf: body,
        at: section_end - start + requests_at,
    };
    for media in r.items::<Media>("media")? {
        if mirror.media.insert(media.id, media).is_some() {
            return Err(CheckpointError::IdTwice { what: "media" });
        }
    }
    for turn in r.items::<Turn>("turns")? {
        if mirror.turns.insert(turn.id, turn).is_some() {
            return Err(CheckpointError::IdTwice { what: "turn" });
        }
    }
    for mark in r.items::<Mark>("marks")? {
        if mirror.marks.insert(mark.id.clone(), mark).is_some() {
            return Err(CheckpointError::IdTwice { what: "mark" });
        }
    }
    for job in r.items::<Job>("jobs")? {
        if mirror.jobs.insert(job.job_id.clone(), job).is_some() {
            return Err(CheckpointError::IdTwice { what: "job" });
        }
    }
    for recall in r.items::<Recall>("recalls")? {
        if mirror.recalls.insert(recall.id.clone(), recall).is_some() {
            return Err(CheckpointError::IdTwice { what: "recall" });
        }
    }
    for message in r.items::<Message>("messages")? {
        mirror
            .threads
            .entry(message.thread_id)
            .or_default()
            .insert(message.id);
        if mirror.messages.insert(message.id, message).is_some() {
            return Err(CheckpointError::IdTwice { what: "message" });
        }
    }
    if r.at != body.len() {
        return Err(CheckpointError::TrailingBytes {
            trailing_bytes: body.len() - r.at,
        });
    }
    mirror.seq = header.at.seq;
    mirror.ts_ms = header.ts_ms;
    Ok(())
}

/// A bounds-checked cursor over a body.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(CheckpointError::BodyEnds { at: self.at })?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u128(&mut self) -> Result<u128, CheckpointError> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().expect("16 bytes"),
        ))
    }

    fn leb(&mut self, what: &'static str) -> Result<u64, CheckpointError> {
        let (value, next) = checked_read_leb128(self.buf, self.at)
            .ok_or(CheckpointError::BadNumber { what, at: self.at })?;
        self.at = next;
        Ok(value)
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], CheckpointError> {
        let (bytes, next) = checked_read(self.buf, self.at)
            .ok_or(CheckpointError::RunsPast { what, at: self.at })?;
        self.at = next;
        Ok(bytes)
    }

    /// A count of items of at least `min_item_bytes` each, refused when
    /// the rest of the body cannot hold that many.
    fn count(
        &mut self,
        what: &'static str,
        min_item_bytes: usize,
    ) -> Result<usize, CheckpointError> {
        let count = self.leb(what)?;
        let room = (self.buf.len() - self.at) / min_item_bytes;
        usize::try_from(count)
            .ok()
            .filter(|&c| c <= room)
            .ok_or(CheckpointError::TooMany { what, count })
    }

    fn items<T: serde::de::DeserializeOwned>(
        &mut self,
        what: &'static str,
    ) -> Result<Vec<T>, CheckpointError> {
        let count = self.count(what, 1)?;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let bytes = self.bytes(what)?;
            out.push(
                crate::codec::decode(bytes)
                    .map_err(|source| CheckpointError::Item { what, source })?,
            );
        }
        Ok(out)
    }
}

// ---- Files ----------------------------------------------------------------

/// A checkpoint file that was not used, and why (checksum, version, a
/// chain value that does not match the log, a seq beyond the log, ...).
#[derive(Debug)]
pub struct Ignored {
    /// The file.
    pub file: PathBuf,
    /// Why (its text does not name the file).
    pub why: CheckpointError,
}

/// A checkpoint that was loaded: its file, header and mirror.
#[derive(Debug)]
pub struct Loaded {
    /// The file.
    pub file: PathBuf,
    /// Its header.
    pub header: Header,
    /// The mirror at `header.at.seq`.
    pub mirror: Mirror,
}

/// The checkpoint files in `data_dir`, newest (highest seq) first, by file
/// name; a missing directory lists as empty.
pub fn list(data_dir: &Path) -> Vec<(u64, PathBuf)> {
    list_named(data_dir, parse_file_name)
}

/// The temporary files of checkpoint writes a crash cut short
/// (`<seq>.ckpt.tmp`, [`TMP_SUFFIX`]) in `data_dir`, newest first. The
/// engine never reads them and removes them at its next start
/// ([`remove_temp_files`]); until then they hold the bytes written to them,
/// which `spark-replay audit erasure` looks for (SPEC section 13).
pub fn list_temp_files(data_dir: &Path) -> Vec<(u64, PathBuf)> {
    list_named(data_dir, |name| {
        parse_file_name(&format!("{}{SUFFIX}", name.strip_suffix(TMP_SUFFIX)?))
    })
}

/// The files of `data_dir`'s checkpoint directory whose name `seq_of`
/// reads a seq from, newest first.
fn list_named(data_dir: &Path, seq_of: impl Fn(&str) -> Option<u64>) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(checkpoint_dir(data_dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((seq_of(e.file_name().to_str()?)?, e.path())))
        .collect();
    out.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    out
}

/// Reads and checks one checkpoint file against the log in `log_dir`:
/// decodes it into `empty` ([`decode`]), checks that its name's seq is its
/// header's, and that the chain value at its point equals the log's
/// ([`chain_at`]). Errors: [`CheckpointError`] (the caller names the file).
///
/// The file is mapped, not copied (a 10-million-moment checkpoint is 1.7
/// GB): checkpoint files are only ever created whole by a rename and
/// removed by unlinking, never written in place, so the mapping cannot
/// change under the decoder.
pub fn load(
    path: &Path,
    log_dir: &Path,
    empty: Mirror,
) -> Result<(Header, Mirror), CheckpointError> {
    let file = open_regular(path)?;
    // What the file was before its bytes are checked: the mapping used in
    // place is watched against it (a write in place after this is seen).
    let seen = file
        .metadata()
        .map_err(|source| CheckpointError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
    // SAFETY: see above: nothing writes a checkpoint file in place.
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|source| CheckpointError::Unmappable {
            path: path.to_owned(),
            source,
        })?;
    let shared = Arc::new(Backing::Mapped(map));
    let bytes = match &*shared {
        Backing::Mapped(map) => &map[..],
        Backing::Owned(bytes) => &bytes[..],
    };
    // The trailer's hash is checked by `decode`, beside the body.
    let header = header_fields(bytes)?;
    check_against_log(path, &header, log_dir)?;
    let (header, mut mirror) = decode_with(bytes, Some(&shared), empty)?;
    // The request index stays in the file: mapped alone, so the rest of
    // the file (moments and items, now in the mirror) leaves the process.
    let remapped = mirror
        .requests
        .stored()
        .map(|stored| {
            let watched = stored::WatchedFile::new(&file, path, &seen)?;
            stored.remapped(&file, watched)
        })
        .transpose()
        .map_err(|source| CheckpointError::Unmappable {
            path: path.to_owned(),
            source,
        })?;
    if let Some(stored) = remapped {
        mirror.requests.set_stored(stored);
    }
    Ok((header, mirror))
}

/// Opens the checkpoint file at `path` for reading, once its metadata
/// (symbolic links followed) says it is a regular file: opening a FIFO
/// would wait for a writer for ever. Errors: [`CheckpointError::NotAFile`],
/// [`CheckpointError::Unreadable`].
fn open_regular(path: &Path) -> Result<std::fs::File, CheckpointError> {
    let unreadable = |source| CheckpointError::Unreadable {
        path: path.to_owned(),
        source,
    };
    if !std::fs::metadata(path).map_err(unreadable)?.is_file() {
        return Err(CheckpointError::NotAFile);
    }
    std::fs::File::open(path).map_err(unreadable)
}

/// The cheap checks of one checkpoint file, without reading its body:
/// magic, format version, reserved bytes, the file's length against the
/// header's body length, the name's seq, and the chain value against the
/// log. What startup does to pick a checkpoint before loading it (the
/// checksum and the body are checked by [`load`], on another thread).
/// Errors: [`CheckpointError`] (the caller names the file).
pub fn peek(path: &Path, log_dir: &Path) -> Result<Header, CheckpointError> {
    let header = peek_header(path)?;
    check_against_log(path, &header, log_dir)?;
    Ok(header)
}

/// [`peek`] without the checks against the log: magic, format version,
/// reserved bytes and the file's length against the header's body length,
/// from the header's bytes alone.
fn peek_header(path: &Path) -> Result<Header, CheckpointError> {
    use std::io::Read as _;
    let unreadable = |source| CheckpointError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let mut file = open_regular(path)?;
    let len = file.metadata().map_err(unreadable)?.len();
    let mut head = [0u8; HEADER_BYTES];
    file.read_exact(&mut head)
        .map_err(|_| CheckpointError::TooShort { len_bytes: len })?;
    if head[..8] != MAGIC {
        return Err(CheckpointError::BadMagic);
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    if version != FORMAT_VERSION {
        return Err(CheckpointError::Version { found: version });
    }
    if head[10..16] != [0; 6] {
        return Err(CheckpointError::ReservedBytes);
    }
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let body_bytes = u64_at(80);
    if Some(len) != body_bytes.checked_add((HEADER_BYTES + TRAILER_BYTES) as u64) {
        return Err(CheckpointError::FileLength {
            body_bytes,
            file_bytes: len,
        });
    }
    let header = Header {
        at: LogPoint {
            seq: u64_at(16),
            segment_first_seq: u64_at(32),
            frame_end_offset: u64_at(40),
            chain: head[48..80].try_into().expect("32 bytes"),
        },
        ts_ms: u64_at(24),
        body_bytes,
        request_seed: u64_at(88),
    };
    Ok(header)
}

/// The name's seq is the header's, and the chain value at the header's
/// point equals the log's.
fn check_against_log(path: &Path, header: &Header, log_dir: &Path) -> Result<(), CheckpointError> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_file_name);
    if named != Some(header.at.seq) {
        return Err(CheckpointError::NameMismatch {
            path: path.to_owned(),
            seq: header.at.seq,
        });
    }
    let at = header.at;
    if at.segment_first_seq == 0 || at.segment_first_seq > at.seq {
        return Err(CheckpointError::SegmentCannotHold {
            segment_first_seq: at.segment_first_seq,
            seq: at.seq,
        });
    }
    let chain = chain_at(log_dir, at.segment_first_seq, at.frame_end_offset)?;
    if chain != at.chain {
        return Err(CheckpointError::ChainMismatch {
            seq: at.seq,
            segment_first_seq: at.segment_first_seq,
            frame_end_offset: at.frame_end_offset,
        });
    }
    Ok(())
}

/// The newest checkpoint file in `data_dir` that [`peek`] accepts against
/// the log in `log_dir`, with its header, and every newer file that was
/// ignored, with why.
pub fn newest_candidate(
    data_dir: &Path,
    log_dir: &Path,
) -> (Option<(PathBuf, Header)>, Vec<Ignored>) {
    let mut ignored = Vec::new();
    for (_, file) in list(data_dir) {
        match peek(&file, log_dir) {
            Ok(header) => return (Some((file, header)), ignored),
            Err(why) => ignored.push(Ignored { file, why }),
        }
    }
    (None, ignored)
}

/// A checkpoint that proves the log lost committed records: a whole file
/// (header, length, name and BLAKE3 trailer all check) whose point lies
/// past the end of the log, its segment missing or shorter than the
/// point's offset. A checkpoint is only ever written from the committed
/// log, so the ops up to its seq were acknowledged; a log that no longer
/// holds them was truncated or lost segments (or the file was copied in
/// from another, longer log: the operator moves it away to start anyway).
/// A log that reaches the seq is no such proof ([`past_the_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastTheLog {
    /// The checkpoint file.
    pub file: PathBuf,
    /// Its seq: every op up to it was committed.
    pub seq: u64,
    /// Where the log falls short, in words: the segment is missing, or
    /// holds fewer bytes than the point's offset.
    pub why: String,
}

impl std::fmt::Display for PastTheLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checkpoint {} shows that seq {} was committed, but {}: the log has lost \
             acknowledged records (a truncated or deleted segment, or damage in its last \
             batch). Restore the log (spark-replay restore from the archive, or a copy), \
             or move the checkpoint file away to accept the loss",
            self.file.display(),
            self.seq,
            self.why
        )
    }
}

/// Where the log in `log_dir` falls short of `at`, in words, or `None`
/// when its segment exists and holds at least `at.frame_end_offset` bytes
/// (whether those bytes match is the chain check's question, not this).
fn short_of(log_dir: &Path, at: &LogPoint) -> Option<String> {
    let path = log_dir.join(segment_file_name(at.segment_first_seq));
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("segment {} is missing", path.display()))
        }
        Err(_) => None,
        Ok(meta) if meta.len() < at.frame_end_offset => Some(format!(
            "segment {} holds {} bytes, and the record at seq {} ended at offset {}",
            path.display(),
            meta.len(),
            at.seq,
            at.frame_end_offset
        )),
        Ok(_) => None,
    }
}

/// The newest checkpoint in `data_dir` that proves the log in `log_dir`
/// lost committed records ([`PastTheLog`]), if any: its point lies past
/// the log and the log does not reach its seq. Reads only headers,
/// and the whole file of a checkpoint whose point is past the log (to
/// check its trailer: a damaged file proves nothing and is skipped, as
/// startup ignores it). Startup refuses such a log before recovery changes
/// anything; `spark-replay verify` reports it as a fault.
pub fn past_the_log(data_dir: &Path, log_dir: &Path) -> Option<PastTheLog> {
    list(data_dir).into_iter().find_map(|(seq, file)| {
        let header = peek_header(&file).ok()?;
        if header.at.seq != seq
            || header.at.segment_first_seq == 0
            || header.at.segment_first_seq > seq
        {
            return None;
        }
        let why = short_of(log_dir, &header.at)?;
        (whole(&file, &header) && !log_reaches(log_dir, seq)).then_some(PastTheLog {
            file,
            seq,
            why,
        })
    })
}

/// True when the log in `log_dir` holds committed records up to `seq`
/// (read only, as the tools read a live log): then a checkpoint at `seq`
/// whose point is not in this log (its segment missing or shorter) does
/// not describe this log, a copy from another log or from before a
/// compaction rewrote the segment, and proves nothing lost; it is ignored
/// as any checkpoint that does not check. False when the log cannot be
/// read that far.
fn log_reaches(log_dir: &Path, seq: u64) -> bool {
    LogReader::open_live_from(log_dir, Arc::new(OsFs), u32::MAX, seq).is_ok_and(|reader| {
        reader
            .segments()
            .last()
            .is_some_and(|last| last.last_seq >= seq)
    })
}

/// The newest whole checkpoint in `data_dir` ([`PastTheLog`]'s checks)
/// whose seq is past `log_end_seq`, the last seq of the recovered log: the
/// same proof, for a log whose segment is long enough but whose recovery
/// ended before the checkpoint's seq (zeros where committed records were,
/// or damage in the last batch cut as a torn tail). Reads the whole file
/// only of checkpoints past the log.
pub fn committed_past(data_dir: &Path, log_end_seq: u64) -> Option<PastTheLog> {
    list(data_dir)
        .into_iter()
        .take_while(|(seq, _)| *seq > log_end_seq)
        .find_map(|(seq, file)| {
            let header = peek_header(&file).ok()?;
            (header.at.seq == seq && whole(&file, &header)).then(|| PastTheLog {
                file,
                seq,
                why: format!("the recovered log ends at seq {log_end_seq}"),
            })
        })
}

/// The whole file at `file` checks against its `header` as read by
/// [`peek_header`]: the same header, and its BLAKE3 trailer holds.
fn whole(file: &Path, header: &Header) -> bool {
    std::fs::read(file).is_ok_and(|bytes| {
        header_fields(&bytes).is_ok_and(|h| h == *header) && check_trailer(&bytes).is_ok()
    })
}

/// The newest checkpoint in `data_dir` that [`load`] accepts against the
/// log in `log_dir`, decoded into a fresh mirror made by `empty` (called
/// once per file tried), and every newer file that was ignored, with why.
pub fn load_newest(
    data_dir: &Path,
    log_dir: &Path,
    mut empty: impl FnMut() -> Mirror,
) -> (Option<Loaded>, Vec<Ignored>) {
    let mut ignored = Vec::new();
    for (_, file) in list(data_dir) {
        match load(&file, log_dir, empty()) {
            Ok((header, mirror)) => {
                return (
                    Some(Loaded {
                        file,
                        header,
                        mirror,
                    }),
                    ignored,
                )
            }
            Err(why) => ignored.push(Ignored { file, why }),
        }
    }
    (None, ignored)
}

/// Writes `bytes` as the checkpoint at `seq` in `data_dir` on `fs`
/// ([`OsFs`] outside tests), through [`Fs::write_file_durably`]: a temp
/// file `<name>.tmp`, fsync, rename, directory fsync (the directory is
/// created, durably, if missing). Removes leftover temp files first (a
/// crash during an earlier write). Returns the path. Errors: the I/O error,
/// naming the file or directory ([`CheckpointError::Dir`],
/// [`CheckpointError::Write`]).
pub fn write_file(
    fs: &dyn Fs,
    data_dir: &Path,
    seq: u64,
    bytes: &[u8],
) -> Result<PathBuf, CheckpointError> {
    let dir = checkpoint_dir(data_dir);
    let io = |what: &'static str, path: &Path, source: std::io::Error| CheckpointError::Dir {
        what,
        path: path.to_owned(),
        source,
    };
    match fs.list(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs.create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
            fs.sync_dir(data_dir)
                .map_err(|e| io("fsync", data_dir, e))?;
        }
        _ => remove_temp_files(fs, data_dir),
    }
    let path = dir.join(file_name(seq));
    match fs.write_file_durably(&path, bytes) {
        Ok(()) => Ok(path),
        Err(source) => Err(CheckpointError::Write { path, source }),
    }
}

/// Removes `*.ckpt.tmp` files in `data_dir`'s checkpoint directory on `fs`
/// (what a crash during a write leaves; never read).
pub fn remove_temp_files(fs: &dyn Fs, data_dir: &Path) {
    for path in fs.list(&checkpoint_dir(data_dir)).into_iter().flatten() {
        if path.to_string_lossy().ends_with(TMP_SUFFIX) {
            let _ = fs.remove_file(&path);
        }
    }
}

/// Removes all but the newest `keep` *valid* checkpoint files in
/// `data_dir` (by [`peek`] against the log in `log_dir`). A file that fails
/// its checks neither counts towards `keep` nor is removed (startup ignores
/// it with a warning), so a damaged, stale or foreign file named after a
/// later seq never pushes out the good ones. Returns the files removed.
pub fn prune(data_dir: &Path, log_dir: &Path, keep: usize) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let valid = list(data_dir)
        .into_iter()
        .filter(|(_, file)| peek(file, log_dir).is_ok());
    for (_, file) in valid.skip(keep) {
        if std::fs::remove_file(&file).is_ok() {
            removed.push(file);
        }
    }
    removed
}

/// What [`build`] did.
#[derive(Debug)]
pub struct Built {
    /// The checkpoint written.
    pub file: PathBuf,
    /// Its point in the log.
    pub at: LogPoint,
    /// Its size in bytes.
    pub bytes: u64,
    /// The checkpoint it started from, if one was valid.
    pub from: Option<PathBuf>,
    /// Newer checkpoint files that were ignored, with why.
    pub ignored: Vec<Ignored>,
}

/// Builds and writes a checkpoint from the log alone (and the newest valid
/// checkpoint): loads that checkpoint if any, folds every committed record
/// after it up to `up_to_seq` from a live view of the log in `log_dir` (the
/// writer may be appending), writes the result at the last record read, and
/// keeps the newest `keep` files. A running engine passes its published
/// head's seq as `up_to_seq`: a batch is published only after its
/// fdatasync, so a checkpoint never stands past what is durable (a
/// checkpoint past the log is read as proof of lost acknowledged records,
/// [`PastTheLog`]); offline callers pass `u64::MAX`. Safe beside the running engine: it reads the log
/// and never touches the engine's mirror. `stop` is asked now and then; a
/// build it stops writes nothing. `Ok(None)`: nothing new since the newest
/// checkpoint, or stopped. The file is written through `fs` ([`write_file`];
/// a running engine passes its own seam, so fault-injection tests reach
/// the write); the log and older checkpoints are read from the disk.
/// Errors: [`CheckpointError`] (the log unreadable, a record that does not
/// fold, the write).
pub fn build(
    fs: &dyn Fs,
    data_dir: &Path,
    log_dir: &Path,
    max_record_bytes: u32,
    keep: usize,
    up_to_seq: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Built>, CheckpointError> {
    let (loaded, ignored) = load_newest(data_dir, log_dir, Mirror::new);
    let (mut mirror, from) = match loaded {
        Some(l) => (l.mirror, Some(l.file)),
        None => (Mirror::new(), None),
    };
    let start_seq = mirror.seq;
    // Only the records after the loaded checkpoint are folded: the log is
    // read from the segment holding the first of them (the segments before
    // are the checkpoint's, checked by startup's links and the scrub).
    let reader =
        LogReader::open_live_from(log_dir, Arc::new(OsFs), max_record_bytes, start_seq + 1)?;
    let mut point = None;
    let mut fold_error = None;
    let mut visited = 0u64;
    let options = ScanOptions {
        verify_chain: false,
        max_record_bytes,
    };
    reader.scan(options, |segment, record| {
        visited += 1;
        if visited.is_multiple_of(65_536) && stop() {
            point = None;
            return ControlFlow::Break(());
        }
        if record.seq <= start_seq {
            return ControlFlow::Continue(());
        }
        if record.seq > up_to_seq {
            return ControlFlow::Break(());
        }
        if let Err(source) = crate::replay::replay_record(&mut mirror, &record) {
            fold_error = Some(CheckpointError::Fold {
                seq: record.seq,
                source,
            });
            return ControlFlow::Break(());
        }
        point = Some((
            record.seq,
            segment.first_seq,
            record.offset + record_size(record.payload.len()) as u64,
        ));
        ControlFlow::Continue(())
    })?;
    if let Some(e) = fold_error {
        return Err(e);
    }
    let Some((seq, segment_first_seq, frame_end_offset)) = point else {
        return Ok(None);
    };
    if stop() {
        return Ok(None);
    }
    drop(reader);
    let at = LogPoint {
        seq,
        segment_first_seq,
        frame_end_offset,
        chain: chain_at(log_dir, segment_first_seq, frame_end_offset)?,
    };
    let bytes = encode(&mirror, &at);
    drop(mirror);
    let file = write_file(fs, data_dir, seq, &bytes)?;
    prune(data_dir, log_dir, keep);
    Ok(Some(Built {
        file,
        at,
        bytes: bytes.len() as u64,
        from,
        ignored,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{MarkKeep, MessagePost, Op, OpBody};

    /// A mirror with moments (edited, deleted, without texts), request
    /// rows with id and name entities, a mark and a message.
    fn sample_mirror(creates: u64, tail: u64) -> Mirror {
        // A fixed seed: the request index's table in the file follows it.
        let mut mirror = Mirror::with_request_seed(0x5eed);
        let mut seq = 0;
        let mut apply = |mirror: &mut Mirror, body: OpBody| {
            seq += 1;
            mirror
                .apply(Op {
                    erased: false,
                    seq,
                    ts_ms: crate::synth::BASE_MS + seq,
                    body,
                })
                .expect("folds");
        };
        for k in 0..creates {
            apply(&mut mirror, crate::synth::moment_create(k));
        }
        for j in 0..tail {
            apply(&mut mirror, crate::synth::tail_op(creates, tail, j));
        }
        apply(
            &mut mirror,
            OpBody::MomentCreate(crate::op::MomentCreate {
                id: Id::from_parts(crate::synth::BASE_MS + 1_000_000, 5),
                request_id: None,
                device: "phone-2".into(),
                text: None,
                caption: None,
                lang: None,
                captured_at_ms: Some(-5),
            }),
        );
        // The third photo's original (version 2 keeps the photo, issue 27).
        apply(
            &mut mirror,
            OpBody::MediaPut(crate::op::MediaPut {
                id: Id::from_parts(crate::synth::BASE_MS + 1_000_001, 6),
                moment_id: Id::from_parts(crate::synth::BASE_MS + 1_000_000, 5),
                role: crate::op::MediaRole::Original,
                sha256: crate::op::Sha256([0xab; 32]),
                size_bytes: 1234,
                content_type: "image/jpeg".into(),
                device: "phone-2".into(),
                photo: 2,
            }),
        );
        apply(
            &mut mirror,
            OpBody::MarkKeep(MarkKeep {
                id: "keep:pain".into(),
                phrase: "pain".into(),
                moment_id: None,
                device: "phone-1".into(),
            }),
        );
        apply(
            &mut mirror,
            OpBody::MessagePost(MessagePost {
                id: Id::from_parts(crate::synth::BASE_MS + 2_000_000, 9),
                thread_id: Id::from_parts(crate::synth::BASE_MS, 0),
                body: "hello".into(),
                device: "phone-1".into(),
            }),
        );
        mirror
    }

    fn point(mirror: &Mirror) -> LogPoint {
        LogPoint {
            seq: mirror.seq,
            segment_first_seq: 1,
            frame_end_offset: 4096,
            chain: [7; 32],
        }
    }

    #[test]
    fn round_trips_the_whole_mirror() {
        let mirror = sample_mirror(50, 40);
        assert!(mirror.deleted_moments() > 0 && !mirror.marks.is_empty());
        let bytes = encode(&mirror, &point(&mirror));
        let (header, back) = decode(&bytes, Mirror::new()).expect("decodes");
        assert_eq!(header.at, point(&mirror));
        assert_eq!(back, mirror);
        assert_eq!(back.digest(), mirror.digest());
        assert_eq!(back.live_moments, mirror.live_moments);
        assert_eq!(back.threads, mirror.threads);
        // One state, one file: encoding the decoded mirror gives the same
        // bytes (it hashes request ids with the file's seed).
        assert_eq!(back.requests.seed(), 0x5eed);
        assert_eq!(encode(&back, &point(&back)), bytes);
    }

    /// Pinned: the bytes of a small checkpoint. A change to the layout
    /// must bump [`FORMAT_VERSION`] (and CHECKPOINT.md) and this vector.
    #[test]
    fn pinned_vector() {
        let mirror = sample_mirror(2, 1);
        let bytes = encode(&mirror, &point(&mirror));
        assert_eq!(
            blake3::hash(&bytes).to_hex().as_str(),
            PINNED_HASH,
            "checkpoint bytes changed: {}",
            hex::encode(&bytes)
        );
        assert_eq!(bytes.len(), PINNED_LEN);
    }

    const PINNED_HASH: &str = "7384614e4a2ecf94ac7e6dd0f2fc8c9dc40a3535d7aacbfe263e700146fbca11";
    const PINNED_LEN: usize = 978;

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused_without_panic() {
        let mirror = sample_mirror(3, 2);
        let bytes = encode(&mirror, &point(&mirror));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x01;
            assert!(
                decode(&bad, Mirror::new()).is_err(),
                "flip at {at} accepted"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], Mirror::new()).is_err(),
                "cut at {len}"
            );
        }
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mirror = sample_mirror(3, 0);
        let mut bytes = encode(&mirror, &point(&mirror));
        // The version before (1, media without their photo) and one after.
        for other in [FORMAT_VERSION - 1, FORMAT_VERSION + 1] {
            bytes[8..10].copy_from_slice(&other.to_le_bytes());
            let trailer = bytes.len() - TRAILER_BYTES;
            let hash = blake3::hash(&bytes[..trailer]);
            bytes[trailer..].copy_from_slice(hash.as_bytes());
            let error = decode(&bytes, Mirror::new()).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains(&format!("format version {other}")),
                "{error}"
            );
        }
    }

    /// A body that is well framed (checksum recomputed) but lies about its
    /// contents is refused, never a panic: bad packed texts, counts past
    /// the end, repeated ids.
    #[test]
    fn forged_bodies_with_valid_checksums_are_refused() {
        let reseal = |mut bytes: Vec<u8>| {
            let trailer = bytes.len() - TRAILER_BYTES;
            let hash = blake3::hash(&bytes[..trailer]);
            bytes[trailer..].copy_from_slice(hash.as_bytes());
            bytes
        };
        let mirror = sample_mirror(3, 2);
        let bytes = encode(&mirror, &point(&mirror));
        let mut refused = 0;
        for at in HEADER_BYTES..bytes.len() - TRAILER_BYTES {
            for flip in [0x01u8, 0x80, 0xFF] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                match decode(&reseal(bad), Mirror::new()) {
                    Err(_) => refused += 1,
                    // Some flips give another valid state (a digit of a
                    // text, a timestamp): then it must decode cleanly.
                    Ok((_, other)) => assert_eq!(other.seq, mirror.seq),
                }
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(file_name(42), "00000000000000000042.ckpt");
        assert_eq!(parse_file_name(&file_name(42)), Some(42));
        assert_eq!(parse_file_name("42.ckpt"), None);
        assert_eq!(parse_file_name("00000000000000000042.ckpt.tmp"), None);
    }

    /// A checkpoint written through [`MemFs`](spark_log_format::MemFs),
    /// crashed after every one of its file system calls and then cut off
    /// the power: each checkpoint file there is whole (old or new bytes,
    /// its trailer checks), none is torn, and a finished write survives.
    #[test]
    fn a_power_cut_at_any_point_of_a_write_leaves_whole_checkpoints() {
        use spark_log_format::MemFs;
        let data = Path::new("/data");
        let newer = sample_mirror(5, 3);
        let older = sample_mirror(2, 1);
        // The file at the new checkpoint's name that the write replaces, if
        // any: other whole checkpoint bytes.
        let (old, new) = (
            encode(&older, &point(&older)),
            encode(&newer, &point(&newer)),
        );
        assert_ne!(old, new);
        let target = checkpoint_dir(data).join(file_name(newer.seq));
        let stale = checkpoint_dir(data).join(format!("{:020}{TMP_SUFFIX}", 3));
        let disk = |existing: Option<&[u8]>| {
            let fs = MemFs::new();
            fs.insert_durable(&stale, b"a crash left this");
            if let Some(bytes) = existing {
                fs.insert_durable(&target, bytes);
            }
            fs
        };
        for existing in [None, Some(&old[..])] {
            let fs = disk(existing);
            let path = write_file(&fs, data, newer.seq, &new).expect("written");
            assert_eq!(path, target);
            assert_eq!(fs.paths(), vec![target.clone()], "temp files removed");
            MemFs::every_crash_point(
                || disk(existing),
                |fs| write_file(fs, data, newer.seq, &new),
                8,
                |fs, written, point| {
                    let now = fs.read(&target);
                    let whole = now.as_deref() == Some(&new[..]) || now.as_deref() == existing;
                    assert!(whole, "crash after {point:?}");
                    if let Some(bytes) = &now {
                        decode_header(bytes).expect("a whole checkpoint");
                    }
                    match written {
                        Ok(_) => assert_eq!(now.as_deref(), Some(&new[..])),
                        Err(e) => assert!(e.to_string().contains("/data/checkpoint"), "{e}"),
                    }
                },
            );
        }
    }

    /// An error injected at each file system call of a checkpoint's write
    /// (create, write, fsync, rename, directory fsync) is returned, naming
    /// the file (the worker logs it and tries again later: a checkpoint is
    /// derived state), and the file at its name is the old checkpoint or
    /// the new one, whole; no temporary file is left before the rename.
    #[test]
    fn an_injected_error_at_any_call_is_returned_and_leaves_whole_checkpoints() {
        use spark_log_format::{Fault, FaultOp, FaultyFs, MemFs};
        use std::sync::Arc;
        let data = Path::new("/data");
        let (older, newer) = (sample_mirror(2, 1), sample_mirror(5, 3));
        let (old, new) = (
            encode(&older, &point(&older)),
            encode(&newer, &point(&newer)),
        );
        let target = checkpoint_dir(data).join(file_name(newer.seq));
        for op in FaultOp::DURABLE_WRITE {
            let mem = Arc::new(MemFs::new());
            mem.insert_durable(&target, &old);
            let fs = FaultyFs::new(mem.clone());
            fs.fail_next(op, Fault::Os(5));
            let e = write_file(&fs, data, newer.seq, &new).expect_err("the fault is returned");
            assert!(e.to_string().contains("/data/checkpoint"), "{op:?}: {e}");
            let now = mem.read(&target);
            match op {
                // The rename happened: the new file is in place, durable or
                // not.
                FaultOp::SyncDir => assert_eq!(now.as_deref(), Some(&new[..]), "{op:?}"),
                _ => assert_eq!(now.as_deref(), Some(&old[..]), "{op:?}"),
            }
            assert_eq!(mem.paths(), vec![target.clone()], "{op:?}: no temp left");
        }
    }
}
