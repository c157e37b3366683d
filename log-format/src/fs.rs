//! The file seam: every file access of the crate goes through [`Fs`] and
//! [`LogFile`], so tests can inject faults ([`FaultyFs`]) and an in-memory
//! power-loss file system ([`MemFs`](crate::MemFs)) can stand in for the
//! disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// A file system as the log and the media store need it. Paths are
/// absolute or relative to the process's working directory.
pub trait Fs: Send + Sync + 'static {
    /// Creates `path` and its missing parents (like `mkdir -p`).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// The paths of the regular files directly in `dir`, in no order.
    /// `NotFound` when `dir` does not exist.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Opens an existing file for reading and writing.
    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Creates a new, empty file for reading and writing; `AlreadyExists` if
    /// it exists.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames the file `from` to `to`, replacing a file at `to` (POSIX
    /// `rename`: atomic, the target never half there). The new entry is
    /// durable once `to`'s directory is synced ([`Fs::sync_dir`]); until
    /// then a power cut may keep either name.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// When the file's contents last changed (its mtime); what the media
    /// store's orphan grace period is measured from.
    fn modified(&self, path: &Path) -> io::Result<SystemTime>;
    /// Makes `dir`'s entries durable (fsync on the directory), so a created or
    /// removed file survives power loss.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The whole file, read-only. [`OsFs`] maps it with memmap2; an empty
    /// file gives an empty slice without a map. The bytes reflect the file at
    /// the time of the call; the caller must not truncate the file while the
    /// view lives.
    fn map(&self, path: &Path) -> io::Result<Box<dyn AsRef<[u8]> + Send + Sync>>;

    /// Like [`Fs::create_new`], with the file's unix permission bits set to
    /// `mode` (e.g. `0o600`; exactly, whatever the umask). The default
    /// ignores `mode`: for file systems without permissions ([`MemFs`](crate::MemFs))
    /// and platforms without unix modes.
    fn create_new_mode(&self, path: &Path, mode: u32) -> io::Result<Box<dyn LogFile>> {
        let _ = mode;
        self.create_new(path)
    }

    /// Writes `bytes` as the whole file `path`, a new one or in place of the
    /// old one, durably: see [`Fs::write_file_durably_mode`] (with the new
    /// file's permissions left to the file system's default).
    fn write_file_durably(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.write_file_durably_mode(path, bytes, None)
    }

    /// Writes `bytes` as the whole file `path` durably, the one sequence
    /// every durable whole-file write of the workspace goes through: a
    /// temporary file `<name>.tmp` in the same directory (a stale one from
    /// an earlier crash is removed first), created with permission bits
    /// `mode` when given ([`Fs::create_new_mode`]), write, fsync of the
    /// file, rename over `path`, fsync of the directory. When it returns
    /// `Ok`, `path` holds `bytes` across a power cut; at any cut before, it
    /// holds either its old contents or `bytes`, whole, never a mix (a
    /// power cut between the rename and the directory fsync may keep
    /// either). The directory must exist.
    ///
    /// Errors: the step's I/O error, of the same kind, its message naming
    /// the step and the file (`path`, or the temporary file); after a
    /// failure before the rename, `path` is unchanged and the temporary file
    /// is removed (best effort).
    fn write_file_durably_mode(
        &self,
        path: &Path,
        bytes: &[u8],
        mode: Option<u32>,
    ) -> io::Result<()> {
        write_durably(self, path, bytes, mode, None)
    }

    /// Like [`Fs::write_file_durably`], with the temporary file's bytes
    /// written at `pace` ([`write_paced`]) when given: the same steps and
    /// the same guarantees, spread over time so that a background writer
    /// (the compactor) never queues a large writeback ahead of the log's
    /// own syncs.
    fn write_file_durably_paced(
        &self,
        path: &Path,
        bytes: &[u8],
        pace: Option<WritePace>,
    ) -> io::Result<()> {
        write_durably(self, path, bytes, None, pace)
    }
}

/// A pace for a background writer's bytes ([`write_paced`]): at most
/// `bytes_per_s` bytes per second, in steps of `step_bytes`, each written
/// back to the device before the next one is written.
///
/// Why (SPEC section 13, "low priority"; docs/performance/erasure.md): a
/// log's `fdatasync` waits for whatever writeback the device has queued
/// ahead of it. Tens of MB written and then fsynced at once (a compaction
/// staging its segments) put a create's sync behind all of them; small
/// steps, each written back before the next, at a bounded rate, leave the
/// device idle most of the time and queue at most one step ahead of a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePace {
    /// Most bytes written per second, averaged from the start of a
    /// [`write_paced`] call; above 0.
    pub bytes_per_s: u64,
    /// Bytes written (and written back) per step; above 0.
    pub step_bytes: usize,
}

