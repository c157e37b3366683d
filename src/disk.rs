//! The disk reserve (SPEC section 10, `insufficient_storage`):
//! writes that would grow the log or the media store are refused with
//! `507` while the data directory's file system has less free space than
//! `log.disk_reserve_bytes`, before the disk is actually full, and admitted
//! again by themselves once space is back.
//!
//! Free space is measured with `statvfs` (blocks available to unprivileged
//! users, so the root-reserved blocks of ext4 never count). A measure above
//! the reserve is trusted for `log.disk_check_interval_ms`, minus what the
//! engine admitted since (its own writes are counted, another program's are
//! not); below the reserve every check measures again, so writes resume at
//! once when space comes back. A measure costs one `statvfs` call (about a
//! microsecond; docs/operations.md "A full disk").
//!
//! Both writers, the journal (a group-commit batch) and the media store (an
//! upload), ask this module alone whether a write is refused for want of
//! space: [`DiskSpace::admit_writes`] before writing (the reserve), and
//! [`DiskSpace::full_refusal`] / [`DiskSpace::refuse_full`] after a write
//! failed (`ENOSPC`, `EDQUOT`). Each refusal is `InsufficientStorage`
//! (`507`), counted in `writes_refused` by reason.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use spark_core::error::EngineError;

/// The reserve check of one data directory; shared by the journal (one
/// check per group-commit batch) and the media store (one per upload,
/// [`crate::media::MediaStore::put`]).
#[derive(Debug)]
pub struct DiskSpace {
    /// The data directory: its file system is measured.
    dir: PathBuf,
    /// Free bytes to keep (`log.disk_reserve_bytes`); 0 turns checks off.
    reserve_bytes: u64,
    /// How long a measure above the reserve is trusted.
    check_interval: Duration,
    /// The last measure and what was admitted since.
    sample: Mutex<Sample>,
}

/// One measure of free space.
#[derive(Debug, Default)]
struct Sample {
    /// When it was taken; `None` forces the next check to measure.
    taken_at: Option<Instant>,
    /// Free bytes then.
    free_bytes: u64,
    /// Bytes admitted since then (an estimate of what the engine wrote).
    admitted_since_bytes: u64,
    /// True while the last check refused: every check measures again.
    below: bool,
    /// The last measuring error, logged once.
    error: Option<String>,
    /// Why the last write failed for want of space (`ENOSPC`, from
    /// [`DiskSpace::note_full`]), until a write is admitted again: `/readyz`
    /// says it, with the reserve off too.
    full: Option<String>,
}

/// With a write that found the disk full ([`DiskSpace::note_full`]),
/// `/readyz` answers ready again once this many bytes are free above the
/// reserve (with `log.disk_reserve_bytes = 0` too, where a check of zero
/// bytes would always pass): room for a batch of writes, 1 MiB.
pub const ROOM_AFTER_FULL_BYTES: u64 = 1024 * 1024;

/// Free bytes of the file system holding `path` (`statvfs`: `f_bavail`
/// blocks of `f_frsize` bytes, what an unprivileged user may still write).
///
/// Errors: the call's OS error (e.g. `ENOENT` when `path` does not exist).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `statvfs` is plain old data, valid when zeroed; the call only
    // writes into it, and reads the NUL-terminated path that outlives it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Casts: the field widths differ by platform; both fit u64.
    #[allow(clippy::unnecessary_cast)]
    let free = (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64);
    Ok(free)
}

/// Why a write was refused for want of space: the `reason` label of
/// `writes_refused`.
#[derive(Debug, Clone, Copy)]
enum Shortage {
    /// Free space below the reserve, before writing: `disk_reserve`.
    Reserve,
    /// A write failed with `ENOSPC` or `EDQUOT`: `disk_full`.
    Full,
}

/// Counts `writes` writes refused for `shortage`.
fn count_refused(shortage: Shortage, writes: u64) {
    let reason = match shortage {
        Shortage::Reserve => "disk_reserve",
        Shortage::Full => "disk_full",
    };
    crate::metrics::get()
        .writes_refused
        .get_or_create(&crate::metrics::label("reason", reason))
        .inc_by(writes);
}

impl DiskSpace {
    /// The reserve check of `dir`'s file system: keep `reserve_bytes` free
    /// (0: never refuse), trusting a measure for `check_interval_ms`.
    pub fn new(dir: &Path, reserve_bytes: u64, check_interval_ms: u64) -> DiskSpace {
        crate::metrics::get()
            .disk_reserve_bytes
            .set(i64::try_from(reserve_bytes).unwrap_or(i64::MAX));
        DiskSpace {
            dir: dir.to_owned(),
            reserve_bytes,
            check_interval: Duration::from_millis(check_interval_ms),
            sample: Mutex::new(Sample::default()),
        }
    }

