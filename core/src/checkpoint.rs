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
use spark_log_format::format::{segment_file_name, SegmentHeader};
use spark_log_format::{ChainValue, Fs, LogReader, OsFs, ScanOptions, HEADER_LEN};
use thin_vec::ThinVec;

use crate::ids::Id;
use crate::len_prefixed::{checked_read, checked_read_leb128, push, push_leb128};
use crate::mirror::{Job, Mark, Media, Message, Mirror, Moment, Recall, Turn};
use crate::op::{Entity, OpKind};
use crate::request_index::RequestRow;

/// The checkpoint format version this build writes and reads; a file with
/// another one is ignored.
pub const FORMAT_VERSION: u16 = 1;

/// The first 8 bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"SPKCKPT\0";

/// Bytes of the fixed header (magic to body length).
pub const HEADER_BYTES: usize = 88;

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
}

/// The chain value at byte `end` of segment `segment_first_seq` in
/// `log_dir`: BLAKE3 over the header's `chain_start` and the segment's bytes
/// up to `end`. Errors in words: the segment is missing, shorter than `end`
/// ("beyond the log"), or its header does not decode.
///
/// The segment is mapped, not copied: at startup this runs on up to 64 MiB
/// of the segment recovery reads next, and a copy cost a fresh process
/// that much zeroed memory and a copy.
pub fn chain_at(log_dir: &Path, segment_first_seq: u64, end: u64) -> Result<ChainValue, String> {
    let path = log_dir.join(segment_file_name(segment_first_seq));
    let file = std::fs::File::open(&path)
        .map_err(|e| format!("segment {} cannot be read: {e}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if end > len || end < HEADER_LEN as u64 {
        return Err(format!(
            "offset {end} is beyond the log (segment {} holds {len} bytes)",
            path.display()
        ));
    }
    // SAFETY: a segment's bytes are only ever appended after its last
    // acknowledged frame (or cut after it by recovery, which holds the
    // data directory's lock); the bytes below `end` read here are checked
    // against a chain value, so a change under the map is at worst a
    // mismatch (the reader maps live segments the same way).
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| format!("segment {} cannot be mapped: {e}", path.display()))?;
    let prefix = usize::try_from(end)
        .ok()
        .and_then(|end| map.get(..end))
        .ok_or_else(|| format!("offset {end} is beyond the log"))?;
    let header = SegmentHeader::decode(prefix)
        .map_err(|e| format!("segment {} header: {e:?}", path.display()))?;
    Ok(chain_value(&header.chain_start, prefix))
}

// ---- Encoding -------------------------------------------------------------

/// The whole file for `mirror` standing at `at` (`at.seq` must be
/// `mirror.seq`): header, body, trailer.
pub fn encode(mirror: &Mirror, at: &LogPoint) -> Vec<u8> {
    debug_assert_eq!(mirror.seq, at.seq);
    let mut body = Vec::with_capacity(mirror.moments.len() * 96 + mirror.requests.len() * 48);
    encode_body(mirror, &mut body);
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len() + TRAILER_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(&at.seq.to_le_bytes());
    out.extend_from_slice(&mirror.ts_ms.to_le_bytes());
    out.extend_from_slice(&at.segment_first_seq.to_le_bytes());
    out.extend_from_slice(&at.frame_end_offset.to_le_bytes());
    out.extend_from_slice(&at.chain);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    debug_assert_eq!(out.len(), HEADER_BYTES);
    out.extend_from_slice(&body);
    let hash = blake3::hash(&out);
    out.extend_from_slice(hash.as_bytes());
    out
}

