//! [`MemFs`]: an in-memory [`Fs`] that models power loss, for crash tests
//! and fuzzing.
//!
//! It keeps, per file, the bytes written apart from the bytes a completed
//! `sync_data` / `sync_all` made durable, and, per directory, the entries
//! created or removed apart from those a completed `sync_dir` made durable.
//! [`MemFs::power_cut`] then throws away what was never made durable the way
//! a disk may: unsynced bytes are dropped, the last unsynced write of each
//! file is dropped, torn, zero-filled or filled with garbage ([`CutMode`]),
//! and each unsynced directory change independently survives or is undone (a
//! created file whose directory was not synced may vanish; a removed one may
//! come back).
//!
//! [`MemFs::crash_after`] makes every mutating call after the next `n` fail,
//! as if the machine stopped there: the writer sees an error (and poisons
//! itself), nothing after that point reaches the "disk", and the test then
//! cuts the power and reopens.
//!
//! The model, per file (an inode, so a removed file that comes back keeps its
//! durable bytes):
//!
//! - `write_all_at` and `set_len` change the current bytes at once and are
//!   remembered as pending;
//! - `sync_data` and `sync_all` make the current bytes (and length) durable
//!   and forget the pending operations;
//! - a power cut resets the file to its durable bytes, then applies the last
//!   pending operation as the [`CutMode`] says.
//!
//! Directories: `create_dir_all`, `create_new`, `remove_file` and `rename`
//! change the current entries (a rename across directories changes an entry
//! in each, and each is made durable by its own directory's sync); `sync_dir(d)` makes the current entries directly in `d`
//! (files and subdirectories) durable. Root (`/`) and the working directory
//! (`""`, `.`) always exist.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::fs::{Fs, LogFile};

/// What a power cut does to the last unsynced write of each file (every
/// earlier unsynced write of that file is dropped in all modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CutMode {
    /// The write never reached the disk.
    Drop,
    /// A random prefix of the write reached the disk (from none of it to all
    /// of it), byte-granular.
    Torn,
    /// The file grew over the write's range but its data never arrived: the
    /// range reads as zero bytes.
    Zeros,
    /// The write's range holds random bytes.
    Garbage,
    /// Page-granular, in any order: each page ([`PAGE_BYTES`], aligned on
    /// file offsets) the write touches reached the disk or not, a coin toss
    /// per page (a suffix without its prefix, a hole in the middle, only the
    /// last page...). A page that did not keeps its durable bytes; a page
    /// past the durable end that did extends the file, and the pages
    /// between read as zeros. See also [`MemFs::power_cut_pages`].
    Pages,
}

impl CutMode {
    /// Every mode.
    pub const ALL: [CutMode; 5] = [
        CutMode::Drop,
        CutMode::Torn,
        CutMode::Zeros,
        CutMode::Garbage,
        CutMode::Pages,
    ];
}

/// The page size of [`CutMode::Pages`] and [`MemFs::power_cut_pages`]
/// (4 KiB, the Linux page cache's unit of write-back).
pub const PAGE_BYTES: usize = 4096;

/// Applies the write of `bytes` at `offset` page by page: page `i` of the
/// `n` pages it touches reaches `data` only when `keep(i, n)`.
fn write_pages(
    data: &mut Vec<u8>,
    offset: usize,
    bytes: &[u8],
    keep: &mut dyn FnMut(usize, usize) -> bool,
) {
    let end = offset.saturating_add(bytes.len());
    if end == offset {
        return;
    }
    let first_page = offset / PAGE_BYTES;
    let pages = (end - 1) / PAGE_BYTES + 1 - first_page;
    for i in 0..pages {
        let page = first_page + i;
        let from = (page * PAGE_BYTES).max(offset);
        let to = ((page + 1) * PAGE_BYTES).min(end);
        if keep(i, pages) {
            write_at(
                data,
                from,
                bytes.get(from - offset..to - offset).unwrap_or(&[]),
            );
        }
    }
}

