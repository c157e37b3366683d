//! The paths inside a data directory (DESIGN.md, "Files"): the server, the
//! offline tools and the tests name them through these functions only.

use std::path::{Path, PathBuf};

/// `<data_dir>/log`, where the segments live.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// `<data_dir>/media`, where the blobs live (`blobs/<sha256 hex>` and
/// `tmp/` for uploads in progress).
pub fn media_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("media")
}

/// `<data_dir>/restored-at`: written by `spark-replay restore --at` when
/// the cut left out ops the archive holds, JSON `{"url": "s3://…", "seq":
/// N, "archived_seq": M}` (the restored log ends at seq N; the archive held
/// up to M). `spark-engine serve --take-over` refuses a directory that has
/// it: a take-over brings the local log to the archive's end, which would
/// fetch the ops the cut left out back (archive/ARCHIVE.md "Epoch").
pub fn restored_at_file(data_dir: &Path) -> PathBuf {
    data_dir.join("restored-at")
}