impl WritePace {
    /// The step the engine uses: 64 KiB. Measured on this project's
    /// machine (docs/performance/erasure.md): 64 KiB steps at 4 to 16 MB/s
    /// left the p99 of a concurrent `fdatasync` loop where it was without
    /// them; 1 MiB steps at full speed doubled it, the same bytes written
    /// unpaced and then fsynced made it five times worse.
    pub const DEFAULT_STEP_BYTES: usize = 64 * 1024;

    /// The pace of `bytes_per_s` in [`WritePace::DEFAULT_STEP_BYTES`]
    /// steps, or `None` (unpaced) for 0.
    pub fn per_second(bytes_per_s: u64) -> Option<WritePace> {
        (bytes_per_s > 0).then_some(WritePace {
            bytes_per_s,
            step_bytes: WritePace::DEFAULT_STEP_BYTES,
        })
    }
}

/// Writes `bytes` at `offset` of `file`, all at once when `pace` is `None`,
/// else in `pace.step_bytes` steps, each written back
/// ([`LogFile::write_back`]) before the next, sleeping as needed to keep
/// to `pace.bytes_per_s`. Durability is the caller's: it still fsyncs.
///
/// Errors: the first failed write or write-back (what was written before
/// it stays written).
pub fn write_paced(
    file: &mut dyn LogFile,
    offset: u64,
    bytes: &[u8],
    pace: Option<WritePace>,
) -> io::Result<()> {
    let Some(pace) = pace else {
        return file.write_all_at(offset, bytes);
    };
    let started = std::time::Instant::now();
    let mut done: u64 = 0;
    for step in bytes.chunks(pace.step_bytes.max(1)) {
        let at = offset + done;
        file.write_all_at(at, step)?;
        // usize is at most 64 bits on every target Rust supports.
        file.write_back(at, step.len() as u64)?;
        done += step.len() as u64;
        let due = Duration::from_secs_f64(done as f64 / pace.bytes_per_s.max(1) as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// The body of [`Fs::write_file_durably_mode`], for every [`Fs`].
fn write_durably<F: Fs + ?Sized>(
    fs: &F,
    path: &Path,
    bytes: &[u8],
    mode: Option<u32>,
    pace: Option<WritePace>,
) -> io::Result<()> {
    let named = |step: &str, file: &Path, e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot write {} durably: {step} {}: {e}",
                path.display(),
                file.display()
            ),
        )
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut name = path
        .file_name()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot write {} durably: not a file name", path.display()),
            )
        })?
        .to_owned();
    name.push(".tmp");
    let temp = dir.join(name);
    match fs.remove_file(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(named("remove stale", &temp, e))
        }
        _ => {}
    }
    let created = match mode {
        Some(mode) => fs.create_new_mode(&temp, mode),
        None => fs.create_new(&temp),
    };
    let mut file = created.map_err(|e| named("create", &temp, e))?;
    let written = write_paced(file.as_mut(), 0, bytes, pace)
        .map_err(|e| named("write", &temp, e))
        .and_then(|()| file.sync_all().map_err(|e| named("fsync", &temp, e)));
    drop(file);
    if let Err(e) = written.and_then(|()| {
        fs.rename(&temp, path)
            .map_err(|e| named("rename to", path, e))
    }) {
        let _ = fs.remove_file(&temp);
        return Err(e);
    }
    fs.sync_dir(dir)
        .map_err(|e| named("fsync directory", dir, e))
}

/// An open file of the log, written at explicit offsets.
#[allow(clippy::len_without_is_empty)] // an "is empty" file is not a question the log asks
pub trait LogFile: Send {
    /// The file's length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Writes all of `buf` at `offset` (extending the file as needed).
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// `fdatasync`: makes the written data (and the size) durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// `fsync`: makes data and all metadata durable.
    fn sync_all(&mut self) -> io::Result<()>;
    /// Truncates or extends the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Starts the writeback of the dirty pages in `offset..offset + len`
    /// and waits for it (Linux `sync_file_range` with `WAIT_BEFORE |
    /// WRITE | WAIT_AFTER`): pacing only ([`write_paced`]), no durability
    /// (neither metadata nor the device's cache; the caller still syncs).
    /// The default, for file systems without a device (and platforms
    /// without the call), does nothing.
    fn write_back(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// The real file system: `std::fs` and memmap2.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

/// A [`LogFile`] on a real file.
struct OsFile(File);

impl Fs for OsFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                out.push(entry.path());
            }
        }
        Ok(out)
    }

    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(OsFile(file)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(OsFile(file)))
    }

    #[cfg(unix)]
    fn create_new_mode(&self, path: &Path, mode: u32) -> io::Result<Box<dyn LogFile>> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        // Exactly `mode`: the umask may have taken bits off at creation.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        Ok(Box::new(OsFile(file)))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        std::fs::metadata(path)?.modified()
    }

    #[cfg(unix)]
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    #[cfg(not(unix))]
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        // Directories cannot be opened for fsync here; NTFS journals entries.
        Ok(())
    }

    fn map(&self, path: &Path) -> io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(Box::new(Vec::<u8>::new()));
        }
        // SAFETY: the map is read-only and the slice is only read. Its length
        // is fixed at the file's size now. The log never rewrites bytes in
        // place: it appends, and truncates only during recovery, after
        // dropping its own view of that file. The one remaining hazard is a
        // reader (`LogReader`) beside a server that restarts and cuts a torn
        // tail under the reader's map; touching those pages would fault
        // (SIGBUS). That is the documented limit of reading beside a server.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Box::new(map))
    }
}