/// An operation on a file not yet made durable by a sync.
#[derive(Clone, Debug)]
enum Pending {
    /// `write_all_at(offset, bytes)`.
    Write { offset: usize, bytes: Vec<u8> },
    /// `set_len(len)`.
    SetLen(usize),
}

/// A file's contents, independent of its names.
#[derive(Clone, Debug, Default)]
struct Inode {
    /// The bytes as the running system sees them.
    data: Vec<u8>,
    /// The bytes as of the last completed sync.
    durable: Vec<u8>,
    /// Operations since that sync, oldest first.
    pending: Vec<Pending>,
    /// When the contents last changed (`None`: never, read as the epoch).
    modified: Option<SystemTime>,
}

/// Everything a [`MemFs`] and its open files share.
#[derive(Debug, Default)]
struct State {
    /// Inodes by number.
    inodes: HashMap<u64, Inode>,
    /// The number the next created file gets.
    next_inode: u64,
    /// File entries as the running system sees them.
    files: BTreeMap<PathBuf, u64>,
    /// File entries as of the last `sync_dir` of their directory.
    durable_files: BTreeMap<PathBuf, u64>,
    /// Directories as the running system sees them (roots excluded).
    dirs: BTreeSet<PathBuf>,
    /// Directories whose entry in their parent was made durable.
    durable_dirs: BTreeSet<PathBuf>,
    /// Mutating calls that succeeded so far.
    ops: u64,
    /// Mutating calls fail once `ops` reaches this ([`MemFs::crash_after`]).
    crash_at: Option<u64>,
    /// Bumped by every power cut: files opened before it are dead.
    epoch: u64,
}

impl State {
    /// Counts a mutating call, or fails it when the machine has "crashed".
    fn enter(&mut self) -> io::Result<()> {
        if self.crash_at.is_some_and(|at| self.ops >= at) {
            return Err(io::Error::other("MemFs: the machine crashed (simulated)"));
        }
        self.ops += 1;
        Ok(())
    }

    /// Whether directory `dir` exists now.
    fn dir_exists(&self, dir: &Path) -> bool {
        is_root(dir) || self.dirs.contains(dir)
    }
}

/// True for `/`, `""`, `.` and other paths naming a root or the working
/// directory, which always exist.
fn is_root(path: &Path) -> bool {
    path.components().all(|c| {
        matches!(
            c,
            Component::RootDir | Component::CurDir | Component::Prefix(_)
        )
    })
}

/// The directory holding `path` (`""` for a bare name).
fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

/// Whether `a` and `b` name the same directory (roots all count as one).
fn same_dir(a: &Path, b: &Path) -> bool {
    a == b || (is_root(a) && is_root(b) && a.has_root() == b.has_root())
}

/// Converts a file offset or length to `usize`.
fn to_usize(value: u64) -> io::Result<usize> {
    usize::try_from(value).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "offset beyond the address space",
        )
    })
}