fn encode_body(mirror: &Mirror, out: &mut Vec<u8>) {
    push_leb128(out, mirror.moments.len() as u64);
    for moment in mirror.moments.values() {
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
    push_leb128(out, mirror.requests.len() as u64);
    for (key, row) in mirror.requests.iter() {
        push(out, key.as_bytes());
        push_leb128(out, row.seq);
        push_leb128(out, u64::from(row.kind.code()));
        match &row.entity {
            Entity::Id(id) => {
                out.push(0);
                out.extend_from_slice(&id.0.to_le_bytes());
            }
            Entity::Name(name) => {
                out.push(1);
                push(out, name.as_bytes());
            }
        }
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
/// BLAKE3 trailer. Errors in words (the caller names the file).
pub fn decode_header(bytes: &[u8]) -> Result<Header, String> {
    let header = header_fields(bytes)?;
    check_trailer(bytes)?;
    Ok(header)
}

/// The BLAKE3 trailer of a whole file (at least [`HEADER_BYTES`] +
/// [`TRAILER_BYTES`] long) against the hash of the bytes before it.
fn check_trailer(bytes: &[u8]) -> Result<(), String> {
    let trailer_start = bytes.len() - TRAILER_BYTES;
    let computed = blake3::hash(&bytes[..trailer_start]);
    if computed.as_bytes()[..] != bytes[trailer_start..] {
        return Err("checksum mismatch (BLAKE3 trailer)".into());
    }
    Ok(())
}

/// [`decode_header`] without the trailer: length, magic, format version,
/// reserved bytes and body length.
fn header_fields(bytes: &[u8]) -> Result<Header, String> {
    if bytes.len() < HEADER_BYTES + TRAILER_BYTES {
        return Err(format!("{} bytes: shorter than a checkpoint", bytes.len()));
    }
    if bytes[..8] != MAGIC {
        return Err("not a checkpoint (bad magic)".into());
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    if bytes[10..16] != [0; 6] {
        return Err("reserved header bytes are not zero".into());
    }
    let (body_start, trailer_start) = (HEADER_BYTES, bytes.len() - TRAILER_BYTES);
    let body_bytes = u64_at(80);
    if body_bytes != (trailer_start - body_start) as u64 {
        return Err(format!(
            "header says {body_bytes} body bytes, the file holds {}",
            trailer_start - body_start
        ));
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
    })
}

/// Decodes a whole checkpoint file into `mirror`, which must be empty (its
/// request index's hasher is kept, so a preparer made from it beforehand
/// stays valid). Checks the header ([`decode_header`]) and every item:
/// moments in strictly rising id order with well-formed packed texts,
/// request rows in strictly rising seq order with no repeated id, known op
/// kinds, every count within the bytes, no byte left over. Errors in words;
/// a checksum mismatch is the error whenever the trailer does not match.
///
/// On several threads (the load was one thread's work, mostly
/// the kernel zeroing the pages of a fresh mirror, while the other core
/// waited): the trailer's hash, each half of the moments, and the request
/// rows with the other items are decoded at once. The body is only ever
/// read with bounds checks, so decoding it before its hash is known is
/// safe; nothing decoded is returned unless the hash matches.
pub fn decode(bytes: &[u8], mut mirror: Mirror) -> Result<(Header, Mirror), String> {
    let header = header_fields(bytes)?;
    let body = &bytes[HEADER_BYTES..bytes.len() - TRAILER_BYTES];
    let (trailer, decoded) = std::thread::scope(|scope| {
        let trailer = scope.spawn(|| check_trailer(bytes));
        let decoded = decode_body(body, &header, &mut mirror, scope);
        (trailer.join(), decoded)
    });
    trailer.map_err(|_| "the checksum thread panicked".to_owned())??;
    decoded?;
    Ok((header, mirror))
}

/// Moments decoded on one thread: the moments of a stretch of the body, in
/// order, and how many of them are live.
type MomentRun = (Vec<(Id, Box<Moment>)>, usize);

/// Decodes `count` moments from `r`, in strictly rising id order, into a
/// vector with room for `capacity`.
fn decode_moments(r: &mut Reader<'_>, count: usize, capacity: usize) -> Result<MomentRun, String> {
    let mut list: Vec<(Id, Box<Moment>)> = Vec::with_capacity(capacity.max(count));
    let mut live = 0;
    for _ in 0..count {
        let id = Id(r.u128()?);
        let texts: Box<[u8]> = r.bytes("moment texts")?.into();
        let captured_at_ms = i64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let created_at_ms = r.leb("created_at_ms")?;
        let version = u32::try_from(r.leb("version")?).map_err(|_| "version above u32")?;
        let flags = r.take(3)?;
        let deleted = match flags[0] {
            0 => false,
            1 => true,
            other => return Err(format!("moment {id}: deleted flag {other}")),
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
            return Err(format!("moment {id} out of id order"));
        }
        live += usize::from(!deleted);
        list.push((id, Box::new(moment)));
    }
    Ok((list, live))
}

/// Steps `r` over one moment without decoding it (the same reads as
/// [`decode_moments`], unchecked contents).
fn skip_moment(r: &mut Reader<'_>) -> Result<(), String> {
    r.take(16)?;
    r.bytes("moment texts")?;
    r.take(8)?;
    r.leb("created_at_ms")?;
    r.leb("version")?;
    r.take(3)?;
    let id_count = r.count("moment ids", 16)?;
    r.take(16 * id_count)?;
    Ok(())
}

/// The body of [`decode`]: the second half of the moments on a thread of
/// `scope`, the first half and then the request rows and other items on
/// another, the caller's, which joins both.
fn decode_body<'scope, 'env>(
    body: &'env [u8],
    header: &Header,
    mirror: &mut Mirror,
    scope: &'scope std::thread::Scope<'scope, 'env>,
) -> Result<(), String> {
    let mut r = Reader { buf: body, at: 0 };
    let moments = r.count("moments", 16 + 1 + 8 + 1 + 1 + 3 + 1)?;
    let first_half = moments / 2;
    // Where the second half and the request rows start: one pass over the
    // moments' lengths.
    let mut second = Reader {
        buf: body,
        at: r.at,
    };
    for _ in 0..first_half {
        skip_moment(&mut second)?;
    }
    let mut rest = Reader {
        buf: body,
        at: second.at,
    };
    for _ in first_half..moments {
        skip_moment(&mut rest)?;
    }
    let late = scope.spawn(move || decode_moments(&mut second, moments - first_half, 0));
    let early = scope.spawn(move || decode_moments(&mut r, first_half, moments));
    decode_rest(&mut rest, header, mirror)?;
    let panicked = |_| "a moment decoding thread panicked".to_owned();
    let (mut list, early_live) = early.join().map_err(panicked)??;
    let (late_list, late_live) = late.join().map_err(panicked)??;
    if let (Some((last, _)), Some((first, _))) = (list.last(), late_list.first()) {
        if last >= first {
            return Err(format!("moment {first} out of id order"));
        }
    }
    list.extend(late_list);
    mirror.moments = list.into_iter().collect();
    mirror.live_moments = early_live + late_live;
    Ok(())
}

/// The request rows and the other items, after the moments; checks that
/// no byte is left over, and sets the mirror's seq and time.
fn decode_rest(r: &mut Reader<'_>, header: &Header, mirror: &mut Mirror) -> Result<(), String> {
    let body = r.buf;
    let rows = r.count("request rows", 1 + 1 + 1 + 1 + 1)?;
    mirror.requests.reserve(rows);
    // Rows are inserted a few behind the one read, with the table slot of
    // each asked for when it is read (a cache miss per row otherwise).
    let mut pending: std::collections::VecDeque<(u64, &str, RequestRow)> =
        std::collections::VecDeque::with_capacity(PREFETCH_AHEAD + 1);
    let insert = |mirror: &mut Mirror, (hash, key, row): (u64, &str, RequestRow)| {
        if mirror
            .requests
            .insert_first_hashed(hash, key.as_bytes(), &row)
        {
            Ok(())
        } else {
            Err(format!("request {key:?} appears twice"))
        }
    };
    let mut last_seq = 0;
    for _ in 0..rows {
        let key = r.text("request id")?;
        let seq = r.leb("request seq")?;
        let code = u16::try_from(r.leb("op kind")?).map_err(|_| "op kind above u16")?;
        let kind = OpKind::from_code(code).ok_or_else(|| format!("unknown op kind {code}"))?;
        let entity = match r.take(1)?[0] {
            0 => Entity::Id(Id(r.u128()?)),
            1 => Entity::Name(r.text("entity name")?.to_owned()),
            other => return Err(format!("request {key:?}: entity tag {other}")),
        };
        if seq <= last_seq || seq > header.at.seq {
            return Err(format!("request {key:?}: seq {seq} out of order"));
        }
        last_seq = seq;
        let hash = mirror.requests.hash_str(key);
        mirror.requests.prefetch_hash(hash);
        pending.push_back((hash, key, RequestRow { seq, kind, entity }));
        if pending.len() > PREFETCH_AHEAD {
            let next = pending.pop_front().expect("more than PREFETCH_AHEAD");
            insert(mirror, next)?;
        }
    }
    for next in pending {
        insert(mirror, next)?;
    }
    for media in r.items::<Media>("media")? {
        if mirror.media.insert(media.id, media).is_some() {
            return Err("a media id appears twice".into());
        }
    }
    for turn in r.items::<Turn>("turns")? {
        if mirror.turns.insert(turn.id, turn).is_some() {
            return Err("a turn id appears twice".into());
        }
    }
    for mark in r.items::<Mark>("marks")? {
        if mirror.marks.insert(mark.id.clone(), mark).is_some() {
            return Err("a mark id appears twice".into());
        }
    }
    for job in r.items::<Job>("jobs")? {
        if mirror.jobs.insert(job.job_id.clone(), job).is_some() {
            return Err("a job id appears twice".into());
        }
    }
    for recall in r.items::<Recall>("recalls")? {
        if mirror.recalls.insert(recall.id.clone(), recall).is_some() {
            return Err("a recall id appears twice".into());
        }
    }
    for message in r.items::<Message>("messages")? {
        mirror
            .threads
            .entry(message.thread_id)
            .or_default()
            .insert(message.id);
        if mirror.messages.insert(message.id, message).is_some() {
            return Err("a message id appears twice".into());
        }
    }
    if r.at != body.len() {
        return Err(format!("{} bytes after the body", body.len() - r.at));
    }
    mirror.seq = header.at.seq;
    mirror.ts_ms = header.ts_ms;
    Ok(())
}

/// Request rows read ahead of their insert, so that each row's table slot
/// is in cache by then.
const PREFETCH_AHEAD: usize = 16;

/// A bounds-checked cursor over a body.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| format!("body ends inside an item at byte {}", self.at))?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u128(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().expect("16 bytes"),
        ))
    }

    fn leb(&mut self, what: &str) -> Result<u64, String> {
        let (value, next) = checked_read_leb128(self.buf, self.at)
            .ok_or_else(|| format!("{what}: bad number at body byte {}", self.at))?;
        self.at = next;
        Ok(value)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let (bytes, next) = checked_read(self.buf, self.at)
            .ok_or_else(|| format!("{what}: runs past the body at byte {}", self.at))?;
        self.at = next;
        Ok(bytes)
    }

    fn text(&mut self, what: &str) -> Result<&'a str, String> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| format!("{what}: not UTF-8"))
    }

    /// A count of items of at least `min_item_bytes` each, refused when
    /// the rest of the body cannot hold that many.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize, String> {
        let count = self.leb(what)?;
        let room = (self.buf.len() - self.at) / min_item_bytes;
        usize::try_from(count)
            .ok()
            .filter(|&c| c <= room)
            .ok_or_else(|| format!("{what}: {count} items do not fit the body"))
    }

    fn items<T: serde::de::DeserializeOwned>(&mut self, what: &str) -> Result<Vec<T>, String> {
        let count = self.count(what, 1)?;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let bytes = self.bytes(what)?;
            out.push(crate::codec::decode(bytes).map_err(|e| format!("{what}: {e}"))?);
        }
        Ok(out)
    }
}