    /// The reserve, in bytes (`log.disk_reserve_bytes`).
    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// Admits a write of about `need_bytes` (a batch's records, an upload's
    /// declared length) if the free space after it stays at or above the
    /// reserve, and counts it against the current measure. With the reserve
    /// off (0) it admits without measuring, except after
    /// [`DiskSpace::note_full`], until `need_bytes` are free again.
    ///
    /// Errors: `InsufficientStorage` saying how much is free, needed and
    /// reserved. A file system that cannot be measured admits (and is
    /// logged once): the reserve is a guard, the log's own ENOSPC handling
    /// is the backstop.
    pub fn admit(&self, need_bytes: u64) -> Result<(), EngineError> {
        let mut sample = self.sample.lock();
        self.admit_locked(&mut sample, need_bytes)
    }

    /// [`DiskSpace::admit`] of `writes` writes (a batch's ops, one upload)
    /// needing about `need_bytes` in all; a refusal is counted in
    /// `writes_refused{reason="disk_reserve"}` once per write.
    ///
    /// Errors: as [`DiskSpace::admit`].
    pub fn admit_writes(&self, need_bytes: u64, writes: u64) -> Result<(), EngineError> {
        self.admit(need_bytes)
            .inspect_err(|_| count_refused(Shortage::Reserve, writes))
    }

    /// Counts `writes` writes refused below the reserve (or while the log
    /// waits for space to recover its tail) that were refused elsewhere than
    /// in [`DiskSpace::admit_writes`].
    pub fn count_refused_for_reserve(&self, writes: u64) {
        count_refused(Shortage::Reserve, writes);
    }

    /// What a write that failed with `error` means: when it is for want of
    /// space (`ENOSPC`, `EDQUOT`: [`spark_log_format::is_no_space_error`]),
    /// the refusal of [`DiskSpace::refuse_full`]; any other error is the
    /// writer's own failure (`None`).
    pub fn full_refusal(
        &self,
        source: &str,
        error: &std::io::Error,
        writes: u64,
        lost: &str,
    ) -> Option<EngineError> {
        spark_log_format::is_no_space_error(error)
            .then(|| self.refuse_full(source, error, writes, lost))
    }

    /// The refusal of `writes` writes (of `source`, in words: "a log
    /// append") that failed for want of space with `error`: notes the disk
    /// full ([`DiskSpace::note_full`]), counts them in
    /// `writes_refused{reason="disk_full"}`, and returns
    /// `InsufficientStorage` saying the disk is full and then `lost` (what
    /// became of the write).
    pub fn refuse_full(
        &self,
        source: &str,
        error: &dyn std::fmt::Display,
        writes: u64,
        lost: &str,
    ) -> EngineError {
        self.note_full(&format!("{source}: {error}"));
        count_refused(Shortage::Full, writes);
        EngineError::InsufficientStorage(format!("the disk is full ({error}); {lost}"))
    }

    /// [`DiskSpace::admit`] with the sample already locked.
    fn admit_locked(&self, sample: &mut Sample, need_bytes: u64) -> Result<(), EngineError> {
        // Off, unless a write just found the disk full: then wait until
        // this write's bytes are free (so a log that recovered its tail is
        // not made to fail and recover again at every write).
        if self.reserve_bytes == 0 && !sample.below {
            return Ok(());
        }
        let fresh = sample
            .taken_at
            .is_some_and(|at| at.elapsed() < self.check_interval);
        if !fresh || sample.below {
            self.measure(sample);
        }
        if sample.error.is_some() {
            return Ok(());
        }
        let free_bytes = sample
            .free_bytes
            .saturating_sub(sample.admitted_since_bytes);
        let metrics = crate::metrics::get();
        if free_bytes < self.reserve_bytes.saturating_add(need_bytes) {
            sample.below = true;
            metrics.writes_refused_now.set(1);
            let full = match &sample.full {
                Some(why) => format!("the last write found the disk full ({why}); "),
                None => String::new(),
            };
            return Err(EngineError::InsufficientStorage(format!(
                "{full}{free_bytes} bytes free on the data directory's file system, {need_bytes} needed, and {} kept in reserve (log.disk_reserve_bytes); writes resume by themselves once space is freed",
                self.reserve_bytes
            )));
        }
        if sample.below {
            sample.below = false;
            sample.full = None;
            tracing::info!(
                free_bytes,
                reserve_bytes = self.reserve_bytes,
                "free disk space is back above the reserve; writes resume"
            );
        }
        metrics.writes_refused_now.set(0);
        sample.admitted_since_bytes = sample.admitted_since_bytes.saturating_add(need_bytes);
        Ok(())
    }

