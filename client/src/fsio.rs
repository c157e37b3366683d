//! Durable file writes for the outbox: temporary file, fsync, rename,
//! directory fsync. A reader sees the old bytes or the new ones, never a
//! torn mix, and what a call wrote survives a crash once it returns.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::ClientError;

/// Wraps an I/O error with the path it concerns.
pub(crate) fn io_error(path: &Path, source: std::io::Error) -> ClientError {
    ClientError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Flushes a directory's entries (names created, renamed or removed).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), ClientError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

/// Creates `dir` (and its parents) and makes its name durable.
pub(crate) fn create_dir_durably(dir: &Path) -> Result<(), ClientError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path` and fsyncs it (not its
/// directory: the caller syncs the directory once for several files).
pub(crate) fn write_new_file_synced(path: &Path, bytes: &[u8]) -> Result<(), ClientError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    file.write_all(bytes).map_err(|e| io_error(path, e))?;
    file.sync_all().map_err(|e| io_error(path, e))
}

/// A temporary name beside `path`, in the same directory (so the rename is
/// atomic), starting with a dot so listings skip it.
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{:016x}", rand::random::<u64>()))
}

/// Replaces (or creates) the file at `path` with `bytes` atomically and
/// durably: temporary file, fsync, rename over, directory fsync.
pub(crate) fn write_file_durably(path: &Path, bytes: &[u8]) -> Result<(), ClientError> {
    let temp = temp_beside(path);
    let written = write_new_file_synced(&temp, bytes)
        .and_then(|()| fs::rename(&temp, path).map_err(|e| io_error(path, e)));
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(parent_of(path))
}

/// Removes the file at `path` durably (directory fsync). A file already
/// gone is not an error.
pub(crate) fn remove_file_durably(path: &Path) -> Result<(), ClientError> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(parent_of(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(path, e)),
    }
}

/// The directory holding `path` (`.` for a bare name).
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_atomically_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.json");
        write_file_durably(&path, b"one").unwrap();
        write_file_durably(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        remove_file_durably(&path).unwrap();
        remove_file_durably(&path).unwrap();
        assert!(!path.exists());
    }
}
