//! `GET /api/events?after=SEQ`: the change stream, as server-sent events
//! (SPEC section 4).
//!
//! Each committed op is one event: `id: <cursor>` and the data
//! `{"seq", "kind", "upserted", "removed"}`. The cursor (`SEQ.CHAIN`,
//! [`EventCursor`]) is the op's seq with a prefix of the log's
//! chain value at the end of its batch, so it names one history of the
//! log: a client that comes back with `Last-Event-ID` (or `after`) from
//! another history that shares the seq (a restore and a take-over, a
//! failover to a replica of another archive) gets `409 cursor_unknown`
//! naming the head, never the ops after its seq in this history. A bare
//! seq above 0 in `Last-Event-ID` cannot be checked and is refused the same
//! way; a bare `?after=SEQ` (SPEC section 4) names a seq of this server's
//! log as it is now and is served from there; `0` is the start of every
//! history. The stream first catches up from the log on
//! disk, then follows live commits. A subscriber that falls behind the live buffer
//! (`log.change_buffer_batches`) gets an `overflow` event naming the seq to
//! resume after, and the stream ends; the writer never waits for anyone.
//!
//! Memory under a slow reader is bounded per subscriber: the
//! events queued between the log or the live feed and the socket hold at
//! most [`SUBSCRIBER_BUFFER_BYTES`] (and [`SUBSCRIBER_BUFFER_EVENTS`]); the
//! catch-up and the live follower wait for room, so a reader at 1 KB/s
//! holds one budget, not the log. Beyond it only hyper's bounded write
//! buffer and the kernel's socket buffers hold bytes; the live buffer is
//! shared by all subscribers and bounded by `log.change_buffer_batches`.
//! `spark_event_subscribers` and `spark_event_buffered_bytes` (`/metrics`)
//! count the open streams and the bytes they have queued.

use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
use warp::reply::{Reply, Response};
use warp::sse::Event;

use spark_core::wire::events::{EventCursor, Overflow, EVENT_ERROR, EVENT_OVERFLOW};
use spark_core::wire::problem as wire;

use crate::engine::Change;

use super::{session, ApiError, AppState, Request};

/// Events queued per subscriber between the log or the live feed and the
/// socket, at most.
pub const SUBSCRIBER_BUFFER_EVENTS: usize = 1024;

/// Bytes of events (their SSE text) queued per subscriber, at most: the
/// catch-up and the live follower wait for room. An event larger than this
/// takes the whole budget.
pub const SUBSCRIBER_BUFFER_BYTES: usize = 32 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    after: Option<String>,
}

/// One queued event and the bytes of the budget it holds until the stream
/// hands it to hyper.
struct Queued {
    event: Event,
    _held: Held,
}

/// Bytes of a subscriber's budget held by one queued event; given back
/// (and taken off `spark_event_buffered_bytes`) when dropped.
struct Held {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Cast: at most SUBSCRIBER_BUFFER_BYTES.
        crate::metrics::get()
            .event_buffered_bytes
            .dec_by(self.bytes as i64);
    }
}

/// The subscriber gone (its stream dropped).
struct Gone;

