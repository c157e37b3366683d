//! `GET /api/events?after=SEQ`: the change stream, as server-sent events
//! (SPEC section 4).
//!
//! Each committed op is one event: `id: <seq>` and the data
//! `{"seq", "kind", "upserted", "removed"}`. The stream first catches up
//! from the log on disk (ops after `after`, or after `Last-Event-ID`), then
//! follows live commits. A subscriber that falls behind the live buffer
//! (`log.change_buffer_batches`) gets an `overflow` event naming the seq to
//! resume after, and the stream ends; the writer never waits for anyone.

use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use serde::Deserialize;
use spark_log_format::{LogReader, ScanOptions};
use tokio::sync::{broadcast, mpsc};
use warp::http::Method;
use warp::reply::{Reply, Response};
use warp::sse::Event;

use crate::engine::ChangeNotice;
use crate::op::Op;

use super::{ApiError, AppState, Request};

/// Events buffered per subscriber between the log or the live feed and the
/// socket.
const SUBSCRIBER_BUFFER_EVENTS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    after: Option<String>,
}

/// The events of one subscriber, as a stream for warp's SSE reply.
struct Events(mpsc::Receiver<Event>);

impl Stream for Events {
    type Item = Result<Event, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|e| e.map(Ok))
    }
}

fn event(notice: &ChangeNotice) -> Event {
    Event::default()
        .id(notice.seq.to_string())
        .json_data(notice)
        .unwrap_or_else(|_| Event::default().comment("unencodable notice"))
}

/// `GET /api/events`.
pub async fn stream(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET {
        return Err(ApiError::method_not_allowed("GET"));
    }
    let query: Query = req.query()?;
    let parse = |what: &str, text: &str| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| ApiError::invalid_request(format!("{what} {text:?} is not a seq")))
    };
    // Last-Event-ID (a reconnecting EventSource) wins over `after`.
    let after = match req.header("last-event-id")? {
        Some(id) => parse("Last-Event-ID", id)?,
        None => query
            .after
            .as_deref()
            .map(|a| parse("after", a))
            .transpose()?
            .unwrap_or(0),
    };
    // Subscribe before reading the committed seq: every op after it comes
    // live, every op up to it comes from the log.
    let live = state.engine.subscribe_changes();
    let committed = state.engine.head().seq;
    let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER_EVENTS);
    let log_dir = state.settings.log_dir();
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let mut last = after;
        if after < committed {
            let catch_up = tx.clone();
            let read = tokio::task::spawn_blocking(move || {
                catch_up_from_log(&log_dir, after, committed, &catch_up)
            })
            .await;
            match read {
                Ok(Ok(sent)) => last = sent,
                Ok(Err(e)) => {
                    let _ = tx.send(Event::default().event("error").data(e)).await;
                    return;
                }
                Err(_) => return,
            }
        }
        follow(live, last, &tx, &mut shutdown).await;
    });
    Ok(warp::sse::reply(warp::sse::keep_alive().stream(Events(rx))).into_response())
}

/// Sends the notices of the ops in `(after, upto]` from the log on disk;
/// returns the last seq sent.
fn catch_up_from_log(
    log_dir: &std::path::Path,
    after: u64,
    upto: u64,
    tx: &mpsc::Sender<Event>,
) -> Result<u64, String> {
    let reader = LogReader::open(log_dir).map_err(|e| e.to_string())?;
    let mut last = after;
    let mut failure = None;
    let options = ScanOptions {
        verify_chain: false,
        ..ScanOptions::default()
    };
    reader
        .scan(options, |_, record| {
            if record.seq <= after {
                return ControlFlow::Continue(());
            }
            if record.seq > upto {
                return ControlFlow::Break(());
            }
            match Op::decode(&record) {
                Ok(op) => {
                    if tx.blocking_send(event(&ChangeNotice::of(&op))).is_err() {
                        return ControlFlow::Break(());
                    }
                    last = op.seq;
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failure = Some(e.to_string());
                    ControlFlow::Break(())
                }
            }
        })
        .map_err(|e| e.to_string())?;
    match failure {
        Some(e) => Err(e),
        None => Ok(last),
    }
}

/// Forwards live notices after `last` until the subscriber leaves, falls
/// behind (an `overflow` event says where to resume), or the server stops.
async fn follow(
    mut live: broadcast::Receiver<Arc<Vec<ChangeNotice>>>,
    mut last: u64,
    tx: &mpsc::Sender<Event>,
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
                for notice in notices.iter() {
                    if notice.seq <= last {
                        continue;
                    }
                    if tx.send(event(notice)).await.is_err() {
                        return;
                    }
                    last = notice.seq;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let resume = serde_json::json!({ "resume_after": last });
                let _ = tx
                    .send(Event::default().event("overflow").data(resume.to_string()))
                    .await;
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(seq: u64) -> ChangeNotice {
        ChangeNotice {
            seq,
            kind: "moment.create",
            upserted: vec![format!("m{seq}")],
            removed: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_where_to_resume() {
        let (writer, live) = broadcast::channel(2);
        let (tx, mut rx) = mpsc::channel(16);
        let (_closing, mut shutdown) = tokio::sync::watch::channel(false);
        // The writer commits five batches while the subscriber is away; it
        // never waits (send on a broadcast does not block).
        for seq in 1..=5 {
            writer.send(Arc::new(vec![notice(seq)])).unwrap();
        }
        drop(writer);
        follow(live, 0, &tx, &mut shutdown).await;
        drop(tx);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(format!("{e:?}"));
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
        let (tx, mut rx) = mpsc::channel(16);
        let (_closing, mut shutdown) = tokio::sync::watch::channel(false);
        writer.send(Arc::new(vec![notice(3), notice(4)])).unwrap();
        writer.send(Arc::new(vec![notice(5)])).unwrap();
        drop(writer);
        // Seqs up to 3 were already sent from the log.
        follow(live, 3, &tx, &mut shutdown).await;
        drop(tx);
        let mut ids = Vec::new();
        while let Some(e) = rx.recv().await {
            ids.push(format!("{e:?}"));
        }
        assert_eq!(ids.len(), 2);
        assert!(ids[0].contains("\"4\"") || ids[0].contains("id: 4") || ids[0].contains('4'));
    }
}