// ---- Files ----------------------------------------------------------------

/// A checkpoint file that was not used, and why (checksum, version, a
/// chain value that does not match the log, a seq beyond the log, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    /// The file.
    pub file: PathBuf,
    /// Why, in words.
    pub why: String,
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
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(checkpoint_dir(data_dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let seq = parse_file_name(e.file_name().to_str()?)?;
            Some((seq, e.path()))
        })
        .collect();
    out.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    out
}

/// Reads and checks one checkpoint file against the log in `log_dir`:
/// decodes it into `empty` ([`decode`]), checks that its name's seq is its
/// header's, and that the chain value at its point equals the log's
/// ([`chain_at`]). Errors in words (the caller names the file).
///
/// The file is mapped, not copied (a 10-million-moment checkpoint is 1.7
/// GB): checkpoint files are only ever created whole by a rename and
/// removed by unlinking, never written in place, so the mapping cannot
/// change under the decoder.
pub fn load(path: &Path, log_dir: &Path, empty: Mirror) -> Result<(Header, Mirror), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    // SAFETY: see above: nothing writes a checkpoint file in place.
    let bytes =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot be mapped: {e}"))?;
    // The trailer's hash is checked by `decode`, beside the body.
    let header = header_fields(&bytes)?;
    check_against_log(path, &header, log_dir)?;
    decode(&bytes, empty)
}