/// The sending side of one subscriber: a bounded queue with a byte budget.
#[derive(Clone)]
struct Subscriber {
    tx: mpsc::Sender<Queued>,
    budget: Arc<Semaphore>,
    /// True once the server stops: a sender waiting for room gives up, so
    /// a slow reader of the catch-up holds the stop for what is queued, not
    /// for the rest of the log.
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Subscriber {
    /// Queues `event` of `bytes` once the budget has room; `Gone` when the
    /// subscriber left or the server stops (also while waiting for room).
    async fn send(&self, event: Event, bytes: usize) -> Result<(), Gone> {
        let bytes = bytes.clamp(1, SUBSCRIBER_BUFFER_BYTES);
        // Cast: at most SUBSCRIBER_BUFFER_BYTES.
        let wanted = Arc::clone(&self.budget).acquire_many_owned(bytes as u32);
        let mut stopping = self.stopping.clone();
        let permit = tokio::select! {
            permit = wanted => permit.map_err(|_| Gone)?,
            _ = self.tx.closed() => return Err(Gone),
            _ = stopping.wait_for(|stop| *stop) => return Err(Gone),
        };
        crate::metrics::get()
            .event_buffered_bytes
            .inc_by(bytes as i64);
        let held = Held {
            _permit: permit,
            bytes,
        };
        self.tx
            .send(Queued { event, _held: held })
            .await
            .map_err(|_| Gone)
    }

    async fn send_change(&self, change: &Change) -> Result<(), Gone> {
        let (event, bytes) = event(change);
        self.send(event, bytes).await
    }

    /// Whether the subscriber left.
    async fn closed(&self) {
        self.tx.closed().await
    }
}

/// The budgets of the open subscribers, to report what each holds.
static OPEN: parking_lot::Mutex<Vec<Weak<Semaphore>>> = parking_lot::Mutex::new(Vec::new());

/// Bytes each open subscriber of this process has queued now (one entry
/// per open stream, in no particular order); each is at most
/// [`SUBSCRIBER_BUFFER_BYTES`].
pub fn queued_bytes_per_subscriber() -> Vec<usize> {
    OPEN.lock()
        .iter()
        .filter_map(Weak::upgrade)
        .map(|budget| SUBSCRIBER_BUFFER_BYTES - budget.available_permits())
        .collect()
}

/// A new subscriber (`stopping` becomes true when the server stops): its
/// sending side and its stream.
fn subscriber(stopping: tokio::sync::watch::Receiver<bool>) -> (Subscriber, Events) {
    let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER_EVENTS);
    let budget = Arc::new(Semaphore::new(SUBSCRIBER_BUFFER_BYTES));
    let mut open = OPEN.lock();
    open.retain(|b| b.strong_count() > 0);
    open.push(Arc::downgrade(&budget));
    crate::metrics::get().event_subscribers.inc();
    let sender = Subscriber {
        tx,
        budget,
        stopping,
    };
    (sender, Events(rx, None, None))
}

/// The events of one subscriber, as a stream for warp's SSE reply; holds
/// its permit of `limits.event_streams_max` while open,, for a stream opened with a session cookie, ends when the session
/// ends (the watcher's signal, [`end_with_session`]).
struct Events(
    mpsc::Receiver<Queued>,
    Option<OwnedSemaphorePermit>,
    Option<tokio::sync::oneshot::Receiver<()>>,
);

impl Drop for Events {
    fn drop(&mut self) {
        crate::metrics::get().event_subscribers.dec();
    }
}

impl Stream for Events {
    type Item = Result<Event, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(ended) = self.2.as_mut() {
            // Fired or dropped: the session ended (or its watcher is gone).
            if std::future::Future::poll(Pin::new(ended), cx).is_ready() {
                // Once: the stream ends here, and what is queued is dropped.
                self.2 = None;
                self.0.close();
                while self.0.try_recv().is_ok() {}
                return Poll::Ready(None);
            }
        }
        // The budget the event held is given back here: hyper has it now.
        self.0.poll_recv(cx).map(|q| q.map(|q| Ok(q.event)))
    }
}

/// A change's event (its cursor as the `id:`, its notice as the data) and
/// the bytes of its SSE text (`id:`, `data:`, the line ends and the blank
/// line).
fn event(change: &Change) -> (Event, usize) {
    let id = change.cursor.to_string();
    match serde_json::to_string(&change.notice) {
        Ok(data) => {
            let bytes = "id:\ndata:\n\n".len() + id.len() + data.len();
            (Event::default().id(id).data(data), bytes)
        }
        Err(_) => (Event::default().comment("unencodable notice"), 32),
    }
}

