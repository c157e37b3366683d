//! Spark's domain core: everything that decides what the engine does, with
//! no I/O runtime and no HTTP (no tokio, no warp, no hyper).
//!
//! The server (`spark-engine`), the phone's client (`spark-client`) and the
//! offline tools (`spark-replay`) depend on this crate; it depends on none of
//! them (see README.md "Layout"), only on `spark-log-format`.
//!
//! - [`ids`]: ULIDs, request ids and every derived id with its cap (SPEC
//!   section 2).
//! - [`op`]: the typed, versioned ops the log carries; [`codec`] encodes
//!   them (bincode, pinned, behind that one module).
//! - [`mirror`]: the state and the one fold, with [`request_index`].
//! - [`replay`]: decode a record and fold it, as startup and the tools do.
//! - [`command`]: the write commands; [`rules`]: every product rule, one
//!   file per resource, deciding a command against the mirror; [`outcome`]
//!   and [`error`]: what a command produced or why it was refused (typed
//!   conflicts included).
//! - [`blob`]: where blobs live and the one check of a blob against its op.
//! - [`checkpoint`]: the mirror and request index at a seq in one file,
//!   so startup replays only the ops after it.
//! - [`layout`]: the paths inside a data directory.
//! - [`damage`]: what damaged records were about; [`synth`]: synthetic logs
//!   for measurement; [`time`]: RFC 3339 on the wire.
//! - [`wire`]: the HTTP shapes the server and the client share: bodies,
//!   header names, problem codes, the clock window (SPEC sections 4, 5, 6, 10).

#![warn(missing_docs)]

pub mod blob;
pub mod checkpoint;
pub mod codec;
pub mod command;
pub mod damage;
pub mod error;
pub mod ids;
pub mod layout;
mod len_prefixed;
pub mod mirror;
pub mod op;
pub mod outcome;
pub mod replay;
pub mod request_index;
pub mod rules;
pub mod synth;
pub mod time;
pub mod wire;