/// The cheap checks of one checkpoint file, without reading its body:
/// magic, format version, reserved bytes, the file's length against the
/// header's body length, the name's seq, and the chain value against the
/// log. What startup does to pick a checkpoint before loading it (the
/// checksum and the body are checked by [`load`], on another thread).
/// Errors in words.
pub fn peek(path: &Path, log_dir: &Path) -> Result<Header, String> {
    let header = peek_header(path)?;
    check_against_log(path, &header, log_dir)?;
    Ok(header)
}

/// [`peek`] without the checks against the log: magic, format version,
/// reserved bytes and the file's length against the header's body length,
/// from the header's bytes alone.
fn peek_header(path: &Path) -> Result<Header, String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?
        .len();
    let mut head = [0u8; HEADER_BYTES];
    file.read_exact(&mut head)
        .map_err(|_| format!("{len} bytes: shorter than a checkpoint"))?;
    if head[..8] != MAGIC {
        return Err("not a checkpoint (bad magic)".into());
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    if head[10..16] != [0; 6] {
        return Err("reserved header bytes are not zero".into());
    }
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let body_bytes = u64_at(80);
    if Some(len) != body_bytes.checked_add((HEADER_BYTES + TRAILER_BYTES) as u64) {
        return Err(format!(
            "header says {body_bytes} body bytes, the file holds {len} bytes in all"
        ));
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
    };
    Ok(header)
}