/// `GET /api/events`.
pub async fn stream(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let query: Query = req.query()?;
    // Streams have their own cap, below the connections': open streams
    // never take the connections health checks need.
    let permit = Arc::clone(&state.event_streams)
        .try_acquire_owned()
        .map_err(|_| streams_full(state.settings.limits.event_streams_cap()))?;
    let parse = |what: &str, text: &str| {
        EventCursor::parse(text).ok_or_else(|| {
            ApiError::invalid_request(format!(
                "{what} {text:?} is not an event cursor (SEQ.CHAIN, as an event's id, or 0)"
            ))
        })
    };
    // Last-Event-ID (a reconnecting EventSource) wins over `after`. Only
    // `after` may be a bare seq (SPEC section 4, `?after={seq}`): a caller
    // that names a seq of this server's log as it is now, not a point of a
    // history it followed. This server only ever hands out `SEQ.CHAIN` ids,
    // so a bare Last-Event-ID is a resumption that cannot be checked.
    let (after, bare_allowed) = match req.header("last-event-id")? {
        Some(id) => (parse("Last-Event-ID", id)?, false),
        None => (
            query
                .after
                .as_deref()
                .map(|a| parse("after", a))
                .transpose()?
                .unwrap_or(EventCursor::START),
            true,
        ),
    };
    // Subscribe before reading the committed seq: every op after it comes
    // live, every op up to it comes from the log.
    let live = state.engine.subscribe_changes();
    let head = state.engine.head();
    let committed = head.seq;
    let head_cursor = EventCursor::at(head.seq, &head.chain);
    if after.seq > committed {
        return Err(cursor_ahead(after.seq, head_cursor));
    }
    let log_dir = state.settings.log_dir();
    let max_record_bytes = state.settings.log.max_record_bytes;
    if !(bare_allowed && after.chain.is_none()) {
        check_history(&log_dir, max_record_bytes, after, &head.chain, head_cursor).await?;
    }
    let (tx, mut events) = subscriber(state.shutdown.clone());
    events.1 = Some(permit);
    if let Some(secret) = session::authenticating_secret(&state, &req.headers) {
        events.2 = Some(end_with_session(&state, secret.to_owned()));
    }
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let mut last = after;
        if after.seq < committed {
            let catch_up = tx.clone();
            let runtime = tokio::runtime::Handle::current();
            let read = tokio::task::spawn_blocking(move || {
                catch_up_from_log(
                    &log_dir,
                    max_record_bytes,
                    after,
                    committed,
                    &catch_up,
                    &runtime,
                )
            })
            .await;
            match read {
                Ok(Ok(sent)) => last = sent,
                Ok(Err(e)) => {
                    let bytes = e.len() + 32;
                    let _ = tx
                        .send(Event::default().event(EVENT_ERROR).data(e), bytes)
                        .await;
                    return;
                }
                Err(_) => return,
            }
        }
        follow(live, last, &tx, &mut shutdown).await;
    });
    Ok(warp::sse::reply(warp::sse::keep_alive().stream(events)).into_response())
}

/// A signal that fires when the session of `secret` ends (`DELETE
/// /api/session`, its expiry, its token gone: [`session::Sessions::ended`]),
/// so a stream opened with its cookie ends with it; the
/// watcher stops when the stream is dropped first.
fn end_with_session(state: &AppState, secret: String) -> tokio::sync::oneshot::Receiver<()> {
    let (mut fire, ended) = tokio::sync::oneshot::channel();
    let sessions = Arc::clone(&state.sessions);
    let token_hashes: Vec<String> = state
        .settings
        .access
        .tokens
        .iter()
        .map(|t| t.sha256.clone())
        .collect();
    tokio::spawn(async move {
        tokio::select! {
            () = sessions.ended(&secret, &token_hashes) => {
                let _ = fire.send(());
            }
            () = fire.closed() => {}
        }
    });
    ended
}

/// `503 unavailable` with `Retry-After` and `Connection: close`: `cap`
/// streams are open.
fn streams_full(cap: usize) -> ApiError {
    let mut error = ApiError::new(
        warp::http::StatusCode::SERVICE_UNAVAILABLE,
        wire::UNAVAILABLE,
        format!(
            "{cap} event streams are open, the most this server keeps \
             (limits.event_streams_max); try again later"
        ),
    );
    error.retry_after_s = Some(5);
    // Closed, not kept alive: a client that holds the refused connection
    // would keep a place of `limits.connections_max` with nothing on it,
    // the places the stream cap leaves to the health routes.
    error.closing()
}

/// Checks that `after` names a point of this log's history (its chain
/// value is the log's at the end of the batch that holds its seq, which is
/// at most the head): `409 cursor_unknown` when it does not, when it is a
/// bare seq above 0 (nothing in it to check), or when the log cannot show
/// that op (the reason is named). `head_chain` is the head's chain value:
/// a cursor at the head is checked against it without reading the log.
async fn check_history(
    log_dir: &std::path::Path,
    max_record_bytes: u32,
    after: EventCursor,
    head_chain: &[u8; 32],
    head_cursor: EventCursor,
) -> Result<(), ApiError> {
    if after.seq == 0 {
        return Ok(());
    }
    if after.chain.is_none() {
        return Err(cursor_unknown(
            after,
            head_cursor,
            "a bare seq names no history, and this server's log may hold other ops under it \
             (a restore and a take-over, a failover); give the id of the last event seen \
             (SEQ.CHAIN)",
        ));
    }
    if after.seq == head_cursor.seq && after.matches(head_chain) {
        return Ok(());
    }
    let dir = log_dir.to_owned();
    let seq = after.seq;
    let found =
        tokio::task::spawn_blocking(move || crate::history::cursor_of(&dir, seq, max_record_bytes))
            .await
            .unwrap_or_else(|e| Err(format!("the check stopped: {e}")));
    match found {
        Ok(cursor) if cursor == after => Ok(()),
        Ok(cursor) => Err(cursor_unknown(
            after,
            head_cursor,
            &format!(
                "this server's log holds {cursor} at seq {seq}: another history than the \
                 client followed (restored and taken over, or another server's log)"
            ),
        )),
        Err(e) => Err(cursor_unknown(
            after,
            head_cursor,
            &format!("this server's log cannot show seq {seq} to check it ({e})"),
        )),
    }
}

