//! The archive's objects (`archive/ARCHIVE.md`, SPEC section 11): object
//! keys under a prefix, the tail chunk frame, the manifest and epoch frames,
//! the walk that finds a segment's acknowledged bytes, and the rule that a
//! manifest extends the one before it ([`extends`], compactions included). Shared by the
//! engine's shipper and `spark-replay restore` / `verify`; no I/O here.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use spark_log_format::format::{chain_hex, ChainValue, Seq};
use spark_log_format::{FrameKind, Frames};

/// Version of the archive layout this build writes and reads.
pub const ARCHIVE_VERSION: u16 = 1;
/// Magic of a tail chunk object.
pub const CHUNK_MAGIC: [u8; 8] = *b"SPARKCHK";
/// Magic of a manifest object.
pub const MANIFEST_MAGIC: [u8; 8] = *b"SPARKMAN";
/// Magic of an epoch object.
pub const EPOCH_MAGIC: [u8; 8] = *b"SPARKEPO";
/// Magic of a missing-blob marker (ARCHIVE.md "Missing blob").
pub const MISSING_MAGIC: [u8; 8] = *b"SPARKMIS";
/// Bytes of a chunk header (ARCHIVE.md "Tail chunk").
pub const CHUNK_HEADER_LEN: usize = 136;
/// Bytes of the frame before a manifest's or epoch's JSON body.
pub const DOC_HEADER_LEN: usize = 32;

/// Serde of a 32-byte value (a chain value, a BLAKE3 digest) as the 64
/// lowercase hex characters the JSON documents carry (ARCHIVE.md
/// "Manifest"): the fields are bytes in memory and hex only on the wire.
/// Reading accepts exactly what writing makes; anything else (another
/// length, a non-hex or upper-case digit) is an error that quotes the text,
/// which [`decode_doc`] turns into an [`ObjectError::Json`] naming the
/// object.
mod hex32 {
    use super::{chain_hex, Deserialize, Deserializer, Serializer};

    /// Writes `value` as 64 lowercase hex.
    pub fn serialize<S: Serializer>(value: &[u8; 32], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&chain_hex(value))
    }

    /// Reads 64 lowercase hex.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(deserializer)?;
        parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not 64 lowercase hex digits"))
        })
    }

    /// The 32 bytes `text` spells in lowercase hex, if it is exactly that.
    pub fn parse(text: &str) -> Option<[u8; 32]> {
        fn digit(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        let text = text.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(out)
    }
}

/// `n` as the 20-digit zero-padded decimal used in every key.
fn digits(n: u64) -> String {
    format!("{n:020}")
}

/// Joins `prefix` (no leading or trailing `/`; may be empty) and `rest`.
fn join(prefix: &str, rest: String) -> String {
    if prefix.is_empty() {
        rest
    } else {
        format!("{prefix}/{rest}")
    }
}

/// The compaction a sealed segment's key names: GGG of `NNN-cGGG.seg` or
/// `NNN-EEE-cGGG.seg` (the seq of the `log.compact` record that left the
/// segment so, ARCHIVE.md "Keys"); `None` for any other key. The last
/// sealed segment of a manifest is rewritten by every compaction, so the
/// highest of its segments' is the latest compaction its log applies.
pub fn key_compaction(key: &str) -> Option<Seq> {
    let name = key.rsplit('/').next()?.strip_suffix(".seg")?;
    let last = name.rsplit('-').next()?;
    let digits = last.strip_prefix('c')?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

/// The writer epoch a log object's key carries: a sealed segment's
/// (`NNN.seg` and `NNN-cGGG.seg`: 1; `NNN-EEE.seg`, `NNN-EEE-cGGG.seg`:
/// EEE), a chunk's (`FFF-LLL-EEE.chunk`) or a checkpoint's
/// (`NNN-EEE.ckpt`); `None` for any other key (never one the retention
/// pass deletes, ARCHIVE.md "Retention").
pub fn key_epoch(key: &str) -> Option<u64> {
    let (family, name) = key.rsplit_once('/').map_or(("", key), |(dir, name)| {
        (dir.rsplit('/').next().unwrap_or(dir), name)
    });
    let number = |part: &str| {
        (part.len() == 20)
            .then(|| part.parse::<u64>().ok())
            .flatten()
    };
    let compaction = |part: &str| part.strip_prefix('c').and_then(number);
    let parts = |stem: &str| stem.split('-').map(str::to_owned).collect::<Vec<_>>();
    match family {
        "segment" => {
            let parts = parts(name.strip_suffix(".seg")?);
            match parts.as_slice() {
                [n] => number(n).map(|_| 1),
                [n, c] if compaction(c).is_some() => number(n).map(|_| 1),
                [n, e] => number(n).and(number(e)),
                [n, e, c] => number(n).and(compaction(c)).and(number(e)),
                _ => None,
            }
        }
        "chunk" => match parts(name.strip_suffix(".chunk")?).as_slice() {
            [f, l, e] => number(f).and(number(l)).and(number(e)),
            _ => None,
        },
        "checkpoint" => match parts(name.strip_suffix(".ckpt")?).as_slice() {
            [n, e] => number(n).and(number(e)),
            _ => None,
        },
        _ => None,
    }
}

/// Key of the sealed segment whose first record is `first_seq`, shipped
/// by writer epoch `epoch`: `<prefix>/segment/<first_seq, 20 digits>.seg`
/// for epoch 1, `<prefix>/segment/<first_seq>-<epoch>.seg` (each 20 digits)
/// after a take-over, so that a segment an older writer stored past the
/// take-over point (named by no manifest) never holds the key the new
/// writer needs (ARCHIVE.md "Keys").
pub fn segment_key(prefix: &str, first_seq: Seq, epoch: u64) -> String {
    if epoch <= 1 {
        join(prefix, format!("segment/{}.seg", digits(first_seq)))
    } else {
        join(
            prefix,
            format!("segment/{}-{}.seg", digits(first_seq), digits(epoch)),
        )
    }
}

/// Key of a sealed segment shipped again because compaction `record_seq`
/// rewrote it (its `log.compact` record's seq; ARCHIVE.md "Compaction"):
/// `<prefix>/segment/<first_seq>-c<record_seq>.seg` for epoch 1,
/// `<prefix>/segment/<first_seq>-<epoch>-c<record_seq>.seg` after a
/// take-over (each number 20 digits). The compaction's seq keeps the new
/// bytes off every key an earlier put of the segment (the old bytes, or
/// another compaction's) may hold: every object is create-only.
pub fn compacted_segment_key(prefix: &str, first_seq: Seq, epoch: u64, record_seq: Seq) -> String {
    if epoch <= 1 {
        join(
            prefix,
            format!("segment/{}-c{}.seg", digits(first_seq), digits(record_seq)),
        )
    } else {
        join(
            prefix,
            format!(
                "segment/{}-{}-c{}.seg",
                digits(first_seq),
                digits(epoch),
                digits(record_seq)
            ),
        )
    }
}

/// Key of a tail chunk: `<prefix>/chunk/<first_seq>-<last_seq>-<epoch>.chunk`
/// (each 20 digits).
pub fn chunk_key(prefix: &str, first_seq: Seq, last_seq: Seq, epoch: u64) -> String {
    join(
        prefix,
        format!(
            "chunk/{}-{}-{}.chunk",
            digits(first_seq),
            digits(last_seq),
            digits(epoch)
        ),
    )
}

/// Key of manifest number `number` (from 1): `<prefix>/manifest/<number>`.
pub fn manifest_key(prefix: &str, number: u64) -> String {
    join(prefix, format!("manifest/{}", digits(number)))
}

/// Key of writer epoch `epoch` (from 1): `<prefix>/epoch/<epoch>`.
pub fn epoch_key(prefix: &str, epoch: u64) -> String {
    join(prefix, format!("epoch/{}", digits(epoch)))
}

/// Key of a checkpoint (`log-format/CHECKPOINT.md`) that writer epoch
/// `epoch` shipped, standing at `seq`:
/// `<prefix>/checkpoint/<seq>-<epoch>.ckpt` (each 20 digits; ARCHIVE.md
/// "Checkpoint"). The epoch keeps a fenced writer's checkpoint at a seq
/// past a take-over point off the key the new writer needs.
pub fn checkpoint_key(prefix: &str, seq: Seq, epoch: u64) -> String {
    join(
        prefix,
        format!("checkpoint/{}-{}.ckpt", digits(seq), digits(epoch)),
    )
}

/// Key of a media blob: `<prefix>/blob/<sha256, 64 lowercase hex>`.
pub fn blob_key(prefix: &str, sha256: &[u8; 32]) -> String {
    join(prefix, format!("blob/{}", chain_hex(sha256)))
}

/// Key of the marker that says a blob was lost before it was archived:
/// `<prefix>/missing/<sha256, 64 lowercase hex>` (ARCHIVE.md "Missing
/// blob").
pub fn missing_key(prefix: &str, sha256: &[u8; 32]) -> String {
    join(prefix, format!("missing/{}", chain_hex(sha256)))
}

/// Why an archived object was refused when read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    /// Shorter than its header or its declared body.
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    /// The magic is not the expected one.
    #[error("bad magic (not a {0} object)")]
    BadMagic(&'static str),
    /// A version this build does not read.
    #[error("archive version {0} is not supported (this build reads {ARCHIVE_VERSION})")]
    Version(u16),
    /// The header checksum does not match.
    #[error("header checksum mismatch")]
    HeaderCrc,
    /// The body checksum does not match.
    #[error("body checksum mismatch")]
    BodyCrc,
    /// The JSON body does not parse.
    #[error("body does not parse: {0}")]
    Json(String),
    /// The object does not agree with what names it (manifest, key).
    #[error("{0}")]
    Mismatch(String),
    /// The object does not go on from the chain before it: its segment's
    /// `chain_start` or its chunk's `chain_before` (`field`) is another
    /// history's, a fork (ARCHIVE.md "Sealed segment", "Tail chunk").
    #[error(
        "its {field} {} is not the chain before it ({}): a fork",
        chain_hex(.found),
        chain_hex(.expected)
    )]
    ChainBefore {
        /// `chain_start` or `chain_before`.
        field: &'static str,
        /// The chain value the object names.
        found: ChainValue,
        /// The chain the object before it ended with.
        expected: ChainValue,
    },
    /// The chain of the object's bytes is not the one `said_by` (its seal,
    /// its header's `chain_after`, its manifest entry) says.
    #[error("its bytes give chain {}, {said_by} says {}", chain_hex(.computed), chain_hex(.said))]
    ChainAfter {
        /// Who names the other chain value, in words.
        said_by: &'static str,
        /// The chain value of the object's bytes.
        computed: ChainValue,
        /// The chain value `said_by` names.
        said: ChainValue,
    },
    /// A chunk that does not start where the bytes of its segment before it
    /// end (ARCHIVE.md "Tail chunk").
    #[error("offset {offset} but {expected} bytes of its segment came before it")]
    Offset {
        /// The offset its header names, in bytes.
        offset: u64,
        /// Where the bytes before it end, in bytes.
        expected: u64,
    },
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn chain_at(b: &[u8], at: usize) -> ChainValue {
    b[at..at + 32].try_into().expect("32 bytes")
}

