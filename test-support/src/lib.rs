//! What the integration tests and benches of `spark-engine` and
//! `spark-replay-tools` share: the server in this process or as the real
//! binary over a temporary data directory ([`server`]), a `weed mini` S3
//! store of a test's own ([`weed`]), the archive helpers on top of it
//! ([`s3`]), and the read replica's ([`replica`]). A dev-dependency only,
//! never one of the server's.
//!
//! The binaries (`spark-engine`, `spark-replay`) are found beside the
//! running test or bench executable ([`bin_path`]): cargo's
//! `CARGO_BIN_EXE_<name>` is set only while it builds a test of the
//! package that owns the binary, not this crate.

pub mod replica;
pub mod s3;
pub mod search;
pub mod server;
pub mod weed;

use std::path::PathBuf;

/// The path of the workspace binary `name` (`spark-engine`,
/// `spark-replay`) of the running test or bench: cargo puts test and bench
/// executables in `target/<profile>/deps/` and binaries in
/// `target/<profile>/`. Whether it exists is the caller's question (cargo
/// builds a package's own binaries for its tests; `cargo build --bin
/// spark-engine` builds the server for the tools' tests).
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe
        .parent()
        .expect("the test executable's directory")
        .to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}
