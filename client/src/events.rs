//! Following the change stream, `GET /api/events` (SPEC section 4), as a
//! reconnecting `EventSource` would, with the one answer a browser's
//! `EventSource` cannot handle: `409 cursor_ahead`.
//!
//! An [`EventsFollower`] keeps a cursor (the [`EventCursor`] of the last
//! change it gave: its seq and a prefix of the log's chain value there, so
//! it names one history of the log) and hands out [`Followed`] items one at
//! a time. It reconnects by itself with `Last-Event-ID: <cursor>` when the
//! stream ends, when the server says
//! `overflow` (the subscriber fell behind), or when nothing, not even a
//! keep-alive comment, arrived for [`STALL_LIMIT`]; so a caller sees every
//! committed op once, in order, with no gap.
//!
//! After a restore from an archive that was behind, the server's log may end
//! before the cursor: the ops the client saw past the head are gone, and the
//! seqs after the head will name other ops. The server answers `409
//! cursor_ahead` naming its head; the follower then gives
//! [`Followed::CursorAhead`] and follows after the head. The caller must
//! resynchronise what it derived from the stream (refetch the records it
//! holds), since some of what it saw no longer exists.
//!
//! After a restore and a take-over (or a failover to a replica of another
//! archive) the server's log may hold other ops under the seqs the client
//! saw: the server answers `409 cursor_unknown` and the
//! follower gives [`Followed::Resync`], then follows after the head the
//! answer names. The caller resynchronises the same way: refetch what it
//! holds, then trust the changes that follow (they start at the head the
//! answer named, so nothing committed after the refetch is missed).
//!
//! ```no_run
//! # async fn run() -> Result<(), spark_client::events::EventsError> {
//! use spark_client::events::{EventsFollower, Followed};
//!
//! use spark_core::wire::events::EventCursor;
//!
//! let mut follower = EventsFollower::new("http://127.0.0.1:8080", EventCursor::START)?;
//! loop {
//!     match follower.next().await? {
//!         Followed::Change(notice) => println!("{} {}", notice.seq, notice.kind),
//!         Followed::CursorAhead { head_seq, .. } => {
//!             println!("the server is behind what we saw; refetching, then after {head_seq}")
//!         }
//!         Followed::Resync { head, .. } => {
//!             println!("another history than we followed; refetching, then after {head}")
//!         }
//!     }
//! }
//! # }
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use spark_core::wire::events::{ChangeNotice, EventCursor, Overflow, EVENT_ERROR, EVENT_OVERFLOW};
use spark_core::wire::problem::{CursorAheadMembers, Problem, CURSOR_AHEAD, CURSOR_UNKNOWN};

use crate::transport::TransportError;

/// How long a connection may stay silent (the server sends a keep-alive
/// comment every 15 s) before the follower drops it and reconnects.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Limit for connecting and for the answer's head.
const CONNECT_LIMIT: Duration = Duration::from_secs(15);

/// One item of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// A committed op: what it created, updated or removed. The cursor is
    /// now its event's id.
    Change(ChangeNotice),
    /// The server's log ends before the cursor (`409 cursor_ahead`): it was
    /// restored from an archive that was behind what this client saw. The
    /// cursor is now `head_seq`; resynchronise before trusting what was
    /// derived from seqs after it.
    CursorAhead {
        /// The cursor the follower asked for.
        after: u64,
        /// The server's head, which the follower follows after from now on.
        head_seq: u64,
    },
    /// The cursor is not a point of the server's history (`409
    /// cursor_unknown`): its log holds other ops under the cursor's seq (a
    /// restore and a take-over, a failover to another archive's replica),
    /// or the cursor was a bare seq, which cannot be checked. The cursor
    /// is now `head`; resynchronise (refetch what was derived from the
    /// stream) before trusting it again.
    Resync {
        /// The cursor the follower asked for.
        after: EventCursor,
        /// The server's head, which the follower follows after from now on.
        head: EventCursor,
    },
}

/// Why the follower stopped; calling [`EventsFollower::next`] again
/// reconnects from the cursor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EventsError {
    /// No connection, or it broke before an answer's head.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The server answered with an error (`401`, `503`, ...).
    #[error("{status} {}: {}", .problem.code, .problem.detail)]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The problem body (empty members when a proxy answered).
        problem: Box<Problem>,
    },
    /// The server could not read its log (an `error` event ended the
    /// stream); its text.
    #[error("the server could not read its log: {0}")]
    Log(String),
    /// The stream broke the event format (a change event's data that is not
    /// a change notice, ...).
    #[error("malformed event stream: {0}")]
    Malformed(String),
}