/// CRC32 of a header of `len` bytes with its checksum field (bytes 12..16)
/// taken as zero.
fn header_crc(header: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[..12]);
    crc.update(&[0; 4]);
    crc.update(&header[16..]);
    crc.finalize()
}

/// Checks magic, version, header length and header checksum of a framed
/// object whose header is `header_len` bytes.
fn check_frame(
    bytes: &[u8],
    magic: [u8; 8],
    what: &'static str,
    header_len: usize,
) -> Result<(), ObjectError> {
    if bytes.len() < header_len {
        return Err(ObjectError::Truncated(bytes.len()));
    }
    if bytes[..8] != magic {
        return Err(ObjectError::BadMagic(what));
    }
    let version = le_u16(bytes, 8);
    if version != ARCHIVE_VERSION {
        return Err(ObjectError::Version(version));
    }
    if usize::from(le_u16(bytes, 10)) != header_len {
        return Err(ObjectError::Mismatch(format!(
            "header_len {} is not {header_len}",
            le_u16(bytes, 10)
        )));
    }
    if le_u32(bytes, 12) != header_crc(&bytes[..header_len]) {
        return Err(ObjectError::HeaderCrc);
    }
    Ok(())
}

/// A tail chunk: bytes `[offset, offset + body.len())` of the segment that
/// starts at `segment_first_seq`, ending at a commit mark (ARCHIVE.md "Tail
/// chunk").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// The writer epoch that shipped it.
    pub epoch: u64,
    /// Seq of its first record.
    pub first_seq: Seq,
    /// Seq of its last record (its last commit mark's).
    pub last_seq: Seq,
    /// First seq of the segment the bytes belong to (its file name).
    pub segment_first_seq: Seq,
    /// Byte offset in that segment where the body starts.
    pub offset: u64,
    /// Body bytes.
    pub body_bytes: u64,
    /// CRC32 of the body.
    pub body_crc: u32,
    /// The head chain before the body: the chain at `offset`, or for
    /// `offset == 0` the segment's `chain_start`.
    pub chain_before: ChainValue,
    /// The head chain after the body: the chain at `offset + body_bytes`.
    pub chain_after: ChainValue,
}

impl ChunkHeader {
    /// The whole chunk object: header then `body`.
    pub fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + body.len());
        out.extend_from_slice(&CHUNK_MAGIC);
        out.extend_from_slice(&ARCHIVE_VERSION.to_le_bytes());
        // Cast: 136 fits a u16.
        out.extend_from_slice(&(CHUNK_HEADER_LEN as u16).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for v in [
            self.epoch,
            self.first_seq,
            self.last_seq,
            self.segment_first_seq,
            self.offset,
            self.body_bytes,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.body_crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.chain_before);
        out.extend_from_slice(&self.chain_after);
        let crc = header_crc(&out[..CHUNK_HEADER_LEN]);
        out[12..16].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// Reads a chunk object: checks the frame, the body length and CRC.
    /// Returns the header and the body.
    pub fn decode(bytes: &[u8]) -> Result<(ChunkHeader, &[u8]), ObjectError> {
        check_frame(bytes, CHUNK_MAGIC, "chunk", CHUNK_HEADER_LEN)?;
        let header = ChunkHeader {
            epoch: le_u64(bytes, 16),
            first_seq: le_u64(bytes, 24),
            last_seq: le_u64(bytes, 32),
            segment_first_seq: le_u64(bytes, 40),
            offset: le_u64(bytes, 48),
            body_bytes: le_u64(bytes, 56),
            body_crc: le_u32(bytes, 64),
            chain_before: chain_at(bytes, 72),
            chain_after: chain_at(bytes, 104),
        };
        let body = &bytes[CHUNK_HEADER_LEN..];
        if body.len() as u64 != header.body_bytes {
            return Err(ObjectError::Truncated(bytes.len()));
        }
        if crc32fast::hash(body) != header.body_crc {
            return Err(ObjectError::BodyCrc);
        }
        Ok((header, body))
    }
}

/// Frames a JSON document (manifest or epoch): 32-byte header, then the body.
fn encode_doc(magic: [u8; 8], number: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(DOC_HEADER_LEN + body.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&ARCHIVE_VERSION.to_le_bytes());
    // Cast: 32 fits a u16.
    out.extend_from_slice(&(DOC_HEADER_LEN as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&number.to_le_bytes());
    // Cast: documents are far below 4 GiB (checked by the caller's size).
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    let crc = header_crc(&out[..DOC_HEADER_LEN]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads a framed JSON document; checks the number against `number`.
fn decode_doc<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    magic: [u8; 8],
    what: &'static str,
    number: u64,
) -> Result<T, ObjectError> {
    check_frame(bytes, magic, what, DOC_HEADER_LEN)?;
    if le_u64(bytes, 16) != number {
        return Err(ObjectError::Mismatch(format!(
            "{what} number {} under the key of {number}",
            le_u64(bytes, 16)
        )));
    }
    let body = &bytes[DOC_HEADER_LEN..];
    if body.len() != le_u32(bytes, 24) as usize {
        return Err(ObjectError::Truncated(bytes.len()));
    }
    if crc32fast::hash(body) != le_u32(bytes, 28) {
        return Err(ObjectError::BodyCrc);
    }
    serde_json::from_slice(body).map_err(|e| ObjectError::Json(format!("{what} {number}: {e}")))
}

/// A sealed segment as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Its object key.
    pub key: String,
    /// Seq of its first record.
    pub first_seq: Seq,
    /// Seq of its last record.
    pub last_seq: Seq,
    /// Object bytes (header to the end of the seal).
    pub bytes: u64,
    /// BLAKE3 of the object bytes (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub blake3: [u8; 32],
    /// Its final chain value, the seal's (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub chain_end: ChainValue,
}

/// A tail chunk as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    /// Its object key.
    pub key: String,
    /// Epoch that shipped it.
    pub epoch: u64,
    /// First seq of the segment its bytes belong to.
    pub segment_first_seq: Seq,
    /// Seq of its first record.
    pub first_seq: Seq,
    /// Seq of its last record.
    pub last_seq: Seq,
    /// Offset of its body in the segment.
    pub offset: u64,
    /// Object bytes (header and body).
    pub bytes: u64,
    /// BLAKE3 of the object bytes (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub blake3: [u8; 32],
    /// The head chain after its body (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub chain_after: ChainValue,
}

