//! The request index as a checkpoint stores it, used in place.
//!
//! The section (`log-format/CHECKPOINT.md`, "Request index") is the index's
//! own layout: the hash table's slots, the 32-byte rows and the arena of
//! length-prefixed texts, little-endian, each text reference a byte offset
//! into the arena. [`encode_section`] writes it from any index (rows in
//! seq order, placed in a fresh table in that order, so one state and one
//! seed give one section); [`decode_section`] checks every byte of it once
//! and gives a [`StoredIndex`] that probes the bytes where they are, so a
//! start from a checkpoint neither copies nor inserts a request id.

use std::hash::BuildHasher;
use std::sync::Arc;

use super::{
    home, position_of, probe_slots, tag_of, Probe, RequestIndex, RequestRow, Row, TextRef,
    ENTITY_IS_NAME, MAX_LOAD_TENTHS, MAX_ROWS, MIN_SLOTS, TEXT_REF_BITS,
};
use crate::ids::Id;
use crate::len_prefixed::{checked_read, push};
use crate::op::{Entity, OpKind};

/// Bytes of the section's head: row count, slot count, arena bytes.
const HEAD_BYTES: usize = 24;
/// Bytes of one stored row: seq, entity, meta.
const ROW_BYTES: usize = 32;
/// Bits of [`Row::meta`] in use (text ref, kind code, name bit).
const META_BITS: u32 = 53;
/// Slots read ahead of their row's tag in the check of the table.
const CHECK_AHEAD: usize = 16;

/// Where the bytes of a [`StoredIndex`] live.
pub enum Backing {
    /// A read-only mapping of the checkpoint file (or of its section).
    Mapped(memmap2::Mmap),
    /// A copy (a checkpoint decoded from bytes in memory).
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(map) => map,
            Backing::Owned(bytes) => bytes,
        }
    }
}

/// Why a stored request index section is refused. Each names the row or
/// slot at fault; `at` offsets are bytes from the start of the section.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoredIndexError {
    /// The section's head or its parts run past the body.
    #[error("request index: {what} run past the body")]
    RunsPast {
        /// What does.
        what: &'static str,
    },
    /// The slot count is not 0 for no rows, or a power of two of at least
    /// 16 holding the rows at a load of at most 0.7.
    #[error("request index: {slots} slots for {rows} rows")]
    SlotCount {
        /// The slot count.
        slots: u64,
        /// The row count.
        rows: u64,
    },
    /// The zero padding after the arena holds another byte.
    #[error("request index: padding byte {at} is not zero")]
    Padding {
        /// Where, from the section's start.
        at: usize,
    },
    /// A row's seq is not above the one before, or past the checkpoint.
    #[error("request index row {row} ({key:?}): seq {seq} out of order")]
    RequestOrder {
        /// The row.
        row: usize,
        /// Its request id.
        key: String,
        /// Its seq.
        seq: u64,
    },
    /// A row's meta bits are not a text reference, a known op kind and a
    /// name flag.
    #[error("request index row {row}: meta {meta:#x} is not a text, a known op kind and a flag")]
    Meta {
        /// The row.
        row: usize,
        /// Its meta word.
        meta: u64,
    },
    /// A row's request id or entity name is not a whole UTF-8 text of the
    /// arena.
    #[error("request index row {row}: its {what} is not a UTF-8 text of the arena")]
    Text {
        /// The row.
        row: usize,
        /// "request id" or "entity name".
        what: &'static str,
    },
    /// A slot names no row, a row named before, a row whose request id
    /// does not hash to its tag, or a place its probe never reaches.
    #[error("request index slot {slot}: {why}")]
    Slot {
        /// The slot.
        slot: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Fewer slots name rows than there are rows.
    #[error("request index: {reached} of {rows} rows are in the table")]
    Unreached {
        /// Rows named by a slot.
        reached: usize,
        /// Rows.
        rows: usize,
    },
    /// A request id has two rows.
    #[error("request index: request {key:?} appears twice")]
    RequestTwice {
        /// The request id.
        key: String,
    },
}

/// A checkpoint's request index, probed in place. Its bytes were checked
/// by [`decode_section`]; the reads stay bounds-checked all the same (a
/// bad read gives an empty text, never a panic).
pub struct StoredIndex {
    backing: Arc<Backing>,
    /// Where the section starts in `backing`.
    start: usize,
    rows: usize,
    slots: usize,
    arena_bytes: usize,
    /// The file a mapping used in place reads ([`StoredIndex::remapped`]);
    /// `None` for bytes in memory.
    watched: Option<Arc<WatchedFile>>,
}

/// The checkpoint file an index reads in place, and its length and
/// modification time when it was opened. Checkpoints are only ever created
/// whole by a rename and removed by unlinking; a file written in place
/// while mapped (an operator's `cp` over it, a restore of `checkpoint/`
/// into a running engine) would change the request ids the index answers
/// for, so the write path asks [`RequestIndex::mapped_file_changed`]
/// around every batch and stops on a change.
pub(crate) struct WatchedFile {
    file: std::fs::File,
    path: std::path::PathBuf,
    len_bytes: u64,
    modified: Option<std::time::SystemTime>,
}

