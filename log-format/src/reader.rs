//! [`LogReader`]: a read-only, mapped view of a log directory for tools
//! (verify, dump, rebuild, audit), safe beside a running server: no lock, no
//! writes. It applies the same rules as recovery through the same decoder,
//! except that a torn or in-progress tail is reported instead of cut off.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use crate::compaction_journal::{self, JOURNAL_NAME};
use crate::compaction_record::{self, COMPACTION_KIND_VERSION, KIND_COMPACTION};
use crate::error::LogError;
use crate::format::{RecordRef, SegmentHeader, Seq, DEFAULT_MAX_RECORD_BYTES, HEADER_LEN};
use crate::fs::{Fs, OsFs};
use crate::recovery::TornTail;
use crate::segment::{
    decode_segment, map_segment, segment_files, DecodeOptions, Decoded, Expect, Role, SegmentEnd,
};
use crate::state::Head;

/// What the reader knows about one segment after opening.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// File name, e.g. `00000000000000000001.seg`.
    pub name: String,
    /// Seq of its first record (from the header).
    pub first_seq: Seq,
    /// Seq of its last whole record; `first_seq - 1` when it holds none.
    pub last_seq: Seq,
    /// Valid bytes: header, whole records and seal (a torn tail excluded).
    pub bytes: u64,
    /// Whether it ends with a seal.
    pub sealed: bool,
    /// Unix ms from its header.
    pub created_ms: u64,
}

/// Knobs of [`LogReader::scan`].
#[derive(Clone, Copy, Debug)]
pub struct ScanOptions {
    /// Hash every sealed segment and check its seal (one BLAKE3 pass per
    /// segment). The last segment is always hashed (it gives the head), and
    /// the link between a seal and the next header is always checked.
    /// Default true.
    pub verify_chain: bool,
    /// Largest `len` accepted. Default 4 MiB.
    pub max_record_bytes: u32,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            verify_chain: true,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

/// What a scan read.
#[derive(Clone, Debug)]
pub struct ScanReport {
    /// Segments read.
    pub segments: usize,
    /// Whole records read (seals excluded).
    pub records: u64,
    /// Valid bytes read.
    pub bytes: u64,
    /// Where the log ends: the same value [`Log::head`](crate::Log::head)
    /// gives after recovery. If the visitor stopped early, where it stopped.
    pub head: Head,
    /// A torn or in-progress tail of the last segment (or an interrupted
    /// roll's file, at offset 0), left in place.
    pub torn_tail: Option<TornTail>,
}

/// How many openings in a row [`LogReader::open_live_from`] needs to find
/// the same damage before it reports it: a listing that raced with two
/// segment rolls misses a segment, and a view that raced a whole
/// compaction commit (FORMAT.md "Compaction") sees old and new segments
/// side by side; the next opening does not see the same thing, while real
/// damage shows identically every time.
pub const LIVE_OPEN_ATTEMPTS: u32 = 2;

/// The most openings of a live log that keeps showing damage, each time
/// elsewhere, before the last damage seen is reported.
const LIVE_OPEN_ATTEMPTS_MAX: u32 = 50;

/// The pause (ms) before a live log that showed damage is opened again.
const LIVE_OPEN_PAUSE_MS: u64 = 5;

/// How long (ms) [`LogReader::open_live_from`] waits for a compaction
/// commit in progress before it reports what it reads: while the journal
/// `log/COMPACTION` exists, the engine is replacing sealed segments and then
/// patching the active segment's header (FORMAT.md "Compaction"), and a view
/// taken meanwhile shows a chain that breaks where the old and the new
/// segments meet. A journal still there after this long is a commit no
/// engine is finishing: [`LogError::CompactionPending`].
pub const LIVE_COMPACTION_WAIT_MS: u64 = 60_000;

/// The pause (ms) between two live opens while a compaction commits.
const LIVE_COMPACTION_POLL_MS: u64 = 20;

/// One mapped segment.
struct Mapped {
    info: SegmentInfo,
    bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    /// A live view's last segment: its header as open read it. A
    /// compaction commit patches the active segment's header in place
    /// (FORMAT.md "Compaction"), which the map shows at once; a scan reads
    /// the segment with this header instead, so that the view stays the log
    /// as it was at open.
    header_at_open: Option<[u8; HEADER_LEN]>,
}

impl Mapped {
    /// The segment's bytes up to `len` as they were at open (see
    /// `header_at_open`): borrowed from the map, or, when the header was
    /// patched since, a copy with the header open read.
    fn bytes_as_opened(&self, len: usize) -> std::borrow::Cow<'_, [u8]> {
        let current: &[u8] = (*self.bytes).as_ref();
        let current = &current[..len.min(current.len())];
        match &self.header_at_open {
            Some(header) if current.len() >= HEADER_LEN && current[..HEADER_LEN] != header[..] => {
                let mut copy = current.to_vec();
                copy[..HEADER_LEN].copy_from_slice(header);
                std::borrow::Cow::Owned(copy)
            }
            _ => std::borrow::Cow::Borrowed(current),
        }
    }
}