/// A checkpoint as the manifest lists it (ARCHIVE.md "Checkpoint"): derived
/// state, never needed to read the log; a reader that finds it missing,
/// damaged or stale ignores it with a warning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    /// Its object key ([`checkpoint_key`]).
    pub key: String,
    /// The last seq folded into it (at most the manifest's `shipped_seq`).
    pub seq: Seq,
    /// The mirror's `ts_ms` at `seq` (Unix ms), so that `restore --at TIME`
    /// can pick one without fetching it.
    pub ts_ms: u64,
    /// Object bytes (the checkpoint file, verbatim).
    pub bytes: u64,
    /// BLAKE3 of the object bytes (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub blake3: [u8; 32],
    /// The chain value its header names, at the end of the record at
    /// `seq` (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub chain: ChainValue,
}

/// A segment a compaction rewrote, as a manifest lists it (ARCHIVE.md
/// "Compaction"): the `log.compact` record's entry (FORMAT.md
/// "Compaction"), seal chain values before and after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewrittenSegment {
    /// The segment's first seq (its file name).
    pub first_seq: Seq,
    /// Its last seq (its seal's).
    pub last_seq: Seq,
    /// Its seal's chain value before the compaction (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub old_chain_end: ChainValue,
    /// Its seal's chain value after (64 hex in the JSON).
    #[serde(with = "hex32")]
    pub new_chain_end: ChainValue,
}

/// A compaction a manifest applies relative to the one before it
/// (ARCHIVE.md "Compaction", "Manifest history"): the `log.compact`
/// record at `record_seq` and the segments it lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionEntry {
    /// Seq of the `log.compact` record.
    pub record_seq: Seq,
    /// The segments it rewrote, in seq order.
    pub segments: Vec<RewrittenSegment>,
}

impl CompactionEntry {
    /// The entry of the `log.compact` record at `record_seq`.
    pub fn of_record(record_seq: Seq, record: &spark_log_format::CompactionRecord) -> Self {
        CompactionEntry {
            record_seq,
            segments: record
                .segments
                .iter()
                .map(|s| RewrittenSegment {
                    first_seq: s.first_seq,
                    last_seq: s.last_seq,
                    old_chain_end: s.old_seal,
                    new_chain_end: s.new_seal,
                })
                .collect(),
        }
    }
}

/// A manifest: what the archive holds as of manifest `number` (ARCHIVE.md
/// "Manifest"). Every manifest lists everything (no deltas).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Its number (its key's).
    pub number: u64,
    /// The epoch of the writer that wrote it.
    pub epoch: u64,
    /// Unix ms when it was written.
    pub written_ms: u64,
    /// Last seq held (0 when none).
    pub shipped_seq: Seq,
    /// Head chain at `shipped_seq` (64 hex in the JSON; zeros when none).
    #[serde(with = "hex32")]
    pub shipped_chain: ChainValue,
    /// Sealed segments, in seq order.
    pub segments: Vec<SegmentEntry>,
    /// Chunks of the one unsealed segment after them, in seq order.
    pub chunks: Vec<ChunkEntry>,
    /// The lease its writer holds the prefix with, in ms (ARCHIVE.md
    /// "Lease"): its writer stores a manifest at least every
    /// `lease_ms / 3` ms, and another engine with leases on may take the
    /// prefix over once `written_ms` is older than this. `0` (left out of
    /// the JSON, as before leases existed): no lease, a take-over needs
    /// `--take-over`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease_ms: u64,
    /// The checkpoints shipped, oldest first, at most
    /// [`CHECKPOINTS_LISTED`] (ARCHIVE.md "Checkpoint"); left out of the
    /// JSON when none, as before checkpoints were shipped. Not part of the
    /// history rule ([`extends`]): derived state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<CheckpointEntry>,
    /// The compactions this manifest applies relative to the one before
    /// it, in log order (ARCHIVE.md "Compaction"): its segments from the
    /// first one they list on are the rewritten ones, its chunks start
    /// over. Left out of the JSON when none, as before compactions were
    /// shipped; a renewal or a take-over manifest lists none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<CompactionEntry>,
    /// The retention floor (ARCHIVE.md "Retention"): manifests numbered
    /// below it may have been deleted by the writer's retention pass, and
    /// so may every object only they name. The family is gapless from here
    /// to `number` ("Gaps"); `restore --at` refuses a cut before this
    /// manifest's `shipped_seq` / `written_ms`. At least 1 and at most
    /// `number`; `1` (the default) is left out of the JSON, so manifests
    /// of archives no retention pass touched stay as they were.
    #[serde(default = "first_manifest", skip_serializing_if = "is_first_manifest")]
    pub retained_from: u64,
}

fn first_manifest() -> u64 {
    1
}

fn is_first_manifest(value: &u64) -> bool {
    *value <= 1
}

/// How many shipped checkpoints a manifest lists at most (the newest);
/// older ones drop out of the list, their objects stay (nothing is deleted).
pub const CHECKPOINTS_LISTED: usize = 3;

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Manifest {
    /// What an archive with no manifest holds: nothing (number 0, epoch
    /// 0, no entries).
    pub fn empty() -> Manifest {
        Manifest {
            number: 0,
            epoch: 0,
            written_ms: 0,
            shipped_seq: 0,
            shipped_chain: [0; 32],
            segments: Vec::new(),
            chunks: Vec::new(),
            lease_ms: 0,
            checkpoints: Vec::new(),
            compactions: Vec::new(),
            retained_from: 1,
        }
    }

    /// The manifest object bytes.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).expect("a manifest serializes");
        encode_doc(MANIFEST_MAGIC, self.number, &body)
    }

    /// Reads manifest `number` from its object bytes.
    pub fn decode(bytes: &[u8], number: u64) -> Result<Manifest, ObjectError> {
        let m: Manifest = decode_doc(bytes, MANIFEST_MAGIC, "manifest", number)?;
        if m.number != number {
            return Err(ObjectError::Mismatch(format!(
                "manifest body says number {}",
                m.number
            )));
        }
        if m.retained_from == 0 || m.retained_from > m.number {
            return Err(ObjectError::Mismatch(format!(
                "manifest {number} says retained_from {}, not 1 to its own number",
                m.retained_from
            )));
        }
        Ok(m)
    }
}

/// The epoch object: who took the prefix (ARCHIVE.md "Epoch").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochDoc {
    /// The epoch (its key's).
    pub epoch: u64,
    /// The writer's id (random, kept in its data directory).
    pub writer: String,
    /// Unix ms when it was taken.
    pub taken_ms: u64,
    /// The lease its writer took the prefix with, in ms, until its first
    /// manifest says otherwise (ARCHIVE.md "Lease"); `0` (left out of the
    /// JSON): no lease.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease_ms: u64,
}

impl EpochDoc {
    /// The epoch object bytes.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).expect("an epoch serializes");
        encode_doc(EPOCH_MAGIC, self.epoch, &body)
    }

    /// Reads epoch `epoch` from its object bytes.
    pub fn decode(bytes: &[u8], epoch: u64) -> Result<EpochDoc, ObjectError> {
        let d: EpochDoc = decode_doc(bytes, EPOCH_MAGIC, "epoch", epoch)?;
        if d.epoch != epoch {
            return Err(ObjectError::Mismatch(format!(
                "epoch body says {}",
                d.epoch
            )));
        }
        Ok(d)
    }
}

/// The missing-blob marker: the writer shipped the op at `seq` without its
/// blob, because the local blob was missing or damaged (ARCHIVE.md
/// "Missing blob"). Framed like an epoch object, `number` = `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingBlobDoc {
    /// The blob's SHA-256, 64 hex (its key's).
    pub sha256: String,
    /// Seq of the first shipped `media.put` naming it.
    pub seq: Seq,
    /// That op's media id.
    pub media_id: String,
    /// Bytes the op names.
    pub size_bytes: u64,
    /// What the writer found, e.g. `missing: <path>: No such file or
    /// directory` or `damaged: <path>: 2999 bytes with SHA-256 …`.
    pub reason: String,
    /// The writer epoch that wrote it.
    pub epoch: u64,
    /// Unix ms when it was written.
    pub written_ms: u64,
}

impl MissingBlobDoc {
    /// The marker object bytes.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).expect("a marker serializes");
        encode_doc(MISSING_MAGIC, self.seq, &body)
    }

    /// Reads the marker of blob `sha256` from its object bytes.
    pub fn decode(bytes: &[u8], sha256: &[u8; 32]) -> Result<MissingBlobDoc, ObjectError> {
        check_frame(bytes, MISSING_MAGIC, "missing-blob", DOC_HEADER_LEN)?;
        let number = le_u64(bytes, 16);
        let d: MissingBlobDoc = decode_doc(bytes, MISSING_MAGIC, "missing-blob", number)?;
        if d.seq != number || d.sha256 != chain_hex(sha256) {
            return Err(ObjectError::Mismatch(format!(
                "marker body names blob {} at seq {}",
                d.sha256, d.seq
            )));
        }
        Ok(d)
    }
}