    /// [`DiskSpace::admit`] of nothing on a fresh measure, for `/readyz`:
    /// a probe reports the disk as it is now, not as it was up to
    /// `check_interval_ms` ago (a measure costs microseconds).
    /// It measures with the reserve off too (keeping the free-space gauge
    /// current), and after a write found the disk full it asks for
    /// [`ROOM_AFTER_FULL_BYTES`] rather than nothing: with the reserve off
    /// a check of zero bytes always passes, and `/readyz` answered ready
    /// while every write failed with `ENOSPC`.
    pub fn check_now(&self) -> Result<(), EngineError> {
        let mut sample = self.sample.lock();
        self.measure(&mut sample);
        let need_bytes = if sample.full.is_some() {
            ROOM_AFTER_FULL_BYTES
        } else {
            0
        };
        self.admit_locked(&mut sample, need_bytes)
    }

    /// Measures the free space now, for the free-space gauge
    /// (`spark_disk_free_bytes`) of a `/metrics` scrape: with the reserve
    /// off nothing else measures it.
    pub fn refresh(&self) {
        self.measure(&mut self.sample.lock());
    }

    /// A write found the disk full (`ENOSPC`, `why` in words): the next
    /// check measures again instead of trusting the last measure, and says
    /// `why` until a write is admitted again.
    pub fn note_full(&self, why: &str) {
        let mut sample = self.sample.lock();
        sample.taken_at = None;
        sample.below = true;
        sample.full = Some(why.to_owned());
        crate::metrics::get().writes_refused_now.set(1);
    }

    fn measure(&self, sample: &mut Sample) {
        match free_bytes(&self.dir) {
            Ok(free) => {
                sample.free_bytes = free;
                sample.error = None;
                crate::metrics::get()
                    .disk_free_bytes
                    .set(i64::try_from(free).unwrap_or(i64::MAX));
            }
            Err(e) => {
                let error = e.to_string();
                if sample.error.as_ref() != Some(&error) {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot measure free disk space; the disk reserve is not enforced");
                }
                sample.error = Some(error);
            }
        }
        sample.taken_at = Some(Instant::now());
        sample.admitted_since_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_above_the_free_space_refuses_and_zero_admits() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        let huge = DiskSpace::new(dir.path(), u64::MAX / 2, 100);
        let refused = huge.admit(0).unwrap_err();
        assert!(
            matches!(refused, EngineError::InsufficientStorage(ref why) if why.contains("reserve")),
            "{refused:?}"
        );
        let off = DiskSpace::new(dir.path(), 0, 100);
        assert!(off.admit(u64::MAX).is_ok());
    }

    #[test]
    fn admitted_bytes_count_against_the_trusted_measure() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        // A reserve just under the free space, trusted for a minute: the
        // first small write passes, a second that would cross it does not
        // (whatever else the machine writes meanwhile, within 1 MiB).
        let space = DiskSpace::new(dir.path(), free - (64 << 20), 60_000);
        space.admit(1 << 20).unwrap();
        assert!(space.admit(64 << 20).is_err());
        assert!(space.admit(0).is_ok(), "measured again, nothing admitted");
    }

    #[test]
    fn with_the_reserve_off_a_full_disk_still_waits_for_room() {
        let dir = tempfile::tempdir().unwrap();
        let off = DiskSpace::new(dir.path(), 0, 60_000);
        off.note_full("test");
        assert!(off.admit(u64::MAX / 2).is_err(), "no room for that much");
        assert!(off.admit(1).is_ok(), "room for a byte");
        assert!(off.admit(u64::MAX / 2).is_ok(), "off again once admitted");
    }

    #[test]
    fn a_missing_directory_admits() {
        let space = DiskSpace::new(Path::new("/nonexistent/spark-disk-test"), 1 << 20, 100);
        assert!(space.admit(1).is_ok());
    }

    #[test]
    fn a_measure_costs_little() {
        let dir = tempfile::tempdir().unwrap();
        // The fastest of ten rounds: a round in which a busy machine gave
        // this thread no CPU says nothing about the call.
        let per_call = (0..10)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..1_000 {
                    free_bytes(dir.path()).unwrap();
                }
                started.elapsed() / 1_000
            })
            .min()
            .unwrap();
        eprintln!("statvfs: {per_call:?} per call");
        // Generous bound for a loaded debug build; a batch's fdatasync is
        // about a millisecond.
        assert!(per_call < Duration::from_micros(200), "{per_call:?}");
    }
}
