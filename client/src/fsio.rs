//! Durable file writes for the outbox, through the workspace's file seam
//! ([`Fs`] of `spark-log-format`, [`OsFs`] here): a whole file is written
//! by [`Fs::write_file_durably`] (temporary file, fsync, rename, directory
//! fsync), so a reader sees the old bytes or the new ones, never a torn mix,
//! and what a call wrote survives a crash once it returns.

use std::path::Path;

use spark_log_format::{Fs, OsFs};

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
    OsFs.sync_dir(dir).map_err(|e| io_error(dir, e))
}

/// Creates `dir` (and its parents) and makes its name durable.
pub(crate) fn create_dir_durably(dir: &Path) -> Result<(), ClientError> {
    if dir.is_dir() {
        return Ok(());
    }
    OsFs.create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path` and fsyncs it (not its
/// directory: the caller syncs the directory once for several files, in a
/// capture's temporary directory that is renamed into place whole).
pub(crate) fn write_new_file_synced(path: &Path, bytes: &[u8]) -> Result<(), ClientError> {
    let mut file = OsFs.create_new(path).map_err(|e| io_error(path, e))?;
    file.write_all_at(0, bytes).map_err(|e| io_error(path, e))?;
    file.sync_all().map_err(|e| io_error(path, e))
}

/// Replaces (or creates) the file at `path` with `bytes` atomically and
/// durably ([`Fs::write_file_durably`]: temporary file `<name>.tmp`, fsync,
/// rename over, directory fsync). Listings of the outbox skip the
/// temporary file a crash may leave (not `.json`, or a file in an entry's
/// directory); the next write of the same file removes it.
pub(crate) fn write_file_durably(path: &Path, bytes: &[u8]) -> Result<(), ClientError> {
    OsFs.write_file_durably(path, bytes)
        .map_err(|e| io_error(path, e))
}

/// Removes the file at `path` durably (directory fsync). A file already
/// gone is not an error.
pub(crate) fn remove_file_durably(path: &Path) -> Result<(), ClientError> {
    match OsFs.remove_file(path) {
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
    use std::fs;

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