/// A small deterministic generator (SplitMix64) for power cuts.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..=max`.
    fn up_to(&mut self, max: usize) -> usize {
        // Casts: usize is at most 64 bits; the remainder is at most `max`.
        (self.next() % (max as u64).saturating_add(1)) as usize
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Writes `bytes` at `offset` of `data`, zero-filling any gap.
fn write_at(data: &mut Vec<u8>, offset: usize, bytes: &[u8]) {
    let end = offset.saturating_add(bytes.len());
    if data.len() < end {
        data.resize(end, 0);
    }
    if let Some(range) = data.get_mut(offset..end) {
        range.copy_from_slice(bytes);
    }
}

/// An in-memory file system that keeps written apart from durable bytes and
/// entries, and can lose what is not durable ([`MemFs::power_cut`]). Clones
/// share the same files. See the [module docs](self) for the model.
#[derive(Clone, Debug, Default)]
pub struct MemFs {
    state: Arc<Mutex<State>>,
}

impl MemFs {
    /// An empty file system (only the roots exist).
    pub fn new() -> MemFs {
        MemFs::default()
    }

    /// Locks the shared state (a panic while holding it cannot leave it
    /// inconsistent: every change is made in one step).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a file with `bytes` at `path`, already durable, with its
    /// directory and all missing parent directories created and durable:
    /// the state of a disk before a test starts. Replaces an existing file.
    /// Not counted as an operation and never fails by a crash.
    pub fn insert_durable(&self, path: &Path, bytes: &[u8]) {
        let mut state = self.lock();
        for dir in parent_of(path).ancestors() {
            if !is_root(dir) {
                state.dirs.insert(dir.to_owned());
                state.durable_dirs.insert(dir.to_owned());
            }
        }
        let inode = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(
            inode,
            Inode {
                data: bytes.to_vec(),
                durable: bytes.to_vec(),
                pending: Vec::new(),
                modified: Some(SystemTime::now()),
            },
        );
        state.files.insert(path.to_owned(), inode);
        state.durable_files.insert(path.to_owned(), inode);
    }

    /// The current bytes of the file at `path`, if it exists.
    pub fn read(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let inode = state.files.get(path)?;
        state.inodes.get(inode).map(|i| i.data.clone())
    }

    /// Every file path that exists now, sorted.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.lock().files.keys().cloned().collect()
    }

    /// Mutating calls that succeeded so far (`create_dir_all`, `create_new`,
    /// `remove_file`, `rename`, `sync_dir`, and on files `write_all_at`, `sync_data`,
    /// `sync_all`, `set_len`).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Lets the next `n` mutating calls succeed and fails every later one
    /// with an `Other` I/O error, as if the machine stopped after the `n`th.
    /// Reads (`list`, `map`, `open_rw`, `len`) keep working. Cleared by
    /// [`power_cut`](Self::power_cut) and [`recover_power`](Self::recover_power).
    pub fn crash_after(&self, n: u64) {
        let mut state = self.lock();
        state.crash_at = Some(state.ops.saturating_add(n));
    }

    /// Whether a planned crash has been reached (the next mutating call
    /// fails).
    pub fn crashed(&self) -> bool {
        let state = self.lock();
        state.crash_at.is_some_and(|at| state.ops >= at)
    }

    /// Clears a planned crash without cutting the power.
    pub fn recover_power(&self) {
        self.lock().crash_at = None;
    }

    /// Simulates a power loss and the reboot after it.
    ///
    /// Every directory change not made durable by `sync_dir` independently
    /// survives or is undone (a coin toss per entry); a directory that is
    /// gone takes its files with it. Every file is reset to its durable
    /// bytes, then its last unsynced operation is applied as `mode` says (a
    /// `set_len` is undone by [`CutMode::Drop`] and kept by the others).
    /// Afterwards everything that exists is durable, files opened before the
    /// cut fail every call, and a planned crash is cleared. `seed` drives
    /// every random choice, so a cut is reproducible.
    pub fn power_cut(&self, mode: CutMode, seed: u64) {
        self.cut(seed, &mut |rng, data, pending| match (pending, mode) {
            (_, CutMode::Drop) => {}
            (Pending::SetLen(len), _) => data.resize(len, 0),
            (Pending::Write { offset, bytes }, CutMode::Torn) => {
                let kept = rng.up_to(bytes.len());
                write_at(data, offset, bytes.get(..kept).unwrap_or(&bytes));
            }
            (Pending::Write { offset, bytes }, CutMode::Zeros) => {
                write_at(data, offset, &vec![0; bytes.len()]);
            }
            (Pending::Write { offset, bytes }, CutMode::Garbage) => {
                // Truncation: keeps the low byte of a random word.
                let garbage: Vec<u8> = bytes.iter().map(|_| rng.next() as u8).collect();
                write_at(data, offset, &garbage);
            }
            (Pending::Write { offset, bytes }, CutMode::Pages) => {
                write_pages(data, offset, &bytes, &mut |_, _| rng.coin());
            }
        });
    }

    /// [`power_cut`](Self::power_cut) where the last unsynced write of each
    /// file persists page `i` of its `n` pages ([`PAGE_BYTES`], aligned on
    /// file offsets) exactly when `keep(i, n)`: e.g. `|i, n| i + 1 == n`
    /// (only the last page), `|i, _| i % 2 == 1` (every other page),
    /// `|i, n| i >= n / 2` (a suffix without its prefix). A last unsynced
    /// `set_len` is kept. Directory changes are decided by `seed`.
    pub fn power_cut_pages(&self, seed: u64, keep: &dyn Fn(usize, usize) -> bool) {
        self.cut(seed, &mut |_, data, pending| match pending {
            Pending::SetLen(len) => data.resize(len, 0),
            Pending::Write { offset, bytes } => {
                write_pages(data, offset, &bytes, &mut |i, n| keep(i, n));
            }
        });
    }

    /// The power cut: directory changes by coin toss (from `seed`), then
    /// every file reset to its durable bytes and its last unsynced
    /// operation handed to `apply`.
    fn cut(&self, seed: u64, apply: &mut dyn FnMut(&mut SplitMix, &mut Vec<u8>, Pending)) {
        let mut rng = SplitMix(seed);
        let mut state = self.lock();
        let state = &mut *state;

        // Directories: each unsynced change survives or not.
        let all_dirs: BTreeSet<PathBuf> = state.dirs.union(&state.durable_dirs).cloned().collect();
        let mut dirs = BTreeSet::new();
        for dir in all_dirs {
            let live = state.dirs.contains(&dir);
            let durable = state.durable_dirs.contains(&dir);
            let keep = if live == durable { live } else { rng.coin() };
            // Sorted order puts a parent before its children.
            if keep && (is_root(parent_of(&dir)) || dirs.contains(parent_of(&dir))) {
                dirs.insert(dir);
            }
        }

        // File entries: the same, and only inside surviving directories.
        let all_paths: BTreeSet<PathBuf> = state
            .files
            .keys()
            .chain(state.durable_files.keys())
            .cloned()
            .collect();
        let mut files = BTreeMap::new();
        for path in all_paths {
            let live = state.files.get(&path).copied();
            let durable = state.durable_files.get(&path).copied();
            let entry = if live == durable || rng.coin() {
                live
            } else {
                durable
            };
            let parent = parent_of(&path);
            if let Some(inode) = entry {
                if is_root(parent) || dirs.contains(parent) {
                    files.insert(path, inode);
                }
            }
        }

        // Contents: durable bytes, then the last pending operation per mode.
        let referenced: BTreeSet<u64> = files.values().copied().collect();
        state.inodes.retain(|number, _| referenced.contains(number));
        let mut numbers: Vec<u64> = state.inodes.keys().copied().collect();
        numbers.sort_unstable();
        for number in numbers {
            let Some(inode) = state.inodes.get_mut(&number) else {
                continue;
            };
            let mut data = std::mem::take(&mut inode.durable);
            if let Some(pending) = inode.pending.pop() {
                apply(&mut rng, &mut data, pending);
            }
            inode.pending.clear();
            inode.durable = data.clone();
            inode.data = data;
        }

        state.durable_dirs = dirs.clone();
        state.dirs = dirs;
        state.durable_files = files.clone();
        state.files = files;
        state.crash_at = None;
        state.epoch += 1;
    }

    /// A crash test's sweep: runs `write` once on a fresh `disk()` to count
    /// its mutating calls (n), then, for every crash point 0..=n, every
    /// [`CutMode`] and seeds `0..seeds`, runs it again on a fresh `disk()`
    /// crashed after that many calls ([`crash_after`](Self::crash_after)),
    /// cuts the power ([`power_cut`](Self::power_cut)) and hands the disk,
    /// `write`'s result and the point (`crash_after`, mode, seed) to
    /// `check`. Returns n.
    pub fn every_crash_point<T>(
        disk: impl Fn() -> MemFs,
        write: impl Fn(&MemFs) -> T,
        seeds: u64,
        mut check: impl FnMut(&MemFs, T, (u64, CutMode, u64)),
    ) -> u64 {
        let calls = {
            let fs = disk();
            write(&fs);
            fs.ops()
        };
        for crash_after in 0..=calls {
            for mode in CutMode::ALL {
                for seed in 0..seeds {
                    let fs = disk();
                    fs.crash_after(crash_after);
                    let result = write(&fs);
                    fs.power_cut(mode, seed);
                    check(&fs, result, (crash_after, mode, seed));
                }
            }
        }
        calls
    }

    /// Opens the file at `path` as it exists now.
    fn open(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let state = self.lock();
        let Some(&inode) = state.files.get(path) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no file {}", path.display()),
            ));
        };
        Ok(Box::new(MemFile {
            state: Arc::clone(&self.state),
            inode,
            epoch: state.epoch,
        }))
    }
}

