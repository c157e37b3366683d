//! `spark-client`: the phone's outbox as a Rust client (SPEC section 6,
//! DESIGN.md "Client"), with its command-line program (`spark-client
//! capture`, `drain`, `send-message`, `outbox`).
//!
//! It depends on `spark-core` for ids and for the wire shapes it shares
//! with the server ([`spark_core::wire`]), never on the server itself: no
//! warp, no hyper server, no metrics, no allocator of the server's.
//!
//! A capture mints every id the send needs before touching the network and
//! is durable in the [`Outbox`] when [`Outbox::capture`] returns. A
//! [`Client`] drains the outbox over a [`Transport`]: create the moment,
//! upload the copy, start the practical turn, upload the original, each
//! step marked done durably and skipped on a retry, with the answer rules
//! in [`answers`]. Messages follow ADR-036 ([`messages`]). [`events`] follows
//! the change stream. The clock
//! ([`ClientClock`]) and the transport are traits, so tests can skew the
//! phone's clock and lose replies.
//!
//! ```no_run
//! # async fn run() -> Result<(), spark_client::ClientError> {
//! use std::sync::Arc;
//! use spark_client::{image, Capture, Client, Outbox, ReqwestTransport, SystemClientClock};
//!
//! let photo = std::fs::read("sign.jpg")?;
//! let client = Client::new(
//!     Outbox::open("./spark-outbox")?,
//!     Arc::new(ReqwestTransport::new("http://127.0.0.1:8080")?),
//!     Arc::new(SystemClientClock),
//! );
//! let entry = client.capture(Capture {
//!     copy: image::make_copy(&photo)?,
//!     original: spark_client::MediaBytes {
//!         content_type: image::content_type_of(&photo),
//!         bytes: photo,
//!     },
//!     more_photos: Vec::new(), // photos 1, 2, ... of the same moment
//!     text: Some("Ausfahrt freihalten".into()),
//!     caption: None,
//!     lang: Some("de".into()),
//!     captured_at_ms: None,
//! })?;
//! println!("moment {}", entry.moment_id); // final already
//! let report = client.drain().await?;
//! assert_eq!(report.pending_entries, 0);
//! # Ok(()) }
//! ```

pub mod answers;
pub mod client;
pub mod clock;
pub mod drain;
pub mod events;
mod fsio;
pub mod image;
pub mod messages;
pub mod outbox;
mod requests;
pub mod transport;

use std::path::PathBuf;

pub use client::{Client, DrainOptions, WaitHook, WaitRecord};
pub use clock::{ClientClock, ManualClock, SkewedClientClock, SystemClientClock};
pub use drain::{DrainReport, StatusClass, WaitCause};
pub use messages::{MessageAttempt, MessageError, MessageOutcome, MessageRecord, MessageState};
pub use outbox::{
    Capture, Entry, EntryPhoto, EntryState, MediaBytes, MediaFile, Outbox, Parked, PhotoBytes, Step,
};
pub use transport::{
    HttpRequest, HttpResponse, Method, ReqwestTransport, Transport, TransportError,
};

/// What the client itself can fail at (answers from the server are not
/// errors: they park, wait or fail entries and messages).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Reading or writing the outbox failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A record in the outbox could not be read.
    #[error("{path}: damaged outbox record: {detail}")]
    Corrupt {
        /// The record.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The photo could not be decoded or the copy encoded.
    #[error("image: {0}")]
    Image(String),
    /// Invalid input from the caller.
    #[error("{0}")]
    Invalid(String),
    /// The transport could not be set up.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl From<std::io::Error> for ClientError {
    fn from(source: std::io::Error) -> Self {
        ClientError::Io {
            path: PathBuf::new(),
            source,
        }
    }
}