impl LogFile for OsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    #[cfg(unix)]
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }

    #[cfg(not(unix))]
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        use std::io::{Seek, SeekFrom, Write};
        self.0.seek(SeekFrom::Start(offset))?;
        self.0.write_all(buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    #[cfg(target_os = "linux")]
    fn write_back(&mut self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Ok(());
        };
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: the descriptor is this open file's; sync_file_range reads
        // no memory of ours.
        let rc = unsafe { libc::sync_file_range(self.0.as_raw_fd(), offset, len, flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

// ---- Fault injection ------------------------------------------------------

/// An operation [`FaultyFs`] counts and can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// [`LogFile::write_all_at`].
    Write,
    /// [`LogFile::sync_data`].
    SyncData,
    /// [`LogFile::sync_all`].
    SyncAll,
    /// [`LogFile::set_len`].
    SetLen,
    /// [`Fs::create_new`].
    CreateNew,
    /// [`Fs::sync_dir`].
    SyncDir,
    /// [`Fs::remove_file`].
    Remove,
    /// [`Fs::rename`].
    Rename,
}

impl FaultOp {
    /// Every operation, in counter order.
    pub const ALL: [FaultOp; 8] = [
        FaultOp::Write,
        FaultOp::SyncData,
        FaultOp::SyncAll,
        FaultOp::SetLen,
        FaultOp::CreateNew,
        FaultOp::SyncDir,
        FaultOp::Remove,
        FaultOp::Rename,
    ];

    /// The operations of [`Fs::write_file_durably`], in its order (the
    /// removal of a stale temporary file aside): each a place a fault can
    /// strike a durable whole-file write.
    pub const DURABLE_WRITE: [FaultOp; 5] = [
        FaultOp::CreateNew,
        FaultOp::Write,
        FaultOp::SyncAll,
        FaultOp::Rename,
        FaultOp::SyncDir,
    ];

    fn index(self) -> usize {
        match self {
            FaultOp::Write => 0,
            FaultOp::SyncData => 1,
            FaultOp::SyncAll => 2,
            FaultOp::SetLen => 3,
            FaultOp::CreateNew => 4,
            FaultOp::SyncDir => 5,
            FaultOp::Remove => 6,
            FaultOp::Rename => 7,
        }
    }
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call does nothing and fails with this kind.
    Kind(io::ErrorKind),
    /// The call does nothing and fails with this raw OS error (28 = ENOSPC,
    /// 5 = EIO).
    Os(i32),
    /// For [`FaultOp::Write`]: writes only the first `written` bytes, then
    /// fails with `WriteZero`. For other operations: like `Kind(Other)`.
    ShortWrite {
        /// Bytes of the buffer that reach the file.
        written: usize,
    },
    /// For [`FaultOp::Write`]: writes only the first `written` bytes, then
    /// fails with `ENOSPC` (a disk that filled during the write). For other
    /// operations: fails with `ENOSPC`.
    ShortWriteNoSpace {
        /// Bytes of the buffer that reach the file.
        written: usize,
    },
}

impl Fault {
    fn error(self) -> io::Error {
        match self {
            Fault::Kind(kind) => io::Error::new(kind, "injected fault"),
            Fault::Os(code) => io::Error::from_raw_os_error(code),
            Fault::ShortWrite { written } => io::Error::new(
                io::ErrorKind::WriteZero,
                format!("injected short write after {written} bytes"),
            ),
            Fault::ShortWriteNoSpace { .. } => io::Error::from_raw_os_error(28),
        }
    }
}

/// Counters, planned faults and delays shared by a [`FaultyFs`] and the
/// files it opened.
#[derive(Debug, Default)]
struct FaultState {
    /// Calls so far, per operation ([`FaultOp::index`]).
    calls: [AtomicU64; 8],
    /// `(op, nth call, fault)`, each taken once.
    planned: Mutex<Vec<(FaultOp, u64, Fault)>>,
    /// A sleep before every call of an operation, to widen races in tests.
    delays: Mutex<[Option<Duration>; 8]>,
}

impl FaultState {
    /// Counts a call of `op`, sleeps if asked, and returns the fault planned
    /// for this call, if any.
    fn enter(&self, op: FaultOp) -> Option<Fault> {
        let nth = self.calls[op.index()].fetch_add(1, Ordering::SeqCst) + 1;
        let delay = self.delays.lock().unwrap_or_else(PoisonError::into_inner)[op.index()];
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        let mut planned = self.planned.lock().unwrap_or_else(PoisonError::into_inner);
        let at = planned.iter().position(|&(o, n, _)| o == op && n == nth)?;
        Some(planned.swap_remove(at).2)
    }
}

/// A seam for tests: wraps another [`Fs`], counts calls per [`FaultOp`],
/// fails the Nth call of a chosen operation with a chosen error (or makes a
/// write short), and can delay calls.
///
/// Call numbers are 1-based and count every call since creation through
/// this `FaultyFs` and the files it opened; [`FaultyFs::fail_next`] plans a
/// fault for the next call. Each planned fault fires once.
#[derive(Clone)]
pub struct FaultyFs {
    inner: Arc<dyn Fs>,
    state: Arc<FaultState>,
}

impl FaultyFs {
    /// Wraps `inner` with no faults planned.
    pub fn new(inner: Arc<dyn Fs>) -> Self {
        FaultyFs {
            inner,
            state: Arc::new(FaultState::default()),
        }
    }

    /// Plans `fault` for the `nth` (1-based, counted since creation) call of
    /// `op`.
    pub fn fail(&self, op: FaultOp, nth: u64, fault: Fault) {
        self.state
            .planned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((op, nth, fault));
    }

    /// Plans `fault` for the next call of `op`.
    pub fn fail_next(&self, op: FaultOp, fault: Fault) {
        self.fail(op, self.count(op) + 1, fault);
    }

    /// Calls of `op` so far (failed ones included).
    pub fn count(&self, op: FaultOp) -> u64 {
        self.state.calls[op.index()].load(Ordering::SeqCst)
    }

    /// Sleeps `delay` before every later call of `op` (`None` stops it).
    pub fn set_delay(&self, op: FaultOp, delay: Option<Duration>) {
        self.state
            .delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[op.index()] = delay;
    }
}

impl std::fmt::Debug for FaultyFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyFs")
            .field("state", &self.state)
            .finish()
    }
}