/// A read-only view of a data directory's log: maps each segment at open and
/// reads up to the last whole record. A torn or in-progress tail in the last
/// segment is reported, not an error; damage anywhere else is an error.
///
/// The view is a snapshot of each file's length at open: records appended
/// later are not seen (open again). Limit: if a server restarts and its
/// recovery truncates a torn tail while this view is mapped, reading those
/// bytes faults (SIGBUS); keep readers short-lived beside a restarting server.
pub struct LogReader {
    /// Segments with a valid header, in seq order.
    segments: Vec<Mapped>,
    /// Infos of `segments`, in the same order (what `segments()` returns).
    infos: Vec<SegmentInfo>,
    /// The tail found at open.
    torn_tail: Option<TornTail>,
    /// Opened with [`LogReader::open_live`]: the last segment is read only
    /// as far as it continues.
    live: bool,
    /// What the first mapped segment must continue: the log's start, or,
    /// opened from a seq ([`LogReader::open_live_from`]), that segment's
    /// own header.
    start: Expect,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("segments", &self.infos)
            .field("torn_tail", &self.torn_tail)
            .finish()
    }
}

/// How a segment is read: every one but the last must be sealed; the last
/// is judged as recovery would, or, in a live log, only as far as it
/// continues.
fn last_role(is_last: bool, live: bool) -> Role {
    match (is_last, live) {
        (false, _) => Role::Sealed,
        (true, false) => Role::Last,
        (true, true) => Role::Live,
    }
}

impl LogReader {
    /// Opens the log in `dir` with [`OsFs`] and the default record limit.
    pub fn open(dir: &Path) -> Result<LogReader, LogError> {
        LogReader::open_with(dir, Arc::new(OsFs))
    }

    /// Opens the log in `dir` through `fs` with the default record limit.
    pub fn open_with(dir: &Path, fs: Arc<dyn Fs>) -> Result<LogReader, LogError> {
        LogReader::open_with_limit(dir, fs, DEFAULT_MAX_RECORD_BYTES)
    }

    /// Opens the log in `dir` through `fs`: maps every segment and checks
    /// headers, CRCs, seq continuity and the links between segments (not the
    /// chain: that is [`scan`](Self::scan)'s job). A missing directory is an
    /// `Io` error (`NotFound`), not an empty log.
    ///
    /// Errors: `Corrupt` and `UnsupportedVersion` exactly as
    /// [`Log::open`](crate::Log::open) would report them.
    pub fn open_with_limit(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
    ) -> Result<LogReader, LogError> {
        LogReader::open_visiting(dir, fs, max_record_bytes, false, |_| {})
    }

    /// Opens the log in `dir`, which a writer may be appending to right now
    /// (a server's own catch-up of its event stream, the tools on a running
    /// server's data directory): as [`open_with_limit`](Self::open_with_limit),
    /// but the last segment ends where the log stops continuing after its
    /// last valid commit mark, and nothing past that is judged: a batch may
    /// be half copied in there (with pre-allocated segments the map covers
    /// those bytes), which is neither a torn tail nor damage; a newest file
    /// without a whole header is a roll in progress and left out of the
    /// view. No torn tail is reported; recovery, which runs alone, judges
    /// the tail.
    pub fn open_live(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
    ) -> Result<LogReader, LogError> {
        LogReader::open_live_from(dir, fs, max_record_bytes, 0)
    }

