//! The phone's outbox client ([`Client`]): an outbox, a transport and a
//! clock, with the options its drain runs by. What it does lives with the
//! resource: the drain in [`crate::drain`], messages in
//! [`crate::messages`], the request of each step in `requests`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use spark_core::ids::Id;
use spark_core::time::format_rfc3339_ms;

use crate::answers::WaitCause;
use crate::clock::ClientClock;
use crate::outbox::{Capture, Entry, EntryState, Outbox};
use crate::transport::Transport;
use crate::ClientError;

/// How a drain waits and when it stops.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// The first backoff step; doubled after each wait in a row.
    pub backoff_base: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
    /// The longest `Retry-After` honoured (a longer one is cut to this).
    pub retry_after_max: Duration,
    /// Stop (leaving entries pending) rather than start a wait that would
    /// end later than this after the drain began. `None`: keep going until
    /// nothing is pending.
    pub give_up_after: Option<Duration>,
    /// Stop after this many passes. `None`: no limit.
    pub max_passes: Option<u32>,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            retry_after_max: Duration::from_secs(3600),
            give_up_after: None,
            max_passes: None,
        }
    }
}

/// One wait a drain made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitRecord {
    /// Why.
    pub cause: WaitCause,
    /// How long (zero when the drain gave up instead of waiting).
    pub delay: Duration,
}

/// Told of every wait a drain starts, before it sleeps.
pub type WaitHook = Arc<dyn Fn(&WaitRecord) + Send + Sync>;

/// The phone's outbox client: an outbox, a transport and a clock.
#[derive(Clone)]
pub struct Client {
    pub(crate) outbox: Outbox,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) clock: Arc<dyn ClientClock>,
    pub(crate) options: DrainOptions,
    pub(crate) on_wait: Option<WaitHook>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("outbox", &self.outbox)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client over `outbox`, sending with `transport`, reading `clock`,
    /// with the default [`DrainOptions`].
    pub fn new(outbox: Outbox, transport: Arc<dyn Transport>, clock: Arc<dyn ClientClock>) -> Self {
        Client {
            outbox,
            transport,
            clock,
            options: DrainOptions::default(),
            on_wait: None,
        }
    }

    /// The same client, calling `hook` with every wait a drain starts
    /// (its cause, with the server's reason, and its length), so a person
    /// watching is told while it waits.
    pub fn on_wait(mut self, hook: impl Fn(&WaitRecord) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(Arc::new(hook));
        self
    }

    /// The same client with these drain options.
    pub fn with_options(mut self, options: DrainOptions) -> Self {
        self.options = options;
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The client clock.
    pub fn clock(&self) -> &dyn ClientClock {
        self.clock.as_ref()
    }

    /// Stores a capture durably (see [`Outbox::capture`]); the returned
    /// entry's `moment_id` is final.
    pub fn capture(&self, capture: Capture) -> Result<Entry, ClientError> {
        self.outbox.capture(self.clock.as_ref(), capture)
    }

    /// Whether `moment_id` belongs to an entry not yet done (pending or
    /// parked): the server does not know that moment yet.
    pub(crate) fn moment_in_outbox(&self, moment_id: Id) -> Result<bool, ClientError> {
        Ok(self
            .outbox
            .scan()?
            .entries
            .iter()
            .any(|e| e.moment_id == moment_id && e.state() != EntryState::Done))
    }

    pub(crate) fn now_rfc3339(&self) -> String {
        format_rfc3339_ms(i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX))
    }
}