/// Where a walk of a version-2 segment's frames stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckEnd {
    /// End of the last acknowledged frame at or before the target: a commit
    /// mark, or the seal.
    pub offset: usize,
    /// Seq of the last record before `offset` (`from_seq` when none).
    pub last_seq: Seq,
    /// Whether `offset` is the end of the segment's seal.
    pub sealed: bool,
}

/// Walks the frames of `segment` from `from_offset` (the end of a commit
/// mark, or [`HEADER_LEN`](spark_log_format::HEADER_LEN) in a whole segment) whose last record before it is `from_seq`, up to
/// the commit mark of `target_seq` (or the seal): the acknowledged bytes a
/// shipper may ship (FORMAT.md "Acknowledged bytes"). Stops early at the
/// first frame that is not whole (a write in progress or zero fill). Marks
/// are trusted for their position only; their count, bytes and CRC are the
/// reader's check (restore runs the full decoder).
pub fn acknowledged_end(
    segment: &[u8],
    from_offset: usize,
    from_seq: Seq,
    target_seq: Seq,
    max_record_bytes: u32,
) -> AckEnd {
    let mut seq = from_seq;
    let mut end = AckEnd {
        offset: from_offset,
        last_seq: from_seq,
        sealed: false,
    };
    for frame in Frames::new(segment, from_offset, max_record_bytes) {
        match frame.kind {
            FrameKind::Op => seq = frame.seq(),
            FrameKind::Seal => {
                end = AckEnd {
                    offset: frame.end(),
                    last_seq: seq,
                    sealed: true,
                };
                break;
            }
            FrameKind::CommitMark => {
                if frame.seq() > target_seq {
                    break;
                }
                end = AckEnd {
                    offset: frame.end(),
                    last_seq: seq,
                    sealed: false,
                };
                if frame.seq() == target_seq {
                    break;
                }
            }
            FrameKind::UnknownMarker(_) => {}
        }
    }
    end
}

/// Why a manifest does not extend the one before it: a fork in the
/// archive's history (ARCHIVE.md "Manifest history"). Each names the
/// entry (by its key) or the numbers that break the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fork {
    /// The later manifest carries an older writer epoch.
    #[error("its epoch {next} is older than the previous manifest's {prev}")]
    EpochWentBack {
        /// The earlier manifest's epoch.
        prev: u64,
        /// The later manifest's epoch.
        next: u64,
    },
    /// The later manifest's retention floor is below the earlier one's
    /// (manifests a pass may have deleted would count again), or past its
    /// own number.
    #[error(
        "its retained_from {next} is below the previous manifest's {prev} or past its own number"
    )]
    RetainedFromWentBack {
        /// The earlier manifest's `retained_from`.
        prev: u64,
        /// The later manifest's `retained_from`.
        next: u64,
    },
    /// The later manifest holds fewer ops.
    #[error("its shipped_seq {next} is below the previous manifest's {prev}")]
    ShippedSeqWentBack {
        /// The earlier manifest's `shipped_seq`.
        prev: Seq,
        /// The later manifest's `shipped_seq`.
        next: Seq,
    },
    /// A sealed segment of the earlier manifest is missing or listed
    /// differently.
    #[error("the previous manifest's segment {key} (entry {index}) is not listed the same")]
    SegmentChanged {
        /// Position in the earlier manifest's `segments`.
        index: usize,
        /// Its key in the earlier manifest.
        key: String,
    },
    /// A chunk of the earlier manifest is neither kept as it was nor folded
    /// into its sealed segment.
    #[error(
        "the previous manifest's chunk {key} (entry {index}) is neither kept nor folded into its sealed segment"
    )]
    ChunkChanged {
        /// Position in the earlier manifest's `chunks`.
        index: usize,
        /// Its key in the earlier manifest.
        key: String,
    },
    /// A new entry does not start right after what came before it.
    #[error("new entry {key} starts at seq {first_seq}, expected {expected}")]
    Gap {
        /// The new entry's key.
        key: String,
        /// Its first seq.
        first_seq: Seq,
        /// The seq after the entry before it.
        expected: Seq,
    },
    /// A chunk new in this manifest was shipped by another epoch than the
    /// manifest's writer (an older writer's chunk past a takeover point).
    #[error("new chunk {key} carries epoch {chunk_epoch}, the manifest's writer is epoch {epoch}")]
    ForeignChunk {
        /// The chunk's key.
        key: String,
        /// The chunk's epoch.
        chunk_epoch: u64,
        /// The manifest's epoch.
        epoch: u64,
    },
    /// `shipped_seq` is not the last seq of the last entry.
    #[error("its shipped_seq {shipped_seq} is not the end of its entries ({entries_end})")]
    ShippedSeqMismatch {
        /// The manifest's `shipped_seq`.
        shipped_seq: Seq,
        /// The last seq of its last entry (0 when it lists none).
        entries_end: Seq,
    },
    /// A compaction the manifest applies is not one `prev` can be moved by:
    /// its record is not after `prev.shipped_seq`, not after the one
    /// before it, or past the manifest's `shipped_seq`.
    #[error(
        "its compaction record at seq {record_seq} is not after the previous manifest's shipped_seq \
         {prev_shipped_seq} and the compaction before it, or not within its own shipped_seq {shipped_seq}"
    )]
    CompactionOutOfPlace {
        /// The compaction record's seq.
        record_seq: Seq,
        /// The earlier manifest's `shipped_seq`.
        prev_shipped_seq: Seq,
        /// The later manifest's `shipped_seq`.
        shipped_seq: Seq,
    },
    /// A compaction lists a segment the earlier manifest holds with other
    /// bounds, or with another chain than its `old_chain_end` (after the
    /// compactions before it): it rewrote another history.
    #[error(
        "its compaction at seq {record_seq} lists segment {first_seq}..={last_seq} with old chain {}, \
         which is not the archived segment there ({found})",
        chain_hex(.old_chain_end)
    )]
    CompactionOfAnotherHistory {
        /// The compaction record's seq.
        record_seq: Seq,
        /// The listed segment's first seq.
        first_seq: Seq,
        /// Its last seq.
        last_seq: Seq,
        /// The chain value the compaction says it had.
        old_chain_end: ChainValue,
        /// What the archive holds there, in words.
        found: String,
    },
    /// A sealed segment of the earlier manifest at or after the first one a
    /// compaction rewrote, that no compaction lists (a compaction rewrites
    /// every sealed segment from its first one on), or that is not
    /// replaced by an entry with the same seqs, a new key and the chain
    /// value the compaction lists.
    #[error(
        "the previous manifest's segment {key} (entry {index}) comes after a rewritten segment and is \
         not replaced by the rewrite its compaction lists"
    )]
    RewriteMissing {
        /// Position in the earlier manifest's `segments`.
        index: usize,
        /// Its key in the earlier manifest.
        key: String,
    },
    /// A segment new in the manifest that a compaction lists does not end
    /// with the compaction's `new_chain_end`.
    #[error("new segment {key} does not end with the chain its compaction lists")]
    RewrittenChainMismatch {
        /// The new entry's key.
        key: String,
    },
    /// `shipped_chain` is not the chain value its last entry ends with.
    #[error(
        "its shipped_chain {} is not the chain its entries end with ({})",
        chain_hex(.shipped_chain),
        chain_hex(.entries_chain)
    )]
    ShippedChainMismatch {
        /// The manifest's `shipped_chain`.
        shipped_chain: ChainValue,
        /// The last chunk's `chain_after`, else the last segment's
        /// `chain_end`, else zeros.
        entries_chain: ChainValue,
    },
}

