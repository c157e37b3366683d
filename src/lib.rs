//! The Spark engine: an event-sourced engine on an append-only file log,
//! with a small HTTP API in front.
//!
//! Every write becomes a checksummed op appended to a segment file (see the
//! `spark-log-format` crate); the in-memory mirror and request index are
//! rebuilt by replaying the segments at startup, with the one fold
//! ([`mirror::Mirror::apply`]) that the live write path and the offline
//! `spark-replay` tools also use.
//!
//! # Layout
//!
//! - [`ids`]: ULIDs and request ids (SPEC section 2).
//! - [`op`]: the typed, versioned ops the log carries; [`codec`] encodes them.
//! - [`mirror`]: the state and the one fold, including the request index.
//! - [`engine`]: the sequencer, the journal (group commit) and the published
//!   mirror.
//! - [`media`]: the content-addressed blob store under `<data>/media/`.
//! - [`brain`]: the reading models (seats, adapters) and [`turns`], which asks
//!   them once per turn in the background.
//! - [`api`]: the warp routes, problem+json errors, body limits.
//! - [`server`]: start, serve and shut down.
//! - [`config`]: settings with units in their names; [`clock`], [`time`].
//! - [`client`]: the phone's outbox (capture, drain, messages) as a Rust
//!   client, used by the `spark-engine capture`/`drain` commands.

#![warn(missing_docs)]

pub mod api;
pub mod brain;
pub mod client;
pub mod clock;
pub mod codec;
pub mod config;
pub mod damage;
pub mod engine;
pub mod failpoints;
pub mod ids;
mod len_prefixed;
pub mod media;
pub mod metrics;
pub mod mirror;
pub mod op;
pub mod request_index;
pub mod server;
pub mod synth;
pub mod time;
pub mod turns;

pub use config::Settings;
pub use engine::{Engine, EngineError, Outcome};
pub use ids::Id;
pub use mirror::Mirror;
pub use op::{Op, OpBody, OpKind};