    /// [`open_live`](Self::open_live), but only from the segment that holds
    /// `from_seq` (the one with the largest first seq not above it; all of
    /// them for 0 or 1): the segments before it are neither mapped nor
    /// checked, and that segment's header gives the seq and chain value
    /// the view starts from. For readers that need only the records from
    /// `from_seq` on (the event stream's catch-up after `Last-Event-ID`,
    /// the checkpoint writer after the newest checkpoint): they cost what
    /// they read, not the whole log, and damage in the segments before is
    /// left to whoever reads those (startup, the scrub, `spark-replay
    /// verify`).
    ///
    /// A listing of the directory can miss a segment created while it is
    /// read, when the writer rolls twice meanwhile; that shows as a seq gap
    /// between two segments, and a compaction commit that replaces
    /// segments while they are mapped shows as a broken chain: so damage
    /// is reported only once [`LIVE_OPEN_ATTEMPTS`] openings in a row found
    /// the same (at most 50 openings, a few ms apart).
    /// While a compaction's journal exists (a commit replacing segments,
    /// then patching the active header, then appending its record) no view
    /// is handed out: damage seen then is no damage, and a clean view may
    /// lack the commit's record; the view is opened again every few ms
    /// until the journal is gone, for up to [`LIVE_COMPACTION_WAIT_MS`]
    /// (then a clean view is handed out as read).
    ///
    /// Errors: as [`open_live`](Self::open_live), for the segments read;
    /// [`LogError::CompactionPending`] when damage shows and a journal is
    /// still there after [`LIVE_COMPACTION_WAIT_MS`].
    pub fn open_live_from(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
        from_seq: Seq,
    ) -> Result<LogReader, LogError> {
        LogReader::open_live_visiting(dir, fs, max_record_bytes, from_seq, |_| {})
    }