/// The members of `cursor_ahead` and `cursor_unknown`, added to `error`.
fn with_cursor_members(mut error: ApiError, after: u64, head_cursor: EventCursor) -> ApiError {
    let members = wire::CursorAheadMembers {
        after,
        head_seq: head_cursor.seq,
        head_cursor: head_cursor.to_string(),
    };
    if let Ok(serde_json::Value::Object(members)) = serde_json::to_value(members) {
        error.extra.extend(members);
    }
    error
}

/// `409 cursor_unknown`: `after` is not known to be a point of this log's
/// history, for the reason `why`; the client resynchronises and follows
/// after `head_cursor`.
fn cursor_unknown(after: EventCursor, head_cursor: EventCursor, why: &str) -> ApiError {
    let error = ApiError::new(
        warp::http::StatusCode::CONFLICT,
        wire::CURSOR_UNKNOWN,
        format!(
            "the cursor {after} is not a point of this server's history: {why}; resynchronise \
             (refetch what you derived from the stream) and follow after {head_cursor}"
        ),
    );
    with_cursor_members(error, after.seq, head_cursor)
}

/// `409 cursor_ahead`: a cursor beyond the head would otherwise wait in
/// silence for seqs that, after a restore from an archive that was behind,
/// name other ops than the client saw.
fn cursor_ahead(after: u64, head_cursor: EventCursor) -> ApiError {
    let head_seq = head_cursor.seq;
    let error = ApiError::new(
        warp::http::StatusCode::CONFLICT,
        wire::CURSOR_AHEAD,
        format!(
            "the cursor {after} is beyond the log's head {head_seq}: this server's log ends \
             before what you saw (restored from an archive that was behind?); resynchronise \
             and follow after {head_cursor}"
        ),
    );
    with_cursor_members(error, after, head_cursor)
}

/// Sends the changes of the ops in `(after, upto]` from the log on disk
/// ([`crate::history::committed_ops`]: the journal may be appending);
/// returns the cursor of the last one sent. Runs on a blocking thread and
/// waits (on `runtime`) for room in the subscriber's budget: a slow reader
/// slows the scan, nothing piles up.
fn catch_up_from_log(
    log_dir: &std::path::Path,
    max_record_bytes: u32,
    after: EventCursor,
    upto: u64,
    tx: &Subscriber,
    runtime: &tokio::runtime::Handle,
) -> Result<EventCursor, String> {
    let mut last = after;
    crate::history::committed_ops(log_dir, after.seq, upto, max_record_bytes, |op, cursor| {
        let change = Change {
            notice: crate::engine::ChangeNotice::of(&op),
            cursor,
        };
        if runtime.block_on(tx.send_change(&change)).is_err() {
            return ControlFlow::Break(());
        }
        last = cursor;
        ControlFlow::Continue(())
    })?;
    Ok(last)
}