/// A file opened through a [`FaultyFs`].
struct FaultyFile {
    inner: Box<dyn LogFile>,
    state: Arc<FaultState>,
}

impl Fs for FaultyFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list(dir)
    }

    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(FaultyFile {
            inner: self.inner.open_rw(path)?,
            state: Arc::clone(&self.state),
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        if let Some(fault) = self.state.enter(FaultOp::CreateNew) {
            return Err(fault.error());
        }
        Ok(Box::new(FaultyFile {
            inner: self.inner.create_new(path)?,
            state: Arc::clone(&self.state),
        }))
    }

    fn create_new_mode(&self, path: &Path, mode: u32) -> io::Result<Box<dyn LogFile>> {
        if let Some(fault) = self.state.enter(FaultOp::CreateNew) {
            return Err(fault.error());
        }
        Ok(Box::new(FaultyFile {
            inner: self.inner.create_new_mode(path, mode)?,
            state: Arc::clone(&self.state),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        match self.state.enter(FaultOp::Remove) {
            Some(fault) => Err(fault.error()),
            None => self.inner.remove_file(path),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self.state.enter(FaultOp::Rename) {
            Some(fault) => Err(fault.error()),
            None => self.inner.rename(from, to),
        }
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        self.inner.modified(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match self.state.enter(FaultOp::SyncDir) {
            Some(fault) => Err(fault.error()),
            None => self.inner.sync_dir(dir),
        }
    }

    fn map(&self, path: &Path) -> io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
        self.inner.map(path)
    }
}

impl LogFile for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        match self.state.enter(FaultOp::Write) {
            None => self.inner.write_all_at(offset, buf),
            Some(
                fault @ (Fault::ShortWrite { written } | Fault::ShortWriteNoSpace { written }),
            ) => {
                let prefix = buf.get(..written).unwrap_or(buf);
                self.inner.write_all_at(offset, prefix)?;
                Err(fault.error())
            }
            Some(fault) => Err(fault.error()),
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        match self.state.enter(FaultOp::SyncData) {
            Some(fault) => Err(fault.error()),
            None => self.inner.sync_data(),
        }
    }

    fn sync_all(&mut self) -> io::Result<()> {
        match self.state.enter(FaultOp::SyncAll) {
            Some(fault) => Err(fault.error()),
            None => self.inner.sync_all(),
        }
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        match self.state.enter(FaultOp::SetLen) {
            Some(fault) => Err(fault.error()),
            None => self.inner.set_len(len),
        }
    }
    fn write_back(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_back(offset, len)
    }
}
