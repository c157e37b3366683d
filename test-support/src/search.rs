//! Searching bytes for planted markers: what the erasure tests (SPEC
//! section 13) use to prove that no byte of a deleted moment is left in a
//! data directory or an archive object.

use std::path::{Path, PathBuf};

/// Every file under `dir`, recursively (panics on an unreadable directory).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// Whether `needle` occurs in `bytes`.
pub fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Where `marker`'s bytes occur under `dir`: `path:offset` for each
/// occurrence, in no particular order (a file that vanished while read
/// counts as empty).
pub fn occurrences(dir: &Path, marker: &str) -> Vec<String> {
    let needle = marker.as_bytes();
    let mut found = Vec::new();
    for path in files_under(dir) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        for (at, window) in bytes.windows(needle.len()).enumerate() {
            if window == needle {
                found.push(format!("{}:{at}", path.display()));
            }
        }
    }
    found
}