impl WatchedFile {
    /// `file` at `path`, with `seen`, its metadata read when it was opened
    /// (before its bytes were checked).
    pub(crate) fn new(
        file: &std::fs::File,
        path: &std::path::Path,
        seen: &std::fs::Metadata,
    ) -> std::io::Result<WatchedFile> {
        Ok(WatchedFile {
            file: file.try_clone()?,
            path: path.to_owned(),
            len_bytes: seen.len(),
            modified: seen.modified().ok(),
        })
    }

    /// What changed since the file was opened, in words, or `None`: its
    /// length or its modification time (one `fstat`).
    fn changed(&self) -> Option<String> {
        let what = match self.file.metadata() {
            Ok(now) if now.len() != self.len_bytes => format!(
                "its length went from {} to {} bytes",
                self.len_bytes,
                now.len()
            ),
            Ok(now) if now.modified().ok() != self.modified => {
                "its modification time changed".to_owned()
            }
            Ok(_) => return None,
            Err(e) => format!("its metadata cannot be read: {e}"),
        };
        Some(format!(
            "the checkpoint file {} whose request index the engine reads in place was \
             written to while the engine ran ({what}): the request ids it holds can no \
             longer be trusted, so writes are refused until a restart, which checks the \
             file again (a checkpoint is never written in place: stop the engine before \
             copying checkpoints in, or replace one by a rename)",
            self.path.display()
        ))
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

impl StoredIndex {
    fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    fn slots_at(&self) -> usize {
        self.start + HEAD_BYTES
    }

    fn rows_at(&self) -> usize {
        self.slots_at() + 8 * self.slots
    }

    fn arena(&self) -> &[u8] {
        let at = self.rows_at() + ROW_BYTES * self.rows;
        self.bytes().get(at..at + self.arena_bytes).unwrap_or(&[])
    }

    /// Number of rows.
    pub(super) fn len(&self) -> usize {
        self.rows
    }

    /// Bytes of the section (head, slots, rows, padded arena).
    pub(crate) fn section_bytes(&self) -> usize {
        section_len(self.rows, self.slots, self.arena_bytes)
    }

    fn slot(&self, at: usize) -> u64 {
        u64_at(self.bytes(), self.slots_at() + 8 * at)
    }

    fn raw(&self, position: usize) -> Row {
        let at = self.rows_at() + ROW_BYTES * position;
        let bytes = self.bytes();
        let entity = bytes
            .get(at + 8..at + 24)
            .map_or(0, |b| u128::from_le_bytes(b.try_into().expect("16 bytes")));
        Row {
            seq: u64_at(bytes, at),
            entity: Id(entity),
            meta: u64_at(bytes, at + 24),
        }
    }

    fn text(&self, at: TextRef) -> &[u8] {
        usize::try_from(at.0)
            .ok()
            .and_then(|at| checked_read(self.arena(), at))
            .map_or(&[], |(text, _)| text)
    }

    /// The request id of the row at `position`.
    pub(super) fn key(&self, position: usize) -> &str {
        std::str::from_utf8(self.text(self.raw(position).key())).unwrap_or_default()
    }

    /// The row at `position`.
    pub(super) fn row(&self, position: usize) -> RequestRow {
        let row = self.raw(position);
        let entity = if row.meta & ENTITY_IS_NAME != 0 {
            // Cast: a name's entity holds its 44-bit text reference.
            let name = self.text(TextRef(row.entity.0 as u64));
            Entity::Name(String::from_utf8_lossy(name).into_owned())
        } else {
            Entity::Id(row.entity)
        };
        RequestRow {
            seq: row.seq,
            // Checked when loaded: a code written from an `OpKind`.
            kind: OpKind::from_code(((row.meta >> TEXT_REF_BITS) & 0xFF) as u16)
                .unwrap_or(OpKind::MomentCreate),
            entity,
        }
    }

    /// The row of `request_id` (with its `hash` under the index's seed).
    pub(super) fn position(&self, hash: u64, request_id: &[u8]) -> Option<usize> {
        if self.slots == 0 {
            return None;
        }
        let probe = probe_slots(
            self.slots,
            hash,
            |at| self.slot(at),
            |position| position < self.rows && self.text(self.raw(position).key()) == request_id,
        );
        match probe {
            Some(Probe::Found(position)) => Some(position),
            Some(Probe::Free(_)) | None => None,
        }
    }

    /// The position of the row of the op at `seq`, if that op left one.
    pub(super) fn by_seq(&self, seq: u64) -> Option<usize> {
        let (mut low, mut high) = (0, self.rows);
        while low < high {
            let mid = low + (high - low) / 2;
            match self.raw(mid).seq.cmp(&seq) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Asks the CPU for the slot a probe of `hash` reads first (a hint).
    pub(super) fn prefetch(&self, hash: u64) {
        if self.slots == 0 {
            return;
        }
        let at = self.slots_at() + 8 * home(tag_of(hash), self.slots);
        if let Some(byte) = self.bytes().get(at) {
            super::prefetch_read(byte);
        }
    }

    /// The same rows over a mapping of the section alone, from `file` (the
    /// checkpoint whose whole mapping this one reads): the rest
    /// of the file is then no longer mapped, and the section's pages enter
    /// the process only as probes read them.
    ///
    /// Errors: the mapping failed.
    pub(crate) fn remapped(
        &self,
        file: &std::fs::File,
        watched: WatchedFile,
    ) -> std::io::Result<StoredIndex> {
        // SAFETY: checkpoint files are created whole by a rename and
        // removed by unlinking, never written in place (see
        // `checkpoint::load`), so the mapped bytes do not change; one
        // that is written in place all the same is caught by `watched`
        // around every batch of writes (`RequestIndex::mapped_file_changed`).
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(self.start as u64)
                .len(self.section_bytes())
                .map(file)
        }?;
        Ok(StoredIndex {
            backing: Arc::new(Backing::Mapped(map)),
            start: 0,
            rows: self.rows,
            slots: self.slots,
            arena_bytes: self.arena_bytes,
            watched: Some(Arc::new(watched)),
        })
    }

    /// The same rows in memory: a copy of the section's bytes (no row is
    /// inserted again), so that no file stays mapped.
    fn owned_copy(&self) -> StoredIndex {
        let bytes = self.bytes();
        let copy = bytes
            .get(self.start..self.start + self.section_bytes())
            .unwrap_or(&[])
            .to_vec();
        StoredIndex {
            backing: Arc::new(Backing::Owned(copy)),
            start: 0,
            rows: self.rows,
            slots: self.slots,
            arena_bytes: self.arena_bytes,
            watched: None,
        }
    }

    /// True if the bytes are a file's mapping.
    fn is_mapped(&self) -> bool {
        matches!(*self.backing, Backing::Mapped(_))
    }
}

/// The rows an index uses in place from a checkpoint file's mapping
/// ([`RequestIndex::mapped_rows`]): a handle to copy them into memory
/// without holding the index ([`MappedRows::copy`]), then to put the copy
/// in their place ([`RequestIndex::detach`]).
pub struct MappedRows(Arc<StoredIndex>);

/// A copy in memory of [`MappedRows`], for [`RequestIndex::detach`].
pub struct DetachedRows {
    from: Arc<StoredIndex>,
    copy: StoredIndex,
    /// The file was written to before the copy ended: the copy is not
    /// used ([`RequestIndex::detach`]), and the mapping stays, so that the
    /// write path goes on seeing the change.
    file_changed: bool,
}

impl MappedRows {
    /// Copies the rows' section into memory (a copy of its bytes, as slow
    /// as that many bytes of fresh memory; nothing is checked again: the
    /// bytes are the ones checked at load).
    pub fn copy(self) -> DetachedRows {
        let copy = self.0.owned_copy();
        let file_changed = self
            .0
            .watched
            .as_ref()
            .is_some_and(|watched| watched.changed().is_some());
        DetachedRows {
            from: self.0,
            copy,
            file_changed,
        }
    }
}

impl RequestIndex {
    /// Why the checkpoint file whose rows this index reads in place can no
    /// longer be trusted, or `None` (also for an index in memory): the
    /// file was written to since it was opened (its length or modification
    /// time changed; one `fstat`). The write path asks before and after
    /// deciding each batch, and stops on `Some`.
    pub fn mapped_file_changed(&self) -> Option<String> {
        self.stored.as_ref()?.watched.as_ref()?.changed()
    }

    /// The rows used in place from a checkpoint file's mapping, if any.
    /// While they are, the file's blocks stay allocated even once the file
    /// is removed: erasing content (SPEC section 13) removes the
    /// checkpoints that hold it, and then detaches the index from its file
    /// ([`RequestIndex::detach`]).
    pub fn mapped_rows(&self) -> Option<MappedRows> {
        self.stored
            .as_ref()
            .filter(|stored| stored.is_mapped())
            .map(|stored| MappedRows(Arc::clone(stored)))
    }

    /// Puts `rows` (a copy of this index's mapped rows) in their place, so
    /// that the index no longer maps the file; true if it did, false if the
    /// index no longer uses the rows the copy was made from (nothing
    /// changes then), or if the file was written to before the copy ended
    /// (the copy is not trusted; [`RequestIndex::mapped_file_changed`]
    /// goes on saying so). Answers are the same before and after.
    pub fn detach(&mut self, rows: DetachedRows) -> bool {
        let same = !rows.file_changed
            && self
                .stored
                .as_ref()
                .is_some_and(|stored| Arc::ptr_eq(stored, &rows.from));
        if same {
            self.stored = Some(Arc::new(rows.copy));
        }
        same
    }

    /// An index whose rows are `stored` (used in place), hashing with
    /// `seed` (the seed the stored table was built with).
    pub(crate) fn from_stored(seed: u64, stored: StoredIndex) -> RequestIndex {
        let mut index = RequestIndex::with_seed(seed);
        index.stored = (stored.rows > 0).then(|| Arc::new(stored));
        index
    }

    /// The stored rows, if the index was loaded from a checkpoint.
    pub(crate) fn stored(&self) -> Option<&StoredIndex> {
        self.stored.as_deref()
    }

    /// Replaces the stored rows by the same rows elsewhere (see
    /// [`StoredIndex::remapped`]).
    pub(crate) fn set_stored(&mut self, stored: StoredIndex) {
        self.stored = (stored.rows > 0).then(|| Arc::new(stored));
    }
}

/// Bytes of a section of `rows` rows, `slots` slots and `arena_bytes` of
/// texts (the arena padded to 8 bytes).
fn section_len(rows: usize, slots: usize, arena_bytes: usize) -> usize {
    HEAD_BYTES + 8 * slots + ROW_BYTES * rows + arena_bytes.next_multiple_of(8)
}

/// Slots of the stored table of `rows` rows: 0 for none, else the power
/// of two the in-memory table would grow to.
fn slots_for_stored(rows: usize) -> usize {
    if rows == 0 {
        0
    } else {
        RequestIndex::slots_for(rows)
            .max(MIN_SLOTS)
            .next_power_of_two()
    }
}

/// Appends `index`'s section to `out` (CHECKPOINT.md, "Request index"):
/// every row, stored and in memory, in seq order, its texts copied into one
/// arena in that order, and a table of the size [`slots_for_stored`] gives
/// with each row placed in that order by its hash under the index's seed.
/// A multiple of 8 bytes long.
pub(crate) fn encode_section(index: &RequestIndex, out: &mut Vec<u8>) {
    let rows = index.len();
    let slots = slots_for_stored(rows);
    let mut table = vec![0u64; slots];
    let mut stored_rows: Vec<u8> = Vec::with_capacity(ROW_BYTES * rows);
    let mut arena: Vec<u8> = Vec::new();
    let mask = slots.wrapping_sub(1);
    for (position, (key, row)) in index.iter().enumerate() {
        let tag = tag_of(index.hasher.hash_one(key.as_bytes()));
        let mut at = home(tag, slots);
        while table[at] != 0 {
            at = (at + 1) & mask;
        }
        // Cast: at most MAX_ROWS rows, so the position plus one fits.
        table[at] = (u64::from(tag) << 32) | (position as u64 + 1);
        let key_ref = arena.len() as u64;
        push(&mut arena, key.as_bytes());
        let (entity, name_bit) = match &row.entity {
            Entity::Id(id) => (id.0, 0),
            Entity::Name(name) => {
                let name_ref = arena.len() as u64;
                push(&mut arena, name.as_bytes());
                (u128::from(name_ref), ENTITY_IS_NAME)
            }
        };
        stored_rows.extend_from_slice(&row.seq.to_le_bytes());
        stored_rows.extend_from_slice(&entity.to_le_bytes());
        let meta = key_ref | (u64::from(row.kind.code()) << TEXT_REF_BITS) | name_bit;
        stored_rows.extend_from_slice(&meta.to_le_bytes());
    }
    let start = out.len();
    out.reserve(section_len(rows, slots, arena.len()));
    out.extend_from_slice(&(rows as u64).to_le_bytes());
    out.extend_from_slice(&(slots as u64).to_le_bytes());
    out.extend_from_slice(&(arena.len() as u64).to_le_bytes());
    for slot in table {
        out.extend_from_slice(&slot.to_le_bytes());
    }
    out.extend_from_slice(&stored_rows);
    out.extend_from_slice(&arena);
    out.resize(start + section_len(rows, slots, arena.len()), 0);
}

/// Checks the section at byte `start` of `backing` (ending at or before
/// `limit`), for an index hashing with `seed` in a checkpoint at
/// `max_seq`, and gives it in place with the byte where it ends. Every
/// byte is checked once: the head's counts against the bytes; each row's
/// seq (rising, at most `max_seq`), op kind, and texts (whole UTF-8 in the
/// arena), its request id hashed; each slot naming a row once, with that
/// row's tag, where a probe from the tag's home reaches it, and no other
/// row of the same request id before it; every row named; the padding
/// zero.
///
/// Errors: [`StoredIndexError`], naming the row or slot.
pub(crate) fn decode_section(
    backing: &Arc<Backing>,
    start: usize,
    limit: usize,
    seed: u64,
    max_seq: u64,
) -> Result<(StoredIndex, usize), StoredIndexError> {
    let bytes = backing.bytes();
    let (rows, slots, arena_bytes) = section_counts(bytes, start, limit)?;
    let end = start + section_len(rows, slots, arena_bytes);
    let stored = StoredIndex {
        backing: Arc::clone(backing),
        start,
        rows,
        slots,
        arena_bytes,
        watched: None,
    };
    let padding_at = stored.rows_at() + ROW_BYTES * rows + arena_bytes;
    if let Some(at) = bytes[padding_at..end].iter().position(|&b| b != 0) {
        return Err(StoredIndexError::Padding {
            at: padding_at + at - start,
        });
    }
    let hasher = foldhash::fast::FixedState::with_seed(seed);
    let tags = check_rows(&stored, &hasher, max_seq)?;
    check_slots(&stored, &tags)?;
    Ok((stored, end))
}

/// The row, slot and arena counts of the section at `start` of `bytes`,
/// checked against each other and against `limit` (where the section must
/// end at the latest).
fn section_counts(
    bytes: &[u8],
    start: usize,
    limit: usize,
) -> Result<(usize, usize, usize), StoredIndexError> {
    let limit = limit.min(bytes.len());
    let head_end = start
        .checked_add(HEAD_BYTES)
        .filter(|&end| end <= limit)
        .ok_or(StoredIndexError::RunsPast { what: "its counts" })?;
    let head = &bytes[start..head_end];
    let (rows64, slots64, arena64) = (u64_at(head, 0), u64_at(head, 8), u64_at(head, 16));
    let room = (limit - head_end) as u64;
    if rows64 > room / ROW_BYTES as u64 || slots64 > room / 8 || arena64 > room {
        return Err(StoredIndexError::RunsPast { what: "its parts" });
    }
    // Casts: each is below the body's length (checked just above).
    let (rows, slots, arena_bytes) = (rows64 as usize, slots64 as usize, arena64 as usize);
    if rows > MAX_ROWS || !valid_slots(rows, slots) || slots != slots_for_stored(rows) {
        return Err(StoredIndexError::SlotCount {
            slots: slots64,
            rows: rows64,
        });
    }
    if section_len(rows, slots, arena_bytes) > limit - start {
        return Err(StoredIndexError::RunsPast { what: "its parts" });
    }
    Ok((rows, slots, arena_bytes))
}

/// Bytes of the section at `start` of `bytes` by its counts (checked as
/// [`decode_section`] checks them), to copy it out before the rest is
/// checked.
pub(crate) fn section_extent(
    bytes: &[u8],
    start: usize,
    limit: usize,
) -> Result<usize, StoredIndexError> {
    let (rows, slots, arena_bytes) = section_counts(bytes, start, limit)?;
    Ok(section_len(rows, slots, arena_bytes))
}

/// A slot count a section may have for `rows` rows: 0 for none, else a
/// power of two of at least [`MIN_SLOTS`], at most 2^32, at a load of at
/// most 0.7.
fn valid_slots(rows: usize, slots: usize) -> bool {
    if rows == 0 {
        return slots == 0;
    }
    slots.is_power_of_two()
        && (MIN_SLOTS..=1 << 32).contains(&slots)
        && rows.saturating_mul(10) <= slots.saturating_mul(MAX_LOAD_TENTHS)
}

/// The rows' checks of [`decode_section`]: each row's fields, and its
/// request id hashed; the tag of each row's request id, by position.
fn check_rows(
    stored: &StoredIndex,
    hasher: &foldhash::fast::FixedState,
    max_seq: u64,
) -> Result<Vec<u32>, StoredIndexError> {
    let arena = stored.arena();
    let text = |at: u64, row: usize, what: &'static str| {
        usize::try_from(at)
            .ok()
            .and_then(|at| checked_read(arena, at))
            .and_then(|(text, _)| std::str::from_utf8(text).ok())
            .ok_or(StoredIndexError::Text { row, what })
    };
    let mut tags = Vec::with_capacity(stored.rows);
    let mut last_seq = 0;
    for position in 0..stored.rows {
        let row = stored.raw(position);
        let code = ((row.meta >> TEXT_REF_BITS) & 0xFF) as u16;
        if row.meta >> META_BITS != 0 || OpKind::from_code(code).is_none() {
            return Err(StoredIndexError::Meta {
                row: position,
                meta: row.meta,
            });
        }
        let key = text(row.key().0, position, "request id")?;
        if row.meta & ENTITY_IS_NAME != 0 {
            let name_ref = u64::try_from(row.entity.0)
                .ok()
                .filter(|&r| r >> TEXT_REF_BITS == 0)
                .ok_or(StoredIndexError::Text {
                    row: position,
                    what: "entity name",
                })?;
            text(name_ref, position, "entity name")?;
        }
        if row.seq <= last_seq || row.seq > max_seq {
            return Err(StoredIndexError::RequestOrder {
                row: position,
                key: key.to_owned(),
                seq: row.seq,
            });
        }
        last_seq = row.seq;
        tags.push(tag_of(hasher.hash_one(key.as_bytes())));
    }
    Ok(tags)
}

/// The table's checks of [`decode_section`], over every slot once, in
/// order (the table is read in place: a probe per row instead, at a random
/// place of a mapping of small pages each, cost three times as much),
/// starting after a free slot so that a run of taken slots wrapping around
/// the table's end is seen whole: each taken slot names a row no other
/// slot names, under that row's tag (`tags`, by position), no further from
/// the tag's home than the run of taken slots before it (so a probe from
/// the home reaches it), with no slot of the same request id between the
/// home and it; and every row is named.
fn check_slots(stored: &StoredIndex, tags: &[u32]) -> Result<(), StoredIndexError> {
    let slots = stored.slots;
    if slots == 0 {
        return Ok(());
    }
    let mask = slots - 1;
    // A load of at most 0.7 leaves a free slot.
    let free = (0..slots)
        .find(|&at| stored.slot(at) == 0)
        .ok_or(StoredIndexError::Slot {
            slot: 0,
            why: "the table has no free slot",
        })?;
    let mut seen = vec![0u64; stored.rows.div_ceil(64)];
    let mut reached = 0;
    // Slots taken in a row just before the one looked at.
    let mut run = 0usize;
    for step in 1..=slots {
        let at = (free + step) & mask;
        // The tag and seen bit of the row a slot some way ahead names,
        // asked for now (each is a cache miss otherwise).
        let ahead = position_of(stored.slot((at + CHECK_AHEAD) & mask));
        if let (Some(tag), Some(word)) = (tags.get(ahead), seen.get(ahead / 64)) {
            super::prefetch_read(tag);
            super::prefetch_read(word);
        }
        let slot = stored.slot(at);
        if slot == 0 {
            run = 0;
            continue;
        }
        let bad = |why| StoredIndexError::Slot { slot: at, why };
        let position = position_of(slot);
        let tag = (slot >> 32) as u32;
        if position >= stored.rows {
            return Err(bad("it names no row"));
        }
        let (word, bit) = (position / 64, 1u64 << (position % 64));
        if seen[word] & bit != 0 {
            return Err(bad("it names a row another slot names"));
        }
        seen[word] |= bit;
        if tags[position] != tag {
            return Err(bad("its tag is not its row's request id's hash"));
        }
        let distance = at.wrapping_sub(home(tag, slots)) & mask;
        if distance > run {
            return Err(bad("a probe from its tag's home does not reach it"));
        }
        // A second row of the same request id would lie between the home
        // and this slot, with the same tag.
        for back in 1..=distance {
            let other = stored.slot(at.wrapping_sub(back) & mask);
            if (other >> 32) as u32 == tag {
                let key = stored.text(stored.raw(position).key());
                if stored.text(stored.raw(position_of(other)).key()) == key {
                    return Err(StoredIndexError::RequestTwice {
                        key: String::from_utf8_lossy(key).into_owned(),
                    });
                }
            }
        }
        run += 1;
        reached += 1;
    }
    if reached != stored.rows {
        return Err(StoredIndexError::Unreached {
            reached,
            rows: stored.rows,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: u64) -> RequestRow {
        RequestRow {
            seq,
            kind: OpKind::MomentCreate,
            entity: Entity::Id(Id(u128::from(seq) << 64 | 7)),
        }
    }

    /// An index of `n` rows with short, long and named ones.
    fn index(seed: u64, n: u64) -> RequestIndex {
        let mut index = RequestIndex::with_seed(seed);
        for seq in 1..=n {
            let key = match seq % 5 {
                0 => format!("{}-{seq}", "long".repeat(20)),
                _ => format!("r{seq}"),
            };
            let row = if seq % 7 == 0 {
                RequestRow {
                    seq,
                    kind: OpKind::JobStart,
                    entity: Entity::Name(format!("job-{seq}")),
                }
            } else {
                row(seq)
            };
            index.insert_first(index.hashed(key), row);
        }
        index
    }

    fn stored_copy(index: &RequestIndex, max_seq: u64) -> Result<RequestIndex, StoredIndexError> {
        let mut bytes = Vec::new();
        encode_section(index, &mut bytes);
        assert_eq!(bytes.len() % 8, 0);
        let backing = Arc::new(Backing::Owned(bytes));
        let len = backing.bytes().len();
        let (stored, end) = decode_section(&backing, 0, len, index.seed(), max_seq)?;
        assert_eq!(end, len);
        Ok(RequestIndex::from_stored(index.seed(), stored))
    }

    #[test]
    fn a_stored_index_answers_as_the_index_it_was_written_from() {
        for n in [0, 1, 11, 12, 5_000] {
            let index = index(42, n);
            let stored = stored_copy(&index, n).expect("checks");
            assert_eq!(stored, index, "{n} rows");
            assert_eq!(stored.len(), index.len());
            let both: Vec<_> = stored.iter().collect();
            let want: Vec<_> = index.iter().collect();
            assert_eq!(both, want);
            for seq in 0..=n + 1 {
                assert_eq!(stored.by_seq(seq), index.by_seq(seq), "seq {seq}");
            }
            assert!(!stored.contains_key("r0"));
            assert!(!stored.contains_key(&format!("r{}", n + 1)));
        }
    }

    #[test]
    fn rows_after_the_stored_ones_go_in_memory_and_the_first_producer_still_wins() {
        let mut stored = stored_copy(&index(9, 100), 100).expect("checks");
        // Known in the stored rows: ignored.
        stored.insert_first(stored.hashed("r3".into()), row(101));
        assert_eq!(stored.get("r3"), Some(row(3)));
        // Hashed with another seed: hashed again, still found.
        let other = RequestIndex::with_seed(10);
        stored.insert_first(other.hashed("r4".into()), row(102));
        assert_eq!(stored.len(), 100);
        stored.insert_first(stored.hashed("new-1".into()), row(103));
        stored.insert_first(other.hashed("new-2".into()), row(104));
        stored.insert_first(stored.hashed("new-1".into()), row(105));
        assert_eq!(stored.len(), 102);
        assert_eq!(stored.get("new-1"), Some(row(103)));
        assert_eq!(stored.by_seq(104), Some(("new-2", row(104))));
        assert_eq!(stored.by_seq(3), Some(("r3", row(3))));
        // Written again (stored and in-memory rows in one section), read
        // back: the same index, and the same bytes as an index built in
        // memory with the same seed and rows.
        let again = stored_copy(&stored, 104).expect("checks");
        assert_eq!(again, stored);
        let mut plain = index(9, 100);
        plain.insert_first(plain.hashed("new-1".into()), row(103));
        plain.insert_first(plain.hashed("new-2".into()), row(104));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_section(&again, &mut a);
        encode_section(&plain, &mut b);
        assert_eq!(a, b, "one state and one seed, one section");
    }

    #[test]
    fn a_section_read_with_another_seed_or_past_its_seq_is_refused() {
        let index = index(5, 300);
        let mut bytes = Vec::new();
        encode_section(&index, &mut bytes);
        let backing = Arc::new(Backing::Owned(bytes));
        let len = backing.bytes().len();
        let error = decode_section(&backing, 0, len, 6, 300)
            .err()
            .expect("refused");
        assert!(
            matches!(error, StoredIndexError::Slot { .. }),
            "another seed: {error}"
        );
        let error = decode_section(&backing, 0, len, 5, 299)
            .err()
            .expect("refused");
        assert!(
            matches!(error, StoredIndexError::RequestOrder { row: 299, .. }),
            "{error}"
        );
        let error = decode_section(&backing, 0, len - 8, 5, 300)
            .err()
            .expect("refused");
        assert!(
            matches!(error, StoredIndexError::RunsPast { .. }),
            "{error}"
        );
    }

    /// A section whose bytes were changed but whose parts still add up is
    /// refused by name, or (a change to a seq, an entity, a text) decodes
    /// to another index that answers for every row it holds; never a panic.
    #[test]
    fn every_changed_byte_is_refused_or_gives_a_whole_index() {
        let index = index(77, 40);
        let mut bytes = Vec::new();
        encode_section(&index, &mut bytes);
        let mut refused = 0;
        for at in 0..bytes.len() {
            for flip in [0x01u8, 0x80] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                let backing = Arc::new(Backing::Owned(bad));
                let len = backing.bytes().len();
                match decode_section(&backing, 0, len, 77, 40) {
                    Err(_) => refused += 1,
                    Ok((stored, _)) => {
                        let other = RequestIndex::from_stored(77, stored);
                        for (key, row) in other.iter() {
                            assert_eq!(other.get(key), Some(row), "flip at {at}");
                        }
                    }
                }
            }
        }
        assert!(
            refused > bytes.len(),
            "{refused} of {} refused",
            2 * bytes.len()
        );
    }

    #[test]
    fn a_request_id_written_twice_is_refused() {
        // Two rows of "r1" in one table, both placed where probes reach.
        let index = index(3, 20);
        let mut bytes = Vec::new();
        encode_section(&index, &mut bytes);
        let backing = Arc::new(Backing::Owned(bytes.clone()));
        let (stored, _) = decode_section(&backing, 0, bytes.len(), 3, 20).expect("checks");
        // Make row 2's request id the same text as row 1's ("r1" and "r2"
        // are the same length): its tag then is not its hash's, unless the
        // slot is retagged too.
        let rows_at = stored.rows_at();
        let key_ref = |row: usize| {
            let meta = u64_at(&bytes, rows_at + ROW_BYTES * row + 24);
            (meta & ((1 << TEXT_REF_BITS) - 1)) as usize
        };
        let arena_at = rows_at + ROW_BYTES * stored.rows;
        let second = arena_at + key_ref(1);
        assert_eq!(&bytes[second + 1..second + 3], b"r2");
        bytes[second + 2] = b'1';
        let tag = tag_of(foldhash::fast::FixedState::with_seed(3).hash_one(b"r1"));
        let slot_of_row_1 = (0..stored.slots)
            .find(|&s| position_of(u64_at(&bytes, stored.slots_at() + 8 * s)) == 1)
            .expect("a slot names row 1");
        // Move it to the first free slot at or after "r1"'s home, retagged.
        let at = |s: usize| stored.slots_at() + 8 * s;
        bytes[at(slot_of_row_1)..at(slot_of_row_1) + 8].copy_from_slice(&0u64.to_le_bytes());
        let mut free = home(tag, stored.slots);
        while u64_at(&bytes, at(free)) != 0 {
            free = (free + 1) & (stored.slots - 1);
        }
        let slot = (u64::from(tag) << 32) | 2;
        bytes[at(free)..at(free) + 8].copy_from_slice(&slot.to_le_bytes());
        let backing = Arc::new(Backing::Owned(bytes.clone()));
        let error = decode_section(&backing, 0, bytes.len(), 3, 20)
            .err()
            .expect("refused");
        assert_eq!(
            error,
            StoredIndexError::RequestTwice { key: "r1".into() },
            "{error}"
        );
    }

    #[test]
    fn detaching_a_mapped_index_keeps_every_answer_and_unmaps_the_file() {
        let mut index = index(11, 3_000);
        let mut bytes = Vec::new();
        encode_section(&index, &mut bytes);
        let path = std::env::temp_dir().join(format!(
            "spark-stored-index-{}-{:?}.bin",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, &bytes).expect("the section is written");
        let file = std::fs::File::open(&path).expect("the section opens");
        // SAFETY: the test's own file, not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("the section maps");
        let backing = Arc::new(Backing::Mapped(map));
        let (stored, _) = decode_section(&backing, 0, bytes.len(), 11, 3_000).expect("checks");
        let mut mapped = RequestIndex::from_stored(11, stored);
        // Rows after the checkpoint, in memory beside the mapped ones.
        for seq in 3_001..3_010 {
            index.insert_first(index.hashed(format!("after-{seq}")), row(seq));
            mapped.insert_first(mapped.hashed(format!("after-{seq}")), row(seq));
        }
        let before = mapped.clone();
        let rows = mapped.mapped_rows().expect("mapped rows");
        let stale = mapped.mapped_rows().expect("mapped rows").copy();
        assert!(mapped.detach(rows.copy()));
        assert!(mapped.mapped_rows().is_none(), "no file mapped any more");
        // A copy of rows the index no longer uses changes nothing.
        assert!(!mapped.detach(stale));
        drop((backing, file));
        std::fs::remove_file(&path).expect("the file is removed");
        assert_eq!(mapped, before);
        assert_eq!(mapped, index);
        for seq in 0..3_011 {
            assert_eq!(mapped.by_seq(seq), index.by_seq(seq), "seq {seq}");
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_section(&mapped, &mut a);
        encode_section(&index, &mut b);
        assert_eq!(a, b);
        // An index built in memory has nothing to detach.
        assert!(index.mapped_rows().is_none());
    }

    proptest::proptest! {
        /// An index whose first rows are stored (checked and used in
        /// place) and the rest in memory answers every question exactly as
        /// the index built in memory from the same ops, and writes the same
        /// section again.
        #[test]
        fn a_stored_index_answers_as_the_rebuilt_one(
            ops in proptest::collection::vec((0u16..400, 0u8..4), 0..300),
            split in 0usize..300,
            seed in proptest::prelude::any::<u64>(),
        ) {
            // Request ids repeat (a small alphabet), some are long, some
            // rows name an entity.
            let key = |k: u16| match k % 4 {
                0 => format!("{}{k}", "long-request-id-".repeat(4)),
                1 => format!("é{k}"),
                _ => format!("r{k}"),
            };
            let entry = |seq: u64, flavour: u8| match flavour {
                0 => RequestRow {
                    seq,
                    kind: OpKind::JobStart,
                    entity: Entity::Name(format!("job-{seq}")),
                },
                1 => RequestRow {
                    seq,
                    kind: OpKind::MomentEdit,
                    entity: Entity::Id(Id(u128::from(seq) * 3)),
                },
                _ => row(seq),
            };
            let split = split.min(ops.len());
            let mut plain = RequestIndex::with_seed(seed);
            let mut first = RequestIndex::with_seed(seed);
            for (at, &(k, flavour)) in ops.iter().enumerate() {
                let seq = at as u64 + 1;
                plain.insert_first(plain.hashed(key(k)), entry(seq, flavour));
                if at < split {
                    first.insert_first(first.hashed(key(k)), entry(seq, flavour));
                }
            }
            let mut stored = stored_copy(&first, split as u64).expect("checks");
            let other = RequestIndex::with_seed(seed ^ 1);
            for (at, &(k, flavour)) in ops.iter().enumerate().skip(split) {
                let seq = at as u64 + 1;
                // Hashed by another index half of the time: hashed again.
                let hashed = if at % 2 == 0 { stored.hashed(key(k)) } else { other.hashed(key(k)) };
                stored.insert_first(hashed, entry(seq, flavour));
            }
            proptest::prop_assert_eq!(stored.len(), plain.len());
            for k in 0..400 {
                proptest::prop_assert_eq!(stored.get(&key(k)), plain.get(&key(k)));
                proptest::prop_assert_eq!(stored.contains_key(&key(k)), plain.contains_key(&key(k)));
            }
            for seq in 0..=ops.len() as u64 + 1 {
                proptest::prop_assert_eq!(stored.by_seq(seq), plain.by_seq(seq));
            }
            let a: Vec<_> = stored.iter().collect();
            let b: Vec<_> = plain.iter().collect();
            proptest::prop_assert_eq!(a, b);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encode_section(&stored, &mut a);
            encode_section(&plain, &mut b);
            proptest::prop_assert_eq!(a, b);
        }
    }
}