/// The name's seq is the header's, and the chain value at the header's
/// point equals the log's.
fn check_against_log(path: &Path, header: &Header, log_dir: &Path) -> Result<(), String> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_file_name);
    if named != Some(header.at.seq) {
        return Err(format!(
            "the file name does not match the header's seq {}",
            header.at.seq
        ));
    }
    let at = header.at;
    if at.segment_first_seq == 0 || at.segment_first_seq > at.seq {
        return Err(format!(
            "segment {} cannot hold seq {}",
            at.segment_first_seq, at.seq
        ));
    }
    let chain = chain_at(log_dir, at.segment_first_seq, at.frame_end_offset)?;
    if chain != at.chain {
        return Err(format!(
            "chain value at seq {} does not match the log (segment {} offset {}): \
             the checkpoint is stale, from another log, or beyond the log's end",
            at.seq,
            segment_file_name(at.segment_first_seq),
            at.frame_end_offset
        ));
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
/// from another log: the operator moves it away to start anyway).
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
/// lost committed records ([`PastTheLog`]), if any. Reads only headers,
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
        whole(&file, &header).then_some(PastTheLog { file, seq, why })
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
/// naming the file.
pub fn write_file(fs: &dyn Fs, data_dir: &Path, seq: u64, bytes: &[u8]) -> Result<PathBuf, String> {
    let dir = checkpoint_dir(data_dir);
    let io = |what: &str, path: &Path, e: std::io::Error| format!("{what} {}: {e}", path.display());
    match fs.list(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs.create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
            fs.sync_dir(data_dir)
                .map_err(|e| io("fsync", data_dir, e))?;
        }
        _ => remove_temp_files(fs, data_dir),
    }
    let path = dir.join(file_name(seq));
    fs.write_file_durably(&path, bytes)
        .map_err(|e| e.to_string())?;
    Ok(path)
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
/// Errors in words.
pub fn build(
    fs: &dyn Fs,
    data_dir: &Path,
    log_dir: &Path,
    max_record_bytes: u32,
    keep: usize,
    up_to_seq: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Built>, String> {
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
        LogReader::open_live_from(log_dir, Arc::new(OsFs), max_record_bytes, start_seq + 1)
            .map_err(|e| e.to_string())?;
    let mut point = None;
    let mut fold_error = None;
    let mut visited = 0u64;
    let options = ScanOptions {
        verify_chain: false,
        max_record_bytes,
    };
    reader
        .scan(options, |segment, record| {
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
            if let Err(e) = crate::replay::replay_record(&mut mirror, &record) {
                fold_error = Some(format!("seq {}: {e}", record.seq));
                return ControlFlow::Break(());
            }
            point = Some((
                record.seq,
                segment.first_seq,
                record.offset + record_size(record.payload.len()) as u64,
            ));
            ControlFlow::Continue(())
        })
        .map_err(|e| e.to_string())?;
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
        let mut mirror = Mirror::new();
        let mut seq = 0;
        let mut apply = |mirror: &mut Mirror, body: OpBody| {
            seq += 1;
            mirror
                .apply(Op {
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
        // bytes (the request index's random hasher is not in the file).
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

    const PINNED_HASH: &str = "03aa8cd67c230f46b480dc3f4a8925757fc97c51a642d56850584cb13e944c5d";
    const PINNED_LEN: usize = 632;

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
        bytes[8] = 2;
        let trailer = bytes.len() - TRAILER_BYTES;
        let hash = blake3::hash(&bytes[..trailer]);
        bytes[trailer..].copy_from_slice(hash.as_bytes());
        let error = decode(&bytes, Mirror::new()).unwrap_err();
        assert!(error.contains("format version 2"), "{error}");
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
                        Err(e) => assert!(e.contains("/data/checkpoint"), "{e}"),
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
        for op in [
            FaultOp::CreateNew,
            FaultOp::Write,
            FaultOp::SyncAll,
            FaultOp::Rename,
            FaultOp::SyncDir,
        ] {
            let mem = Arc::new(MemFs::new());
            mem.insert_durable(&target, &old);
            let fs = FaultyFs::new(mem.clone());
            fs.fail_next(op, Fault::Os(5));
            let e = write_file(&fs, data, newer.seq, &new).expect_err("the fault is returned");
            assert!(e.contains("/data/checkpoint"), "{op:?}: {e}");
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