impl Fs for MemFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.enter()?;
        for dir in path.ancestors() {
            if !is_root(dir) {
                state.dirs.insert(dir.to_owned());
            }
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.lock();
        if !state.dir_exists(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no directory {}", dir.display()),
            ));
        }
        Ok(state
            .files
            .keys()
            .filter(|path| same_dir(parent_of(path), dir))
            .cloned()
            .collect())
    }

    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        self.open(path)
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        {
            let mut state = self.lock();
            if !state.dir_exists(parent_of(path)) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("MemFs: no directory for {}", path.display()),
                ));
            }
            if state.files.contains_key(path) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("MemFs: {} exists", path.display()),
                ));
            }
            state.enter()?;
            let inode = state.next_inode;
            state.next_inode += 1;
            state.inodes.insert(
                inode,
                Inode {
                    modified: Some(SystemTime::now()),
                    ..Inode::default()
                },
            );
            state.files.insert(path.to_owned(), inode);
        }
        self.open(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        if !state.files.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no file {}", path.display()),
            ));
        }
        state.enter()?;
        state.files.remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let Some(&inode) = state.files.get(from) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no file {}", from.display()),
            ));
        };
        if !state.dir_exists(parent_of(to)) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no directory for {}", to.display()),
            ));
        }
        state.enter()?;
        state.files.remove(from);
        state.files.insert(to.to_owned(), inode);
        Ok(())
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        let state = self.lock();
        state
            .files
            .get(path)
            .and_then(|inode| state.inodes.get(inode))
            .map(|inode| inode.modified.unwrap_or(SystemTime::UNIX_EPOCH))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("MemFs: no file {}", path.display()),
                )
            })
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        if !state.dir_exists(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("MemFs: no directory {}", dir.display()),
            ));
        }
        state.enter()?;
        let state = &mut *state;
        state
            .durable_files
            .retain(|path, _| !same_dir(parent_of(path), dir));
        for (path, &inode) in &state.files {
            if same_dir(parent_of(path), dir) {
                state.durable_files.insert(path.clone(), inode);
            }
        }
        state
            .durable_dirs
            .retain(|child| !same_dir(parent_of(child), dir));
        for child in &state.dirs {
            if same_dir(parent_of(child), dir) {
                state.durable_dirs.insert(child.clone());
            }
        }
        Ok(())
    }

    fn map(&self, path: &Path) -> io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
        let state = self.lock();
        let bytes = state
            .files
            .get(path)
            .and_then(|inode| state.inodes.get(inode))
            .map(|inode| inode.data.clone())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("MemFs: no file {}", path.display()),
                )
            })?;
        Ok(Box::new(bytes))
    }
}

