//! The Spark engine: an event-sourced engine on an append-only file log,
//! with a small HTTP API in front.
//!
//! Every write becomes a checksummed op appended to a segment file (see the
//! `spark-log-format` crate); the in-memory mirror and request index are
//! rebuilt by replaying the segments at startup, with the one fold
//! (`spark_core::mirror::Mirror::apply`) that the live write path and the
//! offline `spark-replay` tools also use.
//!
//! # Layout
//!
//! From `spark-core` (re-exported here, so paths like
//! `spark_core::mirror` keep working): [`ids`] (ULIDs, request ids and
//! derived ids), [`op`] and [`codec`], [`mirror`] (the state and the one
//! fold), [`request_index`], [`replay`], [`layout`], [`damage`], [`synth`],
//! [`time`]; the rules live in `spark_core::rules`.
//!
//! - [`engine`]: the sequencer (it asks `spark_core::rules`), the journal
//!   (group commit) and the published mirror.
//! - [`media`]: the content-addressed blob store under `<data>/media/`.
//! - [`brain`]: the reading models (seats, adapters) and [`turns`], which asks
//!   them once per turn in the background.
//! - [`api`]: the warp routes, problem+json errors, body limits.
//! - [`archive`]: the shipper to S3-compatible object storage (SPEC
//!   section 11, `archive/ARCHIVE.md`), on only with `[archive]`.
//! - [`replica`]: `spark-engine replica`, a read replica that follows an
//!   archive (SPEC section 11); writes answer `421 read_only`.
//! - [`history`]: committed ops read back from the log with their event
//!   cursors (`/api/events` and the replica).
//! - [`server`]: start, serve and shut down.
//! - [`config`]: settings with units in their names; [`clock`].

#![warn(missing_docs)]

pub mod api;
pub mod archive;
pub mod brain;
pub mod clock;
pub mod config;
pub mod disk;
pub mod engine;
pub mod failpoints;
pub mod history;
pub mod media;
pub mod metrics;
pub mod replica;
pub mod retention;
pub mod server;
pub mod turns;

pub use config::Settings;
pub use engine::{Engine, EngineError, Outcome};
pub use spark_core::ids::Id;
pub use spark_core::mirror::Mirror;
pub use spark_core::op::{Op, OpBody, OpKind};