/// Whether manifest `next` extends manifest `prev` (its predecessor in the
/// history): the one rule that says the archive never forked (ARCHIVE.md
/// "Manifest history"). It holds when
///
/// 1. `next.epoch >= prev.epoch`, `next.shipped_seq >= prev.shipped_seq`,
///    and `prev.retained_from <= next.retained_from <= next.number`;
/// 2. `next.segments` starts with exactly `prev.segments`;
/// 3. `prev.chunks` are either kept (`next.chunks` starts with them, and no
///    segment was added) or folded (the first added segment starts where
///    they start, `segment_first_seq`, and reaches at least their last seq);
/// 4. every added entry after that starts at the seq after the one before
///    it (after `prev.shipped_seq`, or after the folded segment), and every
///    added chunk carries `next.epoch`;
/// 5. `next.shipped_seq` is the last seq of its last entry, and
///    `next.shipped_chain` the chain value it ends with (its `chain_after`,
///    or a segment's `chain_end`; 64 zeros when it lists none), so the
///    chain goes on from `prev`'s, whose entries it keeps;
/// 6. with `next.compactions` non-empty, 2 and 3 give way to the
///    compaction rule (`extends_compacted`): the segments from the first
///    one a compaction lists are replaced by the rewritten ones, and the
///    chunks start over.
///
/// A takeover manifest lists exactly its predecessor's entries under a newer
/// epoch, which extends it. Only the manifests are compared: the objects'
/// bytes and chain values are checked when they are read (restore,
/// `verify --from`).
pub fn extends(prev: &Manifest, next: &Manifest) -> Result<(), Fork> {
    if next.epoch < prev.epoch {
        return Err(Fork::EpochWentBack {
            prev: prev.epoch,
            next: next.epoch,
        });
    }
    if next.retained_from < prev.retained_from || next.retained_from > next.number.max(1) {
        return Err(Fork::RetainedFromWentBack {
            prev: prev.retained_from,
            next: next.retained_from,
        });
    }
    if next.shipped_seq < prev.shipped_seq {
        return Err(Fork::ShippedSeqWentBack {
            prev: prev.shipped_seq,
            next: next.shipped_seq,
        });
    }
    if !next.compactions.is_empty() {
        return extends_compacted(prev, next);
    }
    if let Some(index) =
        (0..prev.segments.len()).find(|&i| next.segments.get(i) != Some(&prev.segments[i]))
    {
        return Err(Fork::SegmentChanged {
            index,
            key: prev.segments[index].key.clone(),
        });
    }
    let added_segments = &next.segments[prev.segments.len()..];
    let chunks_kept = added_segments.is_empty() && next.chunks.starts_with(&prev.chunks);
    let merged = if added_segments.is_empty() && !chunks_kept {
        merged_chunk(prev, next)
    } else {
        None
    };
    let mut end = prev.shipped_seq;
    let mut new_segments = added_segments;
    let mut new_chunks: &[ChunkEntry] = &next.chunks;
    if chunks_kept {
        new_chunks = &next.chunks[prev.chunks.len()..];
    } else if let Some(at) = merged {
        end = next.chunks[at].last_seq;
        new_chunks = &next.chunks[at + 1..];
    } else if let Some(first) = prev.chunks.first() {
        let folded = added_segments
            .first()
            .filter(|s| s.first_seq == first.segment_first_seq && s.last_seq >= prev.shipped_seq);
        let Some(folded) = folded else {
            let index = (0..prev.chunks.len())
                .find(|&i| next.chunks.get(i) != Some(&prev.chunks[i]))
                .unwrap_or(0);
            return Err(Fork::ChunkChanged {
                index,
                key: prev.chunks[index].key.clone(),
            });
        };
        end = folded.last_seq;
        new_segments = &added_segments[1..];
    }
    entries_go_on(next, end, new_segments, new_chunks)
}

/// Rules 4 and 5 of [`extends`]: the entries `next` adds
/// (`new_segments`, then `new_chunks`) start at the seq after `end` and
/// each at the seq after the one before, every chunk of `next.epoch`; its
/// `shipped_seq` and `shipped_chain` are where its entries end.
fn entries_go_on(
    next: &Manifest,
    mut end: Seq,
    new_segments: &[SegmentEntry],
    new_chunks: &[ChunkEntry],
) -> Result<(), Fork> {
    let added = new_segments
        .iter()
        .map(|s| (&s.key, s.first_seq, s.last_seq, None))
        .chain(
            new_chunks
                .iter()
                .map(|c| (&c.key, c.first_seq, c.last_seq, Some(c.epoch))),
        );
    for (key, first_seq, last_seq, chunk_epoch) in added {
        if first_seq != end + 1 {
            return Err(Fork::Gap {
                key: key.clone(),
                first_seq,
                expected: end + 1,
            });
        }
        if let Some(chunk_epoch) = chunk_epoch.filter(|&e| e != next.epoch) {
            return Err(Fork::ForeignChunk {
                key: key.clone(),
                chunk_epoch,
                epoch: next.epoch,
            });
        }
        end = last_seq;
    }
    if end != next.shipped_seq {
        return Err(Fork::ShippedSeqMismatch {
            shipped_seq: next.shipped_seq,
            entries_end: end,
        });
    }
    let entries_chain = match (next.chunks.last(), next.segments.last()) {
        (Some(chunk), _) => chunk.chain_after,
        (None, Some(segment)) => segment.chain_end,
        (None, None) => [0; 32],
    };
    if next.shipped_chain != entries_chain {
        return Err(Fork::ShippedChainMismatch {
            shipped_chain: next.shipped_chain,
            entries_chain,
        });
    }
    Ok(())
}

/// [`extends`] for a `next` that applies compactions (ARCHIVE.md
/// "Manifest history", rule 6): `prev`'s segments are kept up to the
/// first one a compaction lists; from there each is replaced by an entry
/// of `next` with the same seqs, another key and the chain value the
/// compactions (applied in order, each listed `old_chain_end` the chain
/// the segment has by then) end it with; `prev.chunks` are dropped (the
/// active segment's header changed), and the entries after the sealed
/// segments start over from the seq after the last one `prev` holds
/// sealed. A segment added that a compaction lists ends with its listed
/// chain. Every compaction record is after `prev.shipped_seq` and the one
/// before it, and at most `next.shipped_seq`.
fn extends_compacted(prev: &Manifest, next: &Manifest) -> Result<(), Fork> {
    use std::collections::BTreeMap;
    let mut after = prev.shipped_seq;
    for c in &next.compactions {
        if c.record_seq <= after || c.record_seq > next.shipped_seq {
            return Err(Fork::CompactionOutOfPlace {
                record_seq: c.record_seq,
                prev_shipped_seq: prev.shipped_seq,
                shipped_seq: next.shipped_seq,
            });
        }
        after = c.record_seq;
    }
    // first seq -> (last seq, chain value, index in prev.segments)
    let mut chains: BTreeMap<Seq, (Seq, ChainValue, Option<usize>)> = prev
        .segments
        .iter()
        .enumerate()
        .map(|(i, s)| (s.first_seq, (s.last_seq, s.chain_end, Some(i))))
        .collect();
    let prev_end = prev.segments.last().map_or(0, |s| s.last_seq);
    let mut rewritten = std::collections::BTreeSet::new();
    for c in &next.compactions {
        for s in &c.segments {
            let of_another = |found: String| Fork::CompactionOfAnotherHistory {
                record_seq: c.record_seq,
                first_seq: s.first_seq,
                last_seq: s.last_seq,
                old_chain_end: s.old_chain_end,
                found,
            };
            match chains.get_mut(&s.first_seq) {
                Some((last_seq, chain, _)) => {
                    if *last_seq != s.last_seq || *chain != s.old_chain_end {
                        return Err(of_another(format!(
                            "segment {}..={last_seq} ending with chain {}",
                            s.first_seq,
                            chain_hex(chain)
                        )));
                    }
                    *chain = s.new_chain_end;
                }
                None if s.first_seq <= prev_end || s.last_seq < s.first_seq => {
                    return Err(of_another("no segment starts there".into()));
                }
                None => {
                    chains.insert(s.first_seq, (s.last_seq, s.new_chain_end, None));
                }
            }
            rewritten.insert(s.first_seq);
        }
    }
    let first_rewritten = prev
        .segments
        .iter()
        .position(|s| rewritten.contains(&s.first_seq))
        .unwrap_or(prev.segments.len());
    if let Some(index) =
        (0..first_rewritten).find(|&i| next.segments.get(i) != Some(&prev.segments[i]))
    {
        return Err(Fork::SegmentChanged {
            index,
            key: prev.segments[index].key.clone(),
        });
    }
    for (index, old) in prev.segments.iter().enumerate().skip(first_rewritten) {
        let replaced = next.segments.get(index).is_some_and(|new| {
            rewritten.contains(&old.first_seq)
                && new.first_seq == old.first_seq
                && new.last_seq == old.last_seq
                && new.key != old.key
                && new.chain_end == chains[&old.first_seq].1
        });
        if !replaced {
            return Err(Fork::RewriteMissing {
                index,
                key: old.key.clone(),
            });
        }
    }
    let new_segments = next.segments.get(prev.segments.len()..).unwrap_or(&[]);
    for s in new_segments {
        if let Some((_, chain, None)) = chains.get(&s.first_seq) {
            if s.chain_end != *chain {
                return Err(Fork::RewrittenChainMismatch { key: s.key.clone() });
            }
        }
    }
    // The chunks start over: one of `prev` listed again names bytes of the
    // active segment before its header changed.
    if let Some(index) = prev
        .chunks
        .iter()
        .position(|c| next.chunks.iter().any(|n| n.key == c.key))
    {
        return Err(Fork::ChunkChanged {
            index,
            key: prev.chunks[index].key.clone(),
        });
    }
    entries_go_on(next, prev_end, new_segments, &next.chunks)
}