/// A file opened through a [`MemFs`]: an inode number, valid until the next
/// power cut.
struct MemFile {
    state: Arc<Mutex<State>>,
    inode: u64,
    /// The power-cut epoch it was opened in.
    epoch: u64,
}

impl MemFile {
    /// Runs `f` on the inode; `mutating` calls are counted and fail after a
    /// crash.
    fn with<T>(
        &self,
        mutating: bool,
        f: impl FnOnce(&mut Inode) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.epoch != self.epoch {
            return Err(io::Error::other("MemFs: file opened before a power cut"));
        }
        if mutating {
            state.enter()?;
        }
        let inode = state
            .inodes
            .get_mut(&self.inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "MemFs: inode is gone"))?;
        f(inode)
    }
}

impl LogFile for MemFile {
    fn len(&self) -> io::Result<u64> {
        // usize is at most 64 bits on every target Rust supports.
        self.with(false, |inode| Ok(inode.data.len() as u64))
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let offset = to_usize(offset)?;
        self.with(true, |inode| {
            write_at(&mut inode.data, offset, buf);
            inode.modified = Some(SystemTime::now());
            inode.pending.push(Pending::Write {
                offset,
                bytes: buf.to_vec(),
            });
            Ok(())
        })
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.with(true, |inode| {
            inode.durable = inode.data.clone();
            inode.pending.clear();
            Ok(())
        })
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let len = to_usize(len)?;
        self.with(true, |inode| {
            inode.data.resize(len, 0);
            inode.modified = Some(SystemTime::now());
            inode.pending.push(Pending::SetLen(len));
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/d")
    }

    fn setup() -> MemFs {
        let fs = MemFs::new();
        fs.create_dir_all(&dir()).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs
    }

    #[test]
    fn synced_bytes_survive_and_unsynced_ones_follow_the_mode() {
        for mode in CutMode::ALL {
            for seed in 0..20 {
                let fs = setup();
                let path = dir().join("f");
                let mut file = fs.create_new(&path).unwrap();
                fs.sync_dir(&dir()).unwrap();
                file.write_all_at(0, b"durable").unwrap();
                file.sync_data().unwrap();
                file.write_all_at(7, b"-pending").unwrap();
                assert_eq!(fs.read(&path).unwrap(), b"durable-pending");
                fs.power_cut(mode, seed);
                let got = fs.read(&path).unwrap();
                assert_eq!(&got[..7], b"durable", "{mode:?}");
                let tail = &got[7..];
                match mode {
                    CutMode::Drop => assert!(tail.is_empty()),
                    CutMode::Torn => assert!(b"-pending".starts_with(tail)),
                    CutMode::Zeros => assert_eq!(tail, &[0; 8]),
                    CutMode::Garbage => assert_eq!(tail.len(), 8),
                    // One page: all of it or none.
                    CutMode::Pages => assert!(tail.is_empty() || tail == b"-pending"),
                }
                assert!(file.write_all_at(0, b"x").is_err(), "stale handle wrote");
            }
        }
    }

    #[test]
    fn pages_persist_in_any_order() {
        let fs = setup();
        let path = dir().join("f");
        let mut file = fs.create_new(&path).unwrap();
        fs.sync_dir(&dir()).unwrap();
        file.write_all_at(0, &[1; 100]).unwrap();
        file.sync_data().unwrap();
        // 100 durable bytes, then a write over the rest of page 0 and pages
        // 1 and 2.
        let write: Vec<u8> = (0..2 * PAGE_BYTES as u32 + 50)
            .map(|i| 2 + (i % 7) as u8)
            .collect();
        file.write_all_at(100, &write).unwrap();
        let whole = fs.read(&path).unwrap();
        fs.power_cut_pages(0, &|i, n| {
            assert_eq!(n, 3);
            i == 2
        });
        let got = fs.read(&path).unwrap();
        assert_eq!(got.len(), whole.len(), "the last page extends the file");
        assert_eq!(&got[..100], &[1; 100]);
        assert!(got[100..2 * PAGE_BYTES].iter().all(|&b| b == 0), "a hole");
        assert_eq!(got[2 * PAGE_BYTES..], whole[2 * PAGE_BYTES..]);
        // Only the first page: the file ends where it ends.
        let mut file = fs.open_rw(&path).unwrap();
        file.write_all_at(PAGE_BYTES as u64, &[9; PAGE_BYTES])
            .unwrap();
        fs.power_cut_pages(0, &|i, _| i == 1);
        assert_eq!(
            fs.read(&path).unwrap(),
            got,
            "a write inside one page keeps or drops it"
        );
    }

    #[test]
    fn unsynced_entries_may_vanish_or_come_back() {
        let (mut vanished, mut kept, mut back) = (0, 0, 0);
        for seed in 0..64 {
            let fs = setup();
            let old = dir().join("old");
            fs.insert_durable(&old, b"old");
            let new = dir().join("new");
            let mut file = fs.create_new(&new).unwrap();
            file.write_all_at(0, b"new").unwrap();
            file.sync_all().unwrap();
            fs.remove_file(&old).unwrap();
            fs.power_cut(CutMode::Drop, seed);
            match fs.read(&new) {
                Some(bytes) => {
                    assert_eq!(bytes, b"new");
                    kept += 1;
                }
                None => vanished += 1,
            }
            if let Some(bytes) = fs.read(&old) {
                assert_eq!(bytes, b"old");
                back += 1;
            }
        }
        assert!(vanished > 0 && kept > 0 && back > 0);
        // After sync_dir nothing is left to chance.
        let fs = setup();
        let new = dir().join("new");
        fs.create_new(&new).unwrap().sync_all().unwrap();
        fs.sync_dir(&dir()).unwrap();
        fs.power_cut(CutMode::Garbage, 1);
        assert_eq!(fs.read(&new).unwrap(), b"");
    }

    #[test]
    fn a_crash_fails_every_later_mutation() {
        let fs = setup();
        let path = dir().join("f");
        let mut file = fs.create_new(&path).unwrap();
        fs.crash_after(1);
        file.write_all_at(0, b"abc").unwrap();
        assert!(fs.crashed());
        assert!(file.sync_data().is_err());
        assert!(fs.sync_dir(&dir()).is_err());
        assert_eq!(fs.map(&path).unwrap().as_ref().as_ref(), b"abc");
        assert_eq!(fs.list(&dir()).unwrap(), vec![path]);
        fs.power_cut(CutMode::Drop, 0);
        assert!(!fs.crashed());
    }

    #[test]
    fn a_rename_is_durable_once_its_target_directory_is_synced() {
        let fs = setup();
        let tmp = dir().join("tmp");
        let blobs = dir().join("blobs");
        fs.create_dir_all(&tmp).unwrap();
        fs.create_dir_all(&blobs).unwrap();
        fs.sync_dir(&dir()).unwrap();
        let (from, to) = (tmp.join("upload"), blobs.join("blob"));
        for seed in 0..32 {
            let mut file = fs.create_new(&from).unwrap();
            file.write_all_at(0, b"bytes").unwrap();
            file.sync_all().unwrap();
            fs.rename(&from, &to).unwrap();
            assert_eq!(fs.read(&from), None);
            assert_eq!(fs.read(&to).as_deref(), Some(&b"bytes"[..]));
            assert!(fs.modified(&to).unwrap() > SystemTime::UNIX_EPOCH);
            fs.sync_dir(&blobs).unwrap();
            fs.power_cut(CutMode::Garbage, seed);
            // The target survives whole; the source entry may come back
            // (its directory was not synced), with the same bytes.
            assert_eq!(fs.read(&to).as_deref(), Some(&b"bytes"[..]));
            assert!(matches!(fs.read(&from).as_deref(), None | Some(b"bytes")));
            if fs.read(&from).is_some() {
                fs.remove_file(&from).unwrap();
            }
            fs.remove_file(&to).unwrap();
            fs.sync_dir(&tmp).unwrap();
            fs.sync_dir(&blobs).unwrap();
        }
        assert_eq!(
            fs.rename(&from, &to).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