/// Forwards live notices after `last` until the subscriber leaves, falls
/// behind (an `overflow` event says where to resume), or the server stops.
async fn follow(
    mut live: broadcast::Receiver<Arc<Vec<Change>>>,
    mut last: EventCursor,
    tx: &Subscriber,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let batch = tokio::select! {
            batch = live.recv() => batch,
            _ = shutdown.changed() => return,
            _ = tx.closed() => return,
        };
        match batch {
            Ok(notices) => {
                for change in notices.iter() {
                    if change.notice.seq <= last.seq {
                        continue;
                    }
                    if tx.send_change(change).await.is_err() {
                        return;
                    }
                    last = change.cursor;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let resume = serde_json::to_string(&Overflow {
                    resume_after: last.seq,
                    resume_cursor: last.to_string(),
                })
                .unwrap_or_default();
                let bytes = resume.len() + 32;
                let overflow = Event::default().event(EVENT_OVERFLOW).data(resume);
                let _ = tx.send(overflow, bytes).await;
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::ChangeNotice;

    fn change(notice: ChangeNotice) -> Change {
        Change {
            cursor: EventCursor::at(notice.seq, &[7; 32]),
            notice,
        }
    }

    fn notice(seq: u64) -> Change {
        change(ChangeNotice {
            seq,
            kind: "moment.create".into(),
            upserted: vec![format!("m{seq}")],
            removed: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_where_to_resume() {
        let (writer, live) = broadcast::channel(2);
        let (_closing, mut shutdown) = tokio::sync::watch::channel(false);
        let (tx, mut rx) = subscriber(shutdown.clone());
        // The writer commits five batches while the subscriber is away; it
        // never waits (send on a broadcast does not block).
        for seq in 1..=5 {
            writer.send(Arc::new(vec![notice(seq)])).unwrap();
        }
        drop(writer);
        follow(live, EventCursor::START, &tx, &mut shutdown).await;
        drop(tx);
        let mut events = Vec::new();
        while let Some(q) = rx.0.recv().await {
            events.push(format!("{:?}", q.event));
        }
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].contains("overflow") && events[0].contains("resume_after"),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn live_notices_after_the_last_sent_are_forwarded_once() {
        let (writer, live) = broadcast::channel(8);
        let (_closing, mut shutdown) = tokio::sync::watch::channel(false);
        let (tx, mut rx) = subscriber(shutdown.clone());
        writer.send(Arc::new(vec![notice(3), notice(4)])).unwrap();
        writer.send(Arc::new(vec![notice(5)])).unwrap();
        drop(writer);
        // Seqs up to 3 were already sent from the log.
        follow(live, EventCursor::at(3, &[7; 32]), &tx, &mut shutdown).await;
        drop(tx);
        let mut ids = Vec::new();
        while let Some(q) = rx.0.recv().await {
            ids.push(format!("{:?}", q.event));
        }
        assert_eq!(ids.len(), 2);
        assert!(ids[0].contains("\"4\"") || ids[0].contains("id: 4") || ids[0].contains('4'));
    }

    #[tokio::test]
    async fn a_subscriber_queues_at_most_its_byte_budget_and_waits_for_room() {
        let (closing, stopping) = tokio::sync::watch::channel(false);
        let (tx, mut rx) = subscriber(stopping);
        let budget = Arc::clone(&tx.budget);
        let queued = || SUBSCRIBER_BUFFER_BYTES - budget.available_permits();
        let big = |seq: u64| {
            change(ChangeNotice {
                seq,
                kind: "moment.create".into(),
                upserted: vec!["x".repeat(1000)],
                removed: Vec::new(),
            })
        };
        let (_, largest) = event(&big(1000));
        let sender = tokio::spawn(async move {
            for seq in 1..=1000 {
                if tx.send_change(&big(seq)).await.is_err() {
                    return seq;
                }
            }
            0
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // The sender waits for room: what is queued is within the budget,
        // and the budget is full (no room for one more event).
        let full = |queued: usize| {
            queued <= SUBSCRIBER_BUFFER_BYTES && queued + largest > SUBSCRIBER_BUFFER_BYTES
        };
        assert!(!sender.is_finished());
        assert!(full(queued()), "{}", queued());
        assert!(queued_bytes_per_subscriber().contains(&queued()));
        // Reading events makes room for as many more, no more.
        for _ in 0..10 {
            drop(rx.0.recv().await.unwrap());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(full(queued()), "{}", queued());
        assert!(!sender.is_finished());
        // A subscriber that leaves ends the wait and gives the budget back.
        drop(rx);
        let stopped_at = sender.await.unwrap();
        assert!(stopped_at > 10 && stopped_at < 100, "{stopped_at}");
        assert_eq!(queued(), 0);
        drop(closing);
    }

    #[tokio::test]
    async fn a_sender_waiting_for_room_gives_up_when_the_server_stops() {
        let (closing, stopping) = tokio::sync::watch::channel(false);
        let (tx, rx) = subscriber(stopping);
        let filler = "x".repeat(SUBSCRIBER_BUFFER_BYTES);
        tx.send(Event::default().data(filler.clone()), filler.len())
            .await
            .unwrap_or_else(|_| panic!("the first event fits"));
        let waiting = tokio::spawn(async move { tx.send(Event::default(), 1).await.is_err() });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        closing.send_replace(true);
        assert!(waiting.await.unwrap());
        drop(rx);
    }
}