    /// [`open_live_from`](Self::open_live_from), calling `visit` with every
    /// whole record the checks read (as
    /// [`open_visiting`](Self::open_visiting)); an attempt that is opened
    /// again visits its records again from the start.
    pub(crate) fn open_live_visiting(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
        from_seq: Seq,
        mut visit: impl FnMut(RecordRef<'_>),
    ) -> Result<LogReader, LogError> {
        let mut attempt = 1;
        let mut waited_ms = 0;
        // The damage the last opening found, and how many openings in a
        // row found it.
        let mut last_damage: Option<(String, u32)> = None;
        loop {
            // A journal seen before the open or after it means a commit may
            // have swapped files under this view: the view is taken again
            // once no journal is left (FORMAT.md "Reading a live log").
            let journal_before = compaction_journal::journal_exists(fs.as_ref(), dir)?;
            match LogReader::open_from(
                dir,
                fs.clone(),
                max_record_bytes,
                true,
                from_seq,
                &mut visit,
            ) {
                Err(error @ LogError::Corrupt { .. }) => {
                    let journal_after = compaction_journal::journal_exists(fs.as_ref(), dir)?;
                    if journal_before || journal_after {
                        if journal_after && waited_ms >= LIVE_COMPACTION_WAIT_MS {
                            return Err(LogError::CompactionPending {
                                journal: dir.join(JOURNAL_NAME),
                            });
                        }
                        last_damage = None;
                        std::thread::sleep(std::time::Duration::from_millis(
                            LIVE_COMPACTION_POLL_MS,
                        ));
                        waited_ms += LIVE_COMPACTION_POLL_MS;
                        continue;
                    }
                    // Damage stays where it is; a view that raced a roll or
                    // a whole commit shows it once, or elsewhere next time.
                    let damage = error.to_string();
                    let same = match &last_damage {
                        Some((seen, times)) if *seen == damage => times + 1,
                        _ => 1,
                    };
                    if same >= LIVE_OPEN_ATTEMPTS || attempt >= LIVE_OPEN_ATTEMPTS_MAX {
                        return Err(error);
                    }
                    last_damage = Some((damage, same));
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(LIVE_OPEN_PAUSE_MS));
                }
                Ok(reader) => {
                    // A clean opening with a journal beside it may be the
                    // log before the commit's first swap, or after its
                    // header patch but before its record: take it again
                    // once the commit is done (and, after the wait, a
                    // consistent view of a commit nobody finishes).
                    let journal_after = compaction_journal::journal_exists(fs.as_ref(), dir)?;
                    if (journal_before || journal_after) && waited_ms < LIVE_COMPACTION_WAIT_MS {
                        std::thread::sleep(std::time::Duration::from_millis(
                            LIVE_COMPACTION_POLL_MS,
                        ));
                        waited_ms += LIVE_COMPACTION_POLL_MS;
                        continue;
                    }
                    return Ok(reader);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// [`open_with_limit`](Self::open_with_limit) (or, with `live`,
    /// [`open_live`](Self::open_live), its listing opened again after a
    /// gap), calling `visit` with every whole record the checks read, in seq
    /// order (seals excluded): on an error, the last one visited is the last
    /// record read before the damage.
    pub(crate) fn open_visiting(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
        live: bool,
        visit: impl FnMut(RecordRef<'_>),
    ) -> Result<LogReader, LogError> {
        if live {
            LogReader::open_live_visiting(dir, fs, max_record_bytes, 0, visit)
        } else {
            if compaction_journal::journal_exists(fs.as_ref(), dir)? {
                return Err(LogError::CompactionPending {
                    journal: dir.join(JOURNAL_NAME),
                });
            }
            LogReader::open_from(dir, fs, max_record_bytes, false, 0, visit)
        }
    }

    /// A view (not live, no journal check) from the segment holding
    /// `from_seq`, calling `visit` with every whole record read: for
    /// [`Log::open`](crate::Log::open) after recovery, which looks for the
    /// compaction record of a journal it is finishing.
    pub(crate) fn open_from_seq(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
        from_seq: Seq,
        visit: impl FnMut(RecordRef<'_>),
    ) -> Result<LogReader, LogError> {
        LogReader::open_from(dir, fs, max_record_bytes, false, from_seq, visit)
    }

    /// Each segment's info and mapped bytes (the whole file), in seq order.
    pub(crate) fn mapped(&self) -> impl Iterator<Item = (&SegmentInfo, &[u8])> {
        self.segments
            .iter()
            .map(|segment| (&segment.info, (*segment.bytes).as_ref()))
    }

    /// [`open_visiting`](Self::open_visiting) from the segment holding
    /// `from_seq` (see [`open_live_from`](Self::open_live_from)).
    fn open_from(
        dir: &Path,
        fs: Arc<dyn Fs>,
        max_record_bytes: u32,
        live: bool,
        from_seq: Seq,
        mut visit: impl FnMut(RecordRef<'_>),
    ) -> Result<LogReader, LogError> {
        let listing = fs.list(dir).map_err(|e| LogError::io("list", dir, e))?;
        let mut files = segment_files(listing)?;
        // The segment holding `from_seq` is the last one starting at or
        // before it; the ones before it are not read.
        let first = files
            .iter()
            .rposition(|f| f.first_seq <= from_seq)
            .unwrap_or(0);
        files.drain(..first);
        let mut segments = Vec::with_capacity(files.len());
        let mut torn_tail = None;
        let mut expect = Expect::FIRST;
        let mut start = None;
        for (index, file) in files.iter().enumerate() {
            let is_last = index + 1 == files.len();
            let (map, file_len) = map_segment(fs.as_ref(), file)?;
            let bytes: &[u8] = (*map).as_ref();
            if index == 0 && first > 0 {
                // Mid-log: the header says where this segment continues
                // from (a header that does not decode is reported by the
                // decode below, against the file name's seq).
                expect = Expect {
                    first_seq: file.first_seq,
                    chain_start: SegmentHeader::decode(bytes)
                        .map_or([0; 32], |header| header.chain_start),
                };
            }
            start.get_or_insert(expect);
            let opts = DecodeOptions {
                role: last_role(is_last, live),
                max_record_bytes,
                verify_seal: false,
                chain_at: None,
            };
            let segment = match decode_segment(&file.name, bytes, expect, opts, |record| {
                visit(record);
                ControlFlow::Continue(())
            })? {
                // Beside a running writer, a newest file without a whole
                // header is a roll in progress (the writer creates the
                // file, then writes and syncs its header): the view ends
                // at the segment before, whose seal is already durable.
                Decoded::InterruptedRoll { .. } if live && is_last => continue,
                Decoded::InterruptedRoll { .. } => {
                    torn_tail = Some(TornTail {
                        segment: file.name.clone(),
                        offset: 0,
                        bytes_dropped: file_len,
                        damage: "interrupted roll (no valid header)".to_owned(),
                        whole_frame: false,
                        quarantine: None,
                        unacknowledged: false,
                        seqs: None,
                        damage_offset: 0,
                    });
                    continue;
                }
                Decoded::Segment(segment) => segment,
            };
            if let Some(torn) = &segment.torn {
                torn_tail = Some(TornTail::new(&file.name, torn, file_len, None));
            }
            if let SegmentEnd::Sealed { chain } = segment.tail {
                expect = Expect {
                    first_seq: segment.last_seq + 1,
                    chain_start: chain,
                };
            }
            let header_at_open = (live && is_last && bytes.len() >= HEADER_LEN).then(|| {
                let mut header = [0; HEADER_LEN];
                header.copy_from_slice(&bytes[..HEADER_LEN]);
                header
            });
            segments.push(Mapped {
                header_at_open,
                info: SegmentInfo {
                    name: file.name.clone(),
                    first_seq: segment.header.first_seq,
                    last_seq: segment.last_seq,
                    bytes: segment.end,
                    sealed: matches!(segment.tail, SegmentEnd::Sealed { .. }),
                    created_ms: segment.header.created_ms,
                },
                bytes: map,
            });
        }
        let infos = segments.iter().map(|s| s.info.clone()).collect();
        Ok(LogReader {
            segments,
            infos,
            torn_tail,
            live,
            start: start.unwrap_or(Expect::FIRST),
        })
    }

    /// The segments found at open, in seq order (an interrupted roll's file
    /// excluded).
    pub fn segments(&self) -> &[SegmentInfo] {
        &self.infos
    }

    /// The torn or in-progress tail found at open, if any.
    pub fn torn_tail(&self) -> Option<&TornTail> {
        self.torn_tail.as_ref()
    }

    /// Visits every whole record in seq order (seals excluded), verifying
    /// CRC, seq continuity, headers and (with `verify_chain`) the chain.
    /// `visit` returns `ControlFlow::Break` to stop early; the report then
    /// describes the log up to and including the last visited record.
    ///
    /// Errors: `Corrupt` / `UnsupportedVersion` as [`Log::open`](crate::Log::open)
    /// reports them (the visitor may have seen records before the damage).
    pub fn scan(
        &self,
        options: ScanOptions,
        mut visit: impl FnMut(&SegmentInfo, RecordRef<'_>) -> ControlFlow<()>,
    ) -> Result<ScanReport, LogError> {
        let mut report = ScanReport {
            segments: 0,
            records: 0,
            bytes: 0,
            head: Head::empty(),
            torn_tail: self.torn_tail.clone(),
        };
        let mut expect = self.start;
        for (index, segment) in self.segments.iter().enumerate() {
            let is_last = index + 1 == self.segments.len();
            let opts = DecodeOptions {
                role: last_role(is_last, self.live),
                max_record_bytes: options.max_record_bytes,
                verify_seal: options.verify_chain,
                chain_at: None,
            };
            let info = &segment.info;
            // The last segment: what open found valid, and no more: a
            // writer may have appended since (into pre-allocated bytes the
            // map already covers), and a scan reports the log as it was at
            // open. Cast: `info.bytes` is at most the map's length.
            let len = if is_last {
                info.bytes as usize
            } else {
                usize::MAX
            };
            let as_opened = segment.bytes_as_opened(len);
            let bytes: &[u8] = &as_opened;
            let mut bad_compaction = None;
            let decoded = decode_segment(&info.name, bytes, expect, opts, |record| {
                if record.kind == KIND_COMPACTION && record.kind_version == COMPACTION_KIND_VERSION
                {
                    if let Err(e) = compaction_record::decode_in(&info.name, &record) {
                        bad_compaction = Some(e);
                        return ControlFlow::Break(());
                    }
                }
                visit(info, record)
            })?;
            if let Some(e) = bad_compaction {
                return Err(e);
            }
            let Decoded::Segment(decoded) = decoded else {
                // Open kept only segments with a valid header; the bytes are
                // the same map.
                break;
            };
            report.segments += 1;
            report.records += decoded.records;
            report.bytes += decoded.end;
            report.head = Head {
                seq: decoded.last_seq,
                segment: info.name.clone(),
                chain: decoded.tail.head_chain(),
            };
            if decoded.stopped {
                break;
            }
            if let SegmentEnd::Sealed { chain } = decoded.tail {
                expect = Expect {
                    first_seq: decoded.last_seq + 1,
                    chain_start: chain,
                };
            }
        }
        Ok(report)
    }
}