/// A follower of `GET /api/events` at one server; see the module doc.
#[derive(Debug)]
pub struct EventsFollower {
    base: String,
    client: reqwest::Client,
    token: Option<String>,
    cursor: EventCursor,
    stream: Option<reqwest::Response>,
    /// Bytes received, not yet a whole event.
    buffer: Vec<u8>,
    ready: VecDeque<Followed>,
}

impl EventsFollower {
    /// A follower of `base` (e.g. `http://127.0.0.1:8080`) that gives the
    /// ops after `after` ([`EventCursor::START`]: all; else an event's id,
    /// or the `cursor` a resynchronisation named). Connects on the first
    /// [`EventsFollower::next`].
    pub fn new(base: &str, after: EventCursor) -> Result<EventsFollower, EventsError> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_LIMIT)
            .build()
            .map_err(|e| TransportError::Network(format!("cannot build the HTTP client: {e}")))?;
        Ok(EventsFollower {
            base: base.trim_end_matches('/').to_owned(),
            client,
            token: None,
            cursor: after,
            stream: None,
            buffer: Vec::new(),
            ready: VecDeque::new(),
        })
    }

    /// Sends `Authorization: Bearer <token>` (SPEC section 9).
    pub fn with_token(mut self, token: Option<String>) -> EventsFollower {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// The cursor of the last change given (or the head after a
    /// [`Followed::CursorAhead`] or [`Followed::Resync`]): where a
    /// reconnect resumes.
    pub fn cursor(&self) -> EventCursor {
        self.cursor
    }

    /// The next item, waiting for it as long as it takes; reconnects as the
    /// module doc says. An error leaves the cursor where it was.
    pub async fn next(&mut self) -> Result<Followed, EventsError> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(item);
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Some(ahead) = self.connect().await? {
                    return Ok(ahead);
                }
                continue;
            };
            match tokio::time::timeout(STALL_LIMIT, stream.chunk()).await {
                Ok(Ok(Some(bytes))) => {
                    self.buffer.extend_from_slice(&bytes);
                    self.parse()?;
                }
                // The end of the stream, a broken connection or a silent
                // one: reconnect from the cursor.
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => self.disconnect(),
            }
        }
    }

    fn disconnect(&mut self) {
        self.stream = None;
        self.buffer.clear();
    }

    /// Opens the stream after the cursor; `Some` when the server says the
    /// cursor is ahead of its log.
    async fn connect(&mut self) -> Result<Option<Followed>, EventsError> {
        let mut request = self
            .client
            .get(format!("{}/api/events", self.base))
            .header("Last-Event-ID", self.cursor.to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = tokio::time::timeout(CONNECT_LIMIT, request.send())
            .await
            .map_err(|_| TransportError::Timeout("no answer to GET /api/events".into()))?
            .map_err(|e| TransportError::Network(e.to_string()))?;
        let status = response.status().as_u16();
        if status == 200 {
            self.stream = Some(response);
            self.buffer.clear();
            return Ok(None);
        }
        let problem: Problem = response.json().await.unwrap_or_default();
        if status == 409 && (problem.code == CURSOR_AHEAD || problem.code == CURSOR_UNKNOWN) {
            let members: CursorAheadMembers = serde_json::from_value(serde_json::Value::Object(
                problem.extra.clone(),
            ))
            .map_err(|e| {
                EventsError::Malformed(format!("{} without its members: {e}", problem.code))
            })?;
            let head = EventCursor::parse(&members.head_cursor).ok_or_else(|| {
                EventsError::Malformed(format!(
                    "{} names the head cursor {:?}",
                    problem.code, members.head_cursor
                ))
            })?;
            let after = std::mem::replace(&mut self.cursor, head);
            return Ok(Some(if problem.code == CURSOR_AHEAD {
                Followed::CursorAhead {
                    after: members.after,
                    head_seq: members.head_seq,
                }
            } else {
                Followed::Resync { after, head }
            }));
        }
        Err(EventsError::Refused {
            status,
            problem: Box::new(problem),
        })
    }

    /// Moves the whole events in the buffer to `ready`.
    fn parse(&mut self) -> Result<(), EventsError> {
        while let Some((end, separator)) = event_end(&self.buffer) {
            let block: Vec<u8> = self.buffer.drain(..end + separator).collect();
            let text = String::from_utf8(block[..end].to_vec())
                .map_err(|_| EventsError::Malformed("an event that is not UTF-8".into()))?;
            let mut name = None;
            let mut id = None;
            let mut data: Option<String> = None;
            for line in text.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => name = Some(value.to_owned()),
                    "data" => match &mut data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(value);
                        }
                        None => data = Some(value.to_owned()),
                    },
                    "id" => id = Some(value.to_owned()),
                    // Comments and unknown fields are ignored, as an
                    // EventSource does.
                    _ => {}
                }
            }
            let Some(data) = data else { continue };
            match name.as_deref() {
                None => {
                    let notice: ChangeNotice = serde_json::from_str(&data)
                        .map_err(|e| EventsError::Malformed(format!("{e}: {data}")))?;
                    if notice.seq <= self.cursor.seq {
                        continue;
                    }
                    let cursor = id
                        .as_deref()
                        .and_then(EventCursor::parse)
                        .filter(|c| c.seq == notice.seq)
                        .ok_or_else(|| {
                            EventsError::Malformed(format!(
                                "change {} with the id {id:?}, not its cursor",
                                notice.seq
                            ))
                        })?;
                    self.cursor = cursor;
                    self.ready.push_back(Followed::Change(notice));
                }
                Some(EVENT_OVERFLOW) => {
                    let overflow: Overflow = serde_json::from_str(&data)
                        .map_err(|e| EventsError::Malformed(format!("{e}: {data}")))?;
                    // Every change up to it was given; resume from there.
                    if overflow.resume_after > self.cursor.seq {
                        self.cursor = EventCursor::parse(&overflow.resume_cursor)
                            .filter(|c| c.seq == overflow.resume_after)
                            .ok_or_else(|| {
                                EventsError::Malformed(format!(
                                    "overflow without its cursor: {data}"
                                ))
                            })?;
                    }
                    self.disconnect();
                    return Ok(());
                }
                Some(EVENT_ERROR) => {
                    self.disconnect();
                    return Err(EventsError::Log(data));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Where the first event in `buffer` ends: the index of its blank line and
/// the separator's length (`\n\n`, `\r\n\r\n` or `\r\r`).
fn event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    (0..buffer.len()).find_map(|i| {
        let rest = &buffer[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else if rest.starts_with(b"\n\n") || rest.starts_with(b"\r\r") {
            Some((i, 2))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follower() -> EventsFollower {
        EventsFollower::new("http://127.0.0.1:9", EventCursor::START).unwrap()
    }

    #[test]
    fn changes_are_parsed_across_chunks_and_move_the_cursor() {
        let mut f = follower();
        f.buffer.extend_from_slice(
            b": keep-alive\n\nid:1.0000000000000001\ndata:{\"seq\":1,\"kind\":\"moment.create\",",
        );
        f.parse().unwrap();
        assert!(f.ready.is_empty());
        f.buffer.extend_from_slice(
            b"\"upserted\":[\"m\"],\"removed\":[]}\n\nid:2.00000000000000ff\r\ndata:",
        );
        f.parse().unwrap();
        assert_eq!(f.cursor().to_string(), "1.0000000000000001");
        f.buffer.extend_from_slice(
            b"{\"seq\":2,\"kind\":\"moment.delete\",\"upserted\":[],\"removed\":[\"m\"]}\r\n\r\n",
        );
        f.parse().unwrap();
        assert_eq!(f.cursor().to_string(), "2.00000000000000ff");
        let kinds: Vec<_> = f
            .ready
            .iter()
            .map(|item| match item {
                Followed::Change(n) => n.kind.to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, ["moment.create", "moment.delete"]);
    }

    #[test]
    fn overflow_resumes_after_its_seq_and_error_stops() {
        let mut f = follower();
        f.buffer
            .extend_from_slice(b"event:overflow\ndata:{\"resume_after\":7,\"resume_cursor\":\"7.0a0a0a0a0a0a0a0a\"}\n\nid:99\ndata:x\n\n");
        f.parse().unwrap();
        // What follows an overflow on the same connection is dropped: the
        // reconnect resumes after 7.
        assert_eq!(
            (f.cursor().to_string(), f.buffer.len(), f.ready.len()),
            ("7.0a0a0a0a0a0a0a0a".to_owned(), 0, 0)
        );
        f.buffer
            .extend_from_slice(b"event:error\ndata:corrupt log\n\n");
        assert_eq!(f.parse(), Err(EventsError::Log("corrupt log".into())));
        f.buffer.extend_from_slice(b"data:{\"seq\":8}\n\n");
        assert!(matches!(f.parse(), Err(EventsError::Malformed(_))));
        // A change whose id is not its cursor: malformed, the cursor stays.
        f.buffer.extend_from_slice(
            b"id:nine\ndata:{\"seq\":9,\"kind\":\"k\",\"upserted\":[],\"removed\":[]}\n\n",
        );
        assert!(matches!(f.parse(), Err(EventsError::Malformed(_))));
        assert_eq!(f.cursor().seq, 7);
    }
}