/// Where `next` lists a **merge** of `prev`'s last chunks (`sync` mode
/// puts one chunk holding the bytes of a run of chunks and lists it in
/// their place, ARCHIVE.md "Sync mode"): the index in `next.chunks` of the
/// chunk that replaces `prev.chunks[k..]`, when the chunks before it are
/// `prev.chunks[..k]` unchanged and it starts where `prev.chunks[k]` did
/// (same segment, seq and offset), reaches at least `prev.shipped_seq`
/// (replacing two chunks or more, or reaching past it: one chunk listed
/// again over the same seqs with other bytes is a fork), and is of
/// `next`'s epoch, as are the chunks it replaces (a writer merges
/// only its own).
fn merged_chunk(prev: &Manifest, next: &Manifest) -> Option<usize> {
    let k = prev
        .chunks
        .iter()
        .zip(&next.chunks)
        .take_while(|(a, b)| a == b)
        .count();
    let replaced = prev.chunks.get(k)?;
    let merged = next.chunks.get(k)?;
    (merged.segment_first_seq == replaced.segment_first_seq
        && merged.first_seq == replaced.first_seq
        && merged.offset == replaced.offset
        && merged.last_seq >= prev.shipped_seq
        && (prev.chunks.len() - k >= 2 || merged.last_seq > prev.shipped_seq)
        && merged.epoch == next.epoch
        && prev.chunks[k..].iter().all(|c| c.epoch == next.epoch))
    .then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(first_seq: Seq, last_seq: Seq) -> SegmentEntry {
        SegmentEntry {
            key: segment_key("p", first_seq, 1),
            first_seq,
            last_seq,
            bytes: 100,
            blake3: [0xbb; 32],
            chain_end: [0xcc; 32],
        }
    }

    fn chunk(segment_first_seq: Seq, first_seq: Seq, last_seq: Seq, epoch: u64) -> ChunkEntry {
        ChunkEntry {
            key: chunk_key("p", first_seq, last_seq, epoch),
            epoch,
            segment_first_seq,
            first_seq,
            last_seq,
            offset: 0,
            bytes: 200,
            blake3: [0xdd; 32],
            chain_after: [0xee; 32],
        }
    }

    fn manifest(
        number: u64,
        epoch: u64,
        segments: Vec<SegmentEntry>,
        chunks: Vec<ChunkEntry>,
    ) -> Manifest {
        let shipped_seq = chunks
            .last()
            .map(|c| c.last_seq)
            .or(segments.last().map(|s| s.last_seq))
            .unwrap_or(0);
        let shipped_chain = chunks
            .last()
            .map(|c| c.chain_after)
            .or(segments.last().map(|s| s.chain_end))
            .unwrap_or([0; 32]);
        Manifest {
            number,
            epoch,
            written_ms: 0,
            shipped_seq,
            shipped_chain,
            segments,
            chunks,
            lease_ms: 0,
            checkpoints: Vec::new(),
            compactions: Vec::new(),
            retained_from: 1,
        }
    }

    /// `00 01 02 .. 1f`: a value whose hex shows byte order.
    fn counting() -> [u8; 32] {
        std::array::from_fn(|i| i as u8)
    }

    const COUNTING_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn chain_values_and_digests_are_bytes_in_memory_and_the_same_hex_on_the_wire() {
        let mut m = manifest(7, 2, vec![segment(1, 12)], vec![chunk(13, 13, 20, 2)]);
        m.segments[0].chain_end = counting();
        m.checkpoints.push(CheckpointEntry {
            key: checkpoint_key("p", 12, 2),
            seq: 12,
            ts_ms: 5,
            bytes: 9,
            blake3: [0xab; 32],
            chain: counting(),
        });
        // The body as it was written when these fields were hex strings.
        let (b, d, e, ab) = (
            "bb".repeat(32),
            "dd".repeat(32),
            "ee".repeat(32),
            "ab".repeat(32),
        );
        let literal = format!(
            concat!(
                r#"{{"number":7,"epoch":2,"written_ms":0,"shipped_seq":20,"shipped_chain":"{e}","#,
                r#""segments":[{{"key":"p/segment/00000000000000000001.seg","first_seq":1,"#,
                r#""last_seq":12,"bytes":100,"blake3":"{b}","chain_end":"{c}"}}],"#,
                r#""chunks":[{{"key":"p/chunk/00000000000000000013-00000000000000000020-"#,
                r#"00000000000000000002.chunk","epoch":2,"segment_first_seq":13,"first_seq":13,"#,
                r#""last_seq":20,"offset":0,"bytes":200,"blake3":"{d}","chain_after":"{e}"}}],"#,
                r#""checkpoints":[{{"key":"p/checkpoint/00000000000000000012-"#,
                r#"00000000000000000002.ckpt","seq":12,"ts_ms":5,"bytes":9,"blake3":"{ab}","#,
                r#""chain":"{c}"}}]}}"#
            ),
            e = e,
            b = b,
            c = COUNTING_HEX,
            d = d,
            ab = ab
        );
        let bytes = m.encode();
        assert_eq!(
            std::str::from_utf8(&bytes[DOC_HEADER_LEN..]).unwrap(),
            literal
        );
        assert_eq!(
            bytes,
            encode_doc(MANIFEST_MAGIC, 7, literal.as_bytes()),
            "the whole object, frame included"
        );
        assert_eq!(Manifest::decode(&bytes, 7).unwrap(), m);
    }

    #[test]
    fn a_malformed_hex_value_is_refused_naming_the_object_and_the_text() {
        let m = manifest(7, 2, vec![segment(1, 12)], vec![]);
        let body = String::from_utf8(m.encode()[DOC_HEADER_LEN..].to_vec()).unwrap();
        let good = "cc".repeat(32);
        for bad in [
            "CC".repeat(32),
            "cc".repeat(31),
            format!("{}zz", "cc".repeat(31)),
            "cc".repeat(33),
        ] {
            let forged = body.replacen(&good, &bad, 1);
            assert_ne!(forged, body);
            let err =
                Manifest::decode(&encode_doc(MANIFEST_MAGIC, 7, forged.as_bytes()), 7).unwrap_err();
            assert!(
                matches!(&err, ObjectError::Json(message)
                    if message.starts_with("manifest 7: ") && message.contains(&bad)),
                "{err}"
            );
        }
    }

    #[test]
    fn checkpoints_are_listed_only_when_shipped_and_are_not_history() {
        let m1 = manifest(1, 1, vec![segment(1, 12)], vec![chunk(13, 13, 20, 1)]);
        // None shipped: the bytes are what they were before checkpoints.
        assert!(!String::from_utf8_lossy(&m1.encode()).contains("checkpoints"));
        let entry = CheckpointEntry {
            key: checkpoint_key("p", 12, 1),
            seq: 12,
            ts_ms: 99,
            bytes: 1000,
            blake3: [0xaa; 32],
            chain: [0xbb; 32],
        };
        assert_eq!(
            entry.key,
            "p/checkpoint/00000000000000000012-00000000000000000001.ckpt"
        );
        let m2 = Manifest {
            number: 2,
            checkpoints: vec![entry],
            ..m1.clone()
        };
        let bytes = m2.encode();
        assert_eq!(Manifest::decode(&bytes, 2).unwrap(), m2);
        // Derived state: listing one (or dropping it) forks nothing.
        assert_eq!(extends(&m1, &m2), Ok(()));
        let m3 = Manifest {
            number: 3,
            checkpoints: Vec::new(),
            ..m2.clone()
        };
        assert_eq!(extends(&m2, &m3), Ok(()));
    }

    #[test]
    fn a_lease_renewal_extends_and_no_lease_keeps_the_old_bytes() {
        // A renewal: the same entries under the same epoch, numbered next,
        // written later (ARCHIVE.md "Lease").
        let m1 = Manifest {
            lease_ms: 3000,
            ..manifest(1, 1, vec![segment(1, 12)], vec![chunk(13, 13, 20, 1)])
        };
        let renewal = Manifest {
            number: 2,
            written_ms: m1.written_ms + 1000,
            ..m1.clone()
        };
        assert_eq!(extends(&m1, &renewal), Ok(()));
        let bytes = renewal.encode();
        assert_eq!(Manifest::decode(&bytes, 2).unwrap(), renewal);
        assert!(String::from_utf8_lossy(&bytes).contains("\"lease_ms\":3000"));
        // Without a lease the field is left out: the bytes of a manifest
        // (and an epoch object) are what they were before leases.
        let plain = Manifest {
            lease_ms: 0,
            ..renewal
        };
        let bytes = plain.encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("lease_ms"));
        assert_eq!(Manifest::decode(&bytes, 2).unwrap().lease_ms, 0);
        let epoch = EpochDoc {
            epoch: 3,
            writer: "w".into(),
            taken_ms: 5,
            lease_ms: 0,
        };
        let bytes = epoch.encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("lease_ms"));
        let leased = EpochDoc {
            lease_ms: 900,
            ..epoch
        };
        assert_eq!(EpochDoc::decode(&leased.encode(), 3).unwrap(), leased);
    }

    #[test]
    fn key_epoch_reads_every_log_object_key() {
        for (key, epoch) in [
            (segment_key("p", 5, 1), Some(1)),
            (segment_key("p/q", 5, 3), Some(3)),
            (compacted_segment_key("p", 5, 1, 90), Some(1)),
            (compacted_segment_key("", 5, 4, 90), Some(4)),
            (chunk_key("p", 5, 9, 2), Some(2)),
            (checkpoint_key("p", 5, 7), Some(7)),
            (manifest_key("p", 5), None),
            (epoch_key("p", 5), None),
            (blob_key("p", &[1; 32]), None),
            ("p/segment/notes.txt".to_owned(), None),
            ("p/segment/5.seg".to_owned(), None),
        ] {
            assert_eq!(key_epoch(&key), epoch, "{key}");
        }
        assert_eq!(
            key_compaction(&compacted_segment_key("p", 5, 1, 90)),
            Some(90)
        );
        assert_eq!(
            key_compaction(&compacted_segment_key("p", 5, 3, 91)),
            Some(91)
        );
        assert_eq!(key_compaction(&segment_key("p", 5, 3)), None);
        assert_eq!(key_compaction(&chunk_key("p", 5, 9, 2)), None);
    }

    #[test]
    fn retained_from_is_optional_never_goes_back_and_stays_within_the_number() {
        let m1 = manifest(4, 1, vec![segment(1, 12)], vec![]);
        // Absent: 1, and a manifest at 1 is written as before.
        let bytes = m1.encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("retained_from"));
        assert_eq!(Manifest::decode(&bytes, 4).unwrap().retained_from, 1);
        let m2 = Manifest {
            number: 5,
            retained_from: 3,
            ..m1.clone()
        };
        let bytes = m2.encode();
        assert!(String::from_utf8_lossy(&bytes).contains("\"retained_from\":3"));
        assert_eq!(Manifest::decode(&bytes, 5).unwrap(), m2);
        assert_eq!(extends(&m1, &m2), Ok(()));
        // Going back, or past its own number, forks.
        let back = Manifest {
            number: 6,
            retained_from: 2,
            ..m2.clone()
        };
        assert!(matches!(
            extends(&m2, &back),
            Err(Fork::RetainedFromWentBack { prev: 3, next: 2 })
        ));
        let past = Manifest {
            number: 6,
            retained_from: 7,
            ..m2.clone()
        };
        assert!(extends(&m2, &past).is_err());
        let error = Manifest::decode(&past.encode(), 6).unwrap_err();
        assert!(error.to_string().contains("retained_from 7"), "{error}");
    }

    #[test]
    fn a_merge_of_the_last_chunks_extends_and_a_merge_that_drops_ops_does_not() {
        let m1 = manifest(
            1,
            1,
            vec![],
            vec![chunk(1, 1, 2, 1), chunk(1, 3, 4, 1), chunk(1, 5, 6, 1)],
        );
        // Chunks 3..=6 merged into one, a new chunk after it.
        let m2 = manifest(
            2,
            1,
            vec![],
            vec![chunk(1, 1, 2, 1), chunk(1, 3, 6, 1), chunk(1, 7, 8, 1)],
        );
        assert_eq!(extends(&m1, &m2), Ok(()));
        // Merged together with the new ops.
        let m2b = manifest(2, 1, vec![], vec![chunk(1, 1, 2, 1), chunk(1, 3, 8, 1)]);
        assert_eq!(extends(&m1, &m2b), Ok(()));
        // A "merge" that ends before what was shipped drops ops.
        let short = manifest(2, 1, vec![], vec![chunk(1, 1, 2, 1), chunk(1, 3, 5, 1)]);
        assert!(extends(&m1, &short).is_err());
        // One of another epoch is not this writer's merge.
        let foreign = manifest(2, 2, vec![], vec![chunk(1, 1, 2, 1), chunk(1, 3, 8, 1)]);
        assert!(extends(&m1, &foreign).is_err());
    }

    #[test]
    fn what_a_shipper_writes_extends_the_manifest_before_it() {
        let m1 = manifest(1, 1, vec![], vec![chunk(1, 1, 5, 1)]);
        let m2 = manifest(2, 1, vec![], vec![chunk(1, 1, 5, 1), chunk(1, 6, 9, 1)]);
        // The segment seals: its chunks fold, later segments and a chunk follow.
        let m3 = manifest(
            3,
            1,
            vec![segment(1, 12), segment(13, 20)],
            vec![chunk(21, 21, 22, 1)],
        );
        let m4 = manifest(
            4,
            1,
            vec![segment(1, 12), segment(13, 20), segment(21, 30)],
            vec![],
        );
        // A takeover: the same entries under a newer epoch, then its chunks.
        let m5 = Manifest {
            number: 5,
            epoch: 2,
            ..m4.clone()
        };
        let m6 = manifest(
            6,
            2,
            m4.segments.clone(),
            vec![chunk(31, 31, 31, 2), chunk(31, 32, 40, 2)],
        );
        let empty = manifest(0, 1, vec![], vec![]);
        for (prev, next) in [
            (&empty, &m1),
            (&m1, &m2),
            (&m2, &m3),
            (&m3, &m4),
            (&m4, &m5),
            (&m5, &m6),
            (&m2, &m2),
        ] {
            assert_eq!(
                extends(prev, next),
                Ok(()),
                "{} -> {}",
                prev.number,
                next.number
            );
        }
    }

    #[test]
    fn a_fork_is_named() {
        let m1 = manifest(1, 2, vec![segment(1, 10)], vec![chunk(11, 11, 15, 2)]);
        let older = Manifest {
            epoch: 1,
            ..m1.clone()
        };
        assert!(matches!(
            extends(&m1, &older),
            Err(Fork::EpochWentBack { prev: 2, next: 1 })
        ));
        // Another writer's history: segment 1 listed with other bytes.
        let mut other = segment(1, 10);
        other.blake3 = [0; 32];
        let forked = manifest(2, 2, vec![other], vec![chunk(11, 11, 15, 2)]);
        assert!(matches!(
            extends(&m1, &forked),
            Err(Fork::SegmentChanged { index: 0, .. })
        ));
        // A chunk replaced by another one over the same seqs.
        let mut replaced = chunk(11, 11, 15, 2);
        replaced.blake3 = [0x11; 32];
        let m2 = manifest(2, 2, vec![segment(1, 10)], vec![replaced]);
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::ChunkChanged { index: 0, .. })
        ));
        // A gap after the shipped seq.
        let m2 = manifest(
            2,
            2,
            vec![segment(1, 10)],
            vec![chunk(11, 11, 15, 2), chunk(11, 17, 20, 2)],
        );
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::Gap {
                first_seq: 17,
                expected: 16,
                ..
            })
        ));
        // An older writer's chunk named by a newer epoch's manifest.
        let m2 = manifest(
            2,
            3,
            vec![segment(1, 10)],
            vec![chunk(11, 11, 15, 2), chunk(11, 16, 20, 2)],
        );
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::ForeignChunk {
                chunk_epoch: 2,
                epoch: 3,
                ..
            })
        ));
        // Fewer ops.
        let m2 = manifest(2, 2, vec![segment(1, 10)], vec![]);
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::ShippedSeqWentBack { prev: 15, next: 10 })
        ));
        // A shipped_seq that is not where the entries end.
        let mut m2 = m1.clone();
        m2.shipped_seq = 16;
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::ShippedSeqMismatch {
                shipped_seq: 16,
                entries_end: 15
            })
        ));
        // The same entries with another head chain: the chain does not go
        // on from the one before (a renewal of another history, say).
        let mut m2 = Manifest {
            number: 2,
            ..m1.clone()
        };
        m2.shipped_chain = [0x99; 32];
        assert!(matches!(
            extends(&m1, &m2),
            Err(Fork::ShippedChainMismatch { ref shipped_chain, ref entries_chain })
                if *shipped_chain == [0x99; 32] && *entries_chain == [0xee; 32]
        ));
        // None listed: the chain is 64 zeros.
        let empty = manifest(1, 1, vec![], vec![]);
        let mut m2 = Manifest {
            number: 2,
            ..empty.clone()
        };
        assert_eq!(extends(&empty, &m2), Ok(()));
        m2.shipped_chain = [0x99; 32];
        assert!(matches!(
            extends(&empty, &m2),
            Err(Fork::ShippedChainMismatch { .. })
        ));
    }

    fn rewrite(first_seq: Seq, last_seq: Seq, old: u8, new: u8) -> RewrittenSegment {
        RewrittenSegment {
            first_seq,
            last_seq,
            old_chain_end: [old; 32],
            new_chain_end: [new; 32],
        }
    }

    /// Segment `first..=last` ending with chain `[chain; 32]`, under the
    /// key of compaction `record_seq` (0: a plain key).
    fn sealed(first_seq: Seq, last_seq: Seq, chain: u8, record_seq: Seq) -> SegmentEntry {
        SegmentEntry {
            key: if record_seq == 0 {
                segment_key("p", first_seq, 1)
            } else {
                compacted_segment_key("p", first_seq, 1, record_seq)
            },
            chain_end: [chain; 32],
            ..segment(first_seq, last_seq)
        }
    }

    /// Before: segments 1..=10, 11..=20, 21..=30 sealed (chains 1, 2, 3),
    /// chunks of segment 31 up to 35. A compaction at seq 45 rewrote 11..=20
    /// and 21..=30 and 31..=40 (sealed since), the active segment 41 got a
    /// new header.
    fn before_and_after() -> (Manifest, Manifest) {
        let prev = manifest(
            4,
            1,
            vec![
                sealed(1, 10, 1, 0),
                sealed(11, 20, 2, 0),
                sealed(21, 30, 3, 0),
            ],
            vec![chunk(31, 31, 33, 1), chunk(31, 34, 35, 1)],
        );
        let mut next = manifest(
            5,
            1,
            vec![
                sealed(1, 10, 1, 0),
                sealed(11, 20, 0x12, 45),
                sealed(21, 30, 0x13, 45),
                sealed(31, 40, 0x14, 45),
            ],
            vec![chunk(41, 41, 46, 1)],
        );
        next.compactions = vec![CompactionEntry {
            record_seq: 45,
            segments: vec![
                rewrite(11, 20, 2, 0x12),
                rewrite(21, 30, 3, 0x13),
                rewrite(31, 40, 4, 0x14),
            ],
        }];
        (prev, next)
    }

    #[test]
    fn a_compacted_segment_key_carries_the_compaction_and_the_epoch() {
        assert_eq!(
            compacted_segment_key("p", 11, 1, 45),
            "p/segment/00000000000000000011-c00000000000000000045.seg"
        );
        assert_eq!(
            compacted_segment_key("", 11, 3, 45),
            "segment/00000000000000000011-00000000000000000003-c00000000000000000045.seg"
        );
    }

    #[test]
    fn compactions_are_listed_only_when_applied_and_read_back() {
        let (prev, next) = before_and_after();
        assert!(!String::from_utf8_lossy(&prev.encode()).contains("compactions"));
        let body = String::from_utf8(next.encode()[DOC_HEADER_LEN..].to_vec()).unwrap();
        let expected = format!(
            r#""compactions":[{{"record_seq":45,"segments":[{{"first_seq":11,"last_seq":20,"old_chain_end":"{}","new_chain_end":"{}"}},"#,
            "02".repeat(32),
            "12".repeat(32)
        );
        assert!(body.contains(&expected), "{body}");
        assert_eq!(Manifest::decode(&next.encode(), 5).unwrap(), next);
    }

    #[test]
    fn a_manifest_that_applies_a_compaction_extends_the_one_before() {
        let (prev, next) = before_and_after();
        assert_eq!(extends(&prev, &next), Ok(()));
        // Then the history goes on as usual from it.
        let later = manifest(
            6,
            1,
            next.segments.clone(),
            vec![chunk(41, 41, 46, 1), chunk(41, 47, 50, 1)],
        );
        assert_eq!(extends(&next, &later), Ok(()));
        // The active segment only got a new header: nothing sealed was
        // rewritten past what the archive holds, a new first chunk.
        let prev = manifest(1, 1, vec![sealed(1, 10, 1, 0)], vec![chunk(11, 11, 15, 1)]);
        let mut next = manifest(
            2,
            1,
            vec![sealed(1, 10, 0x11, 16)],
            vec![chunk(11, 11, 16, 1)],
        );
        next.compactions = vec![CompactionEntry {
            record_seq: 16,
            segments: vec![rewrite(1, 10, 1, 0x11)],
        }];
        assert_eq!(extends(&prev, &next), Ok(()));
        // Two compactions in one manifest compose in order: the second
        // lists as old chain the first one's new one.
        let (prev, mut next) = before_and_after();
        next.compactions.push(CompactionEntry {
            record_seq: 46,
            segments: vec![rewrite(21, 30, 0x13, 0x23), rewrite(31, 40, 0x14, 0x24)],
        });
        next.segments[2] = sealed(21, 30, 0x23, 46);
        next.segments[3] = sealed(31, 40, 0x24, 46);
        assert_eq!(extends(&prev, &next), Ok(()));
        // ... and not in the other order.
        next.compactions.swap(0, 1);
        next.compactions[0].record_seq = 45;
        next.compactions[1].record_seq = 46;
        assert!(matches!(
            extends(&prev, &next),
            Err(Fork::CompactionOfAnotherHistory { first_seq: 21, .. })
        ));
    }

    #[test]
    fn a_compaction_that_does_not_fit_the_archive_is_a_fork() {
        let (prev, next) = before_and_after();
        // A replaced entry whose listed old chain is not the archived one.
        let mut wrong_old = next.clone();
        wrong_old.compactions[0].segments[1].old_chain_end = [0x77; 32];
        assert!(matches!(
            extends(&prev, &wrong_old),
            Err(Fork::CompactionOfAnotherHistory { first_seq: 21, .. })
        ));
        // A replaced entry that no listed compaction names.
        let mut unlisted = next.clone();
        unlisted.compactions[0].segments.remove(1);
        assert!(matches!(
            extends(&prev, &unlisted),
            Err(Fork::RewriteMissing { index: 2, .. })
        ));
        // The segments before the first listed one changed.
        let mut changed = next.clone();
        changed.segments[0].blake3 = [0x01; 32];
        assert!(matches!(
            extends(&prev, &changed),
            Err(Fork::SegmentChanged { index: 0, .. })
        ));
        // The replacing entry does not end with the listed new chain, or
        // keeps the old key (an object that exists with the old bytes).
        let mut other_chain = next.clone();
        other_chain.segments[1].chain_end = [0x55; 32];
        assert!(matches!(
            extends(&prev, &other_chain),
            Err(Fork::RewriteMissing { index: 1, .. })
        ));
        let mut old_key = next.clone();
        old_key.segments[1].key = prev.segments[1].key.clone();
        assert!(matches!(
            extends(&prev, &old_key),
            Err(Fork::RewriteMissing { index: 1, .. })
        ));
        // A listed segment the archive holds with other bounds.
        let mut bounds = next.clone();
        bounds.compactions[0].segments[0].last_seq = 19;
        assert!(matches!(
            extends(&prev, &bounds),
            Err(Fork::CompactionOfAnotherHistory { first_seq: 11, .. })
        ));
        // A segment added that a compaction lists, with another chain.
        let mut added = next.clone();
        added.segments[3].chain_end = [0x66; 32];
        assert!(matches!(
            extends(&prev, &added),
            Err(Fork::RewrittenChainMismatch { .. })
        ));
        // The compaction record already shipped, or not shipped by it.
        let mut early = next.clone();
        early.compactions[0].record_seq = 35;
        assert!(matches!(
            extends(&prev, &early),
            Err(Fork::CompactionOutOfPlace { record_seq: 35, .. })
        ));
        let mut late = next.clone();
        late.compactions[0].record_seq = 47;
        assert!(matches!(
            extends(&prev, &late),
            Err(Fork::CompactionOutOfPlace { record_seq: 47, .. })
        ));
        // The old chunks kept across the compaction: their bytes have the
        // old header.
        let mut kept = next.clone();
        kept.segments.truncate(3);
        kept.chunks = vec![
            chunk(31, 31, 33, 1),
            chunk(31, 34, 35, 1),
            chunk(31, 36, 46, 1),
        ];
        kept.shipped_seq = 46;
        assert!(matches!(
            extends(&prev, &kept),
            Err(Fork::ChunkChanged { index: 0, .. })
        ));
        // Without the compaction listed, the rewrite is a fork as before.
        let mut silent = next.clone();
        silent.compactions.clear();
        assert!(matches!(
            extends(&prev, &silent),
            Err(Fork::SegmentChanged { index: 1, .. })
        ));
        // Entries after the sealed ones start at the seq after them.
        let mut gap = next.clone();
        gap.segments.truncate(3);
        gap.chunks = vec![chunk(31, 36, 46, 1)];
        assert!(matches!(
            extends(&prev, &gap),
            Err(Fork::Gap {
                first_seq: 36,
                expected: 31,
                ..
            })
        ));
    }
}
