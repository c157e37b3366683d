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
