//! The drain's answer classes (SPEC section 6), against a fake transport
//! that answers with chosen statuses, and the real transport against a
//! tiny fake server (Retry-After over the wire, a timeout).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use spark_client::outbox::sha256_hex;
use spark_client::{
    Capture, Client, DrainOptions, EntryState, HttpRequest, HttpResponse, ManualClock, MediaBytes,
    Method, Outbox, ReqwestTransport, Step, Transport, TransportError, WaitCause,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the fake transport does with the next request.
#[derive(Clone, Debug)]
enum Reply {
    /// Answer with this status, headers and JSON body.
    Status(u16, Vec<(&'static str, String)>, Value),
    /// No answer: a network error.
    Network,
    /// No answer: a timeout.
    Timeout,
}

fn status(code: u16) -> Reply {
    Reply::Status(code, vec![], Value::Null)
}

fn with_retry_after(code: u16, value: &str) -> Reply {
    Reply::Status(code, vec![("Retry-After", value.to_owned())], Value::Null)
}

fn problem(code: u16, name: &str, detail: &str) -> Reply {
    Reply::Status(
        code,
        vec![("content-type", "application/problem+json".into())],
        json!({"type": "about:blank", "title": name, "status": code, "code": name, "detail": detail}),
    )
}

/// Answers scripted replies in order, then success for whatever comes.
#[derive(Default)]
struct FakeTransport {
    script: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<HttpRequest>>,
}

impl FakeTransport {
    fn scripted(replies: impl IntoIterator<Item = Reply>) -> Arc<FakeTransport> {
        Arc::new(FakeTransport {
            script: Mutex::new(replies.into_iter().collect()),
            seen: Mutex::default(),
        })
    }

    fn seen(&self) -> Vec<HttpRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests as "METHOD path" lines.
    fn lines(&self) -> Vec<String> {
        self.seen()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect()
    }
}

fn success_for(request: &HttpRequest) -> HttpResponse {
    let (status, body) = match (request.method, request.path.as_str()) {
        (Method::Post, "/api/moments") => (201, json!({"created": true, "moment": {}})),
        (Method::Put, _) => (201, json!({"created": true, "media": {}})),
        (Method::Post, "/api/messages") => (
            202,
            json!({"created": true, "message": {"ts": "2026-01-01T00:00:00Z"}}),
        ),
        (Method::Post, _) => (
            202,
            json!({"created": true, "turn": {"id": "01JDQ3ZC9W4G8Y7E6QJ2KX5N3M"}}),
        ),
        _ => (200, Value::Null),
    };
    HttpResponse {
        status,
        headers: vec![],
        body: Bytes::from(body.to_string()),
    }
}

impl Transport for FakeTransport {
    fn send(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        let next = self.script.lock().unwrap().pop_front();
        let answer = match next {
            None => Ok(success_for(&request)),
            Some(Reply::Network) => Err(TransportError::Network("connection reset".into())),
            Some(Reply::Timeout) => Err(TransportError::Timeout("no answer in 60 s".into())),
            Some(Reply::Status(status, headers, body)) => Ok(HttpResponse {
                status,
                headers: headers
                    .into_iter()
                    .map(|(n, v)| (n.to_owned(), v))
                    .collect(),
                body: if body.is_null() {
                    Bytes::new()
                } else {
                    Bytes::from(body.to_string())
                },
            }),
        };
        self.seen.lock().unwrap().push(request);
        Box::pin(std::future::ready(answer))
    }
}

const START_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

fn photo_capture(n: u8) -> Capture {
    Capture {
        copy: MediaBytes {
            bytes: vec![n; 100],
            content_type: "image/jpeg".into(),
        },
        original: MediaBytes {
            bytes: vec![n; 1000],
            content_type: "image/png".into(),
        },
        more_photos: Vec::new(),
        text: Some(format!("sign {n}")),
        caption: None,
        lang: Some("de".into()),
        captured_at_ms: None,
    }
}

fn options() -> DrainOptions {
    DrainOptions {
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        max_passes: Some(100),
        ..DrainOptions::default()
    }
}

fn client(dir: &std::path::Path, transport: Arc<FakeTransport>, clock: &ManualClock) -> Client {
    Client::new(
        Outbox::open(dir).unwrap(),
        transport,
        Arc::new(clock.clone()),
    )
    .with_options(options())
}

#[tokio::test]
async fn steps_go_in_order_with_ids_minted_at_capture_and_the_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let transport = FakeTransport::scripted([]);
    let client = client(dir.path(), transport.clone(), &clock);
    let entry = client.capture(photo_capture(1)).unwrap();

    let report = client.drain().await.unwrap();
    assert_eq!(report.entries_done, vec![entry.id.clone()]);
    assert_eq!((report.pending_entries, report.parked_entries), (0, 0));
    assert!(report.waits.is_empty());

    let moment = entry.moment_id.to_string();
    assert_eq!(
        transport.lines(),
        vec![
            "POST /api/moments".to_owned(),
            format!("PUT /api/media/{}", entry.copy_id),
            format!("POST /api/moments/{moment}/turns"),
            format!("PUT /api/media/{}", entry.original_id),
        ]
    );
    let seen = transport.seen();
    let create: Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(create["id"], moment.as_str());
    assert_eq!(create["client_request_id"], entry.id.as_str());
    assert_eq!(create["text"], "sign 1");
    assert_eq!(create["captured_at"], "2026-01-01T00:00:00Z");
    for (request, role, bytes, content_type) in [
        (&seen[1], "copy", vec![1u8; 100], "image/jpeg"),
        (&seen[3], "original", vec![1u8; 1000], "image/png"),
    ] {
        assert_eq!(request.header("x-moment-id"), Some(moment.as_str()));
        assert_eq!(request.header("x-media-role"), Some(role));
        assert_eq!(request.header("content-type"), Some(content_type));
        assert_eq!(
            request.header("x-content-sha256"),
            Some(sha256_hex(&bytes).as_str())
        );
        assert_eq!(request.body.as_ref(), bytes.as_slice());
    }
    let turn: Value = serde_json::from_slice(&seen[2].body).unwrap();
    assert_eq!(
        turn,
        json!({"client_request_id": entry.turn_request_id, "mode": "practical"})
    );

    let stored = client.outbox().load(&entry.id).unwrap();
    assert_eq!(stored.state(), EntryState::Done);
    assert_eq!(stored.done, Step::ORDER.to_vec());
    assert_eq!(
        stored.turn_id.as_deref(),
        Some("01JDQ3ZC9W4G8Y7E6QJ2KX5N3M")
    );

    // A second drain has nothing to send.
    let again = client.drain().await.unwrap();
    assert_eq!(again.requests, 0);
    assert_eq!(transport.seen().len(), 4);
}

#[tokio::test]
async fn passing_statuses_wait_like_a_dropped_link_honouring_retry_after() {
    for code in [401u16, 403, 408, 425, 429] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(START_MS);
        // The create succeeds; the copy is answered `code` with Retry-After.
        let transport = FakeTransport::scripted([status(201), with_retry_after(code, "7")]);
        let client = client(dir.path(), transport.clone(), &clock);
        let entry = client.capture(photo_capture(2)).unwrap();

        let report = client.drain().await.unwrap();
        assert_eq!(report.waits.len(), 1, "{code}");
        assert_eq!(report.waits[0].delay, Duration::from_secs(7), "{code}");
        assert!(
            matches!(report.waits[0].cause, WaitCause::Passing { status, .. } if status == code),
            "{code}: {:?}",
            report.waits[0].cause
        );
        assert_eq!(clock.sleeps(), vec![Duration::from_secs(7)], "{code}");
        assert!(report.parked.is_empty(), "{code}");
        assert_eq!(report.entries_done, vec![entry.id.clone()], "{code}");
        // The create was not sent again; the copy was, once.
        let lines = transport.lines();
        assert_eq!(lines.len(), 5, "{code}: {lines:?}");
        assert_eq!(lines[1], lines[2], "{code}");
        assert_eq!(
            lines.iter().filter(|l| *l == "POST /api/moments").count(),
            1,
            "{code}"
        );
    }
}

#[tokio::test]
async fn retry_after_as_a_date_and_passing_statuses_without_it() {
    let dir = tempfile::tempdir().unwrap();
    // Sun, 06 Nov 1994 08:49:37 GMT
    let clock = ManualClock::at(784_111_777_000);
    let transport = FakeTransport::scripted([
        with_retry_after(429, "Sun, 06 Nov 1994 08:50:07 GMT"),
        status(503),
        with_retry_after(503, "2"),
        status(401),
    ]);
    let client = client(dir.path(), transport.clone(), &clock);
    client.capture(photo_capture(3)).unwrap();
    let report = client.drain().await.unwrap();
    let delays: Vec<Duration> = report.waits.iter().map(|w| w.delay).collect();
    assert_eq!(delays.len(), 4);
    assert_eq!(delays[0], Duration::from_secs(30));
    // 503 without Retry-After: the backoff (second wait in a row).
    assert!(
        delays[1] >= Duration::from_millis(100) && delays[1] <= Duration::from_millis(200),
        "{delays:?}"
    );
    assert_eq!(delays[2], Duration::from_secs(2));
    // 401 without Retry-After waits like a dropped link: backoff too.
    assert!(
        delays[3] >= Duration::from_millis(400) && delays[3] <= Duration::from_millis(800),
        "{delays:?}"
    );
    assert_eq!(report.pending_entries, 0);
}

#[tokio::test]
async fn other_4xx_park_the_entry_with_its_reason_and_the_rest_go_on() {
    for code in [400u16, 404, 405, 409, 410, 412, 413, 422] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(START_MS);
        let transport = FakeTransport::scripted([
            status(201),
            problem(code, "too_large", &format!("refused with {code}")),
        ]);
        let client = client(dir.path(), transport.clone(), &clock);
        let first = client.capture(photo_capture(4)).unwrap();
        clock.advance(Duration::from_millis(5));
        let second = client.capture(photo_capture(5)).unwrap();

        let report = client.drain().await.unwrap();
        assert!(report.waits.is_empty(), "{code}: parking is no wait");
        assert_eq!(report.parked.len(), 1, "{code}");
        assert_eq!(report.parked[0].0, first.id);
        assert_eq!(report.entries_done, vec![second.id.clone()], "{code}");
        assert_eq!((report.parked_entries, report.pending_entries), (1, 0));

        // The parked entry's later steps were not sent; the other went whole.
        assert_eq!(transport.seen().len(), 2 + 4, "{code}");
        let stored = client.outbox().load(&first.id).unwrap();
        assert_eq!(stored.state(), EntryState::Parked);
        assert_eq!(stored.done, vec![Step::CreateMoment]);
        let parked = stored.parked.unwrap();
        assert_eq!(parked.step, Step::UploadCopy);
        assert_eq!(parked.status, Some(code));
        assert_eq!(parked.code.as_deref(), Some("too_large"));
        assert_eq!(parked.detail, format!("refused with {code}"));
        assert!(parked.to_string().contains(&code.to_string()));

        // A parked entry stays put on the next drain; unparked, it finishes.
        let again = client.drain().await.unwrap();
        assert_eq!(again.requests, 0);
        client.outbox().unpark(&first.id).unwrap();
        let resumed = client.drain().await.unwrap();
        assert_eq!(resumed.entries_done, vec![first.id.clone()]);
        assert_eq!(resumed.requests, 3, "resumes at the refused step");
    }
}

#[tokio::test]
async fn server_errors_timeouts_and_network_errors_back_off_with_jitter() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let transport = FakeTransport::scripted([
        status(500),
        Reply::Network,
        status(502),
        Reply::Timeout,
        status(503),
        status(504),
        Reply::Network,
    ]);
    let client = client(dir.path(), transport.clone(), &clock);
    let entry = client.capture(photo_capture(6)).unwrap();
    let report = client.drain().await.unwrap();
    assert_eq!(report.entries_done, vec![entry.id]);
    let delays: Vec<Duration> = report.waits.iter().map(|w| w.delay).collect();
    assert_eq!(delays.len(), 7);
    for (n, delay) in delays.iter().enumerate() {
        // base 100 ms, doubled per wait in a row, capped at 1 s; equal jitter.
        let cap = (Duration::from_millis(100) * 2u32.pow(n as u32)).min(Duration::from_secs(1));
        assert!(
            *delay >= cap / 2 && *delay <= cap,
            "wait {n}: {delay:?} not in [{:?}, {cap:?}]",
            cap / 2
        );
    }
    assert!(matches!(
        report.waits[1].cause,
        WaitCause::Link(TransportError::Network(_))
    ));
    assert!(matches!(
        report.waits[3].cause,
        WaitCause::Link(TransportError::Timeout(_))
    ));
    assert!(matches!(
        report.waits[0].cause,
        WaitCause::Server { status: 500, .. }
    ));
    // The create went 8 times (7 without a usable answer), the rest once.
    assert_eq!(transport.seen().len(), 8 + 3);
}

#[tokio::test]
async fn done_steps_are_skipped_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let transport = FakeTransport::scripted([status(201), status(201), Reply::Network]);
    let first = client(dir.path(), transport.clone(), &clock).with_options(DrainOptions {
        max_passes: Some(1),
        ..options()
    });
    let entry = first.capture(photo_capture(7)).unwrap();
    let report = first.drain().await.unwrap();
    assert!(report.gave_up);
    assert_eq!(report.pending_entries, 1);
    drop(first);

    // A new process over the same outbox directory.
    let stored = Outbox::open(dir.path()).unwrap().load(&entry.id).unwrap();
    assert_eq!(stored.state(), EntryState::Pending(Step::StartTurn));
    assert_eq!(stored.failed_attempts, 1);
    assert!(stored.last_error.unwrap().contains("network"));

    let transport = FakeTransport::scripted([]);
    let second = client(dir.path(), transport.clone(), &clock);
    let report = second.drain().await.unwrap();
    assert_eq!(report.entries_done, vec![entry.id.clone()]);
    assert_eq!(
        transport.lines(),
        vec![
            format!("POST /api/moments/{}/turns", entry.moment_id),
            format!("PUT /api/media/{}", entry.original_id),
        ]
    );
}

#[tokio::test]
async fn a_drain_gives_up_at_its_time_limit_and_keeps_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let transport = FakeTransport::scripted(std::iter::repeat_n(Reply::Network, 1000));
    let client = client(dir.path(), transport.clone(), &clock).with_options(DrainOptions {
        give_up_after: Some(Duration::from_secs(10)),
        max_passes: None,
        ..options()
    });
    client.capture(photo_capture(8)).unwrap();
    let report = client.drain().await.unwrap();
    assert!(report.gave_up);
    assert_eq!(report.pending_entries, 1);
    let waited: Duration = clock.sleeps().iter().sum();
    assert!(waited <= Duration::from_secs(10), "{waited:?}");
    assert!(report.passes > 5);
}

#[tokio::test]
async fn a_missing_media_file_parks_the_entry_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let transport = FakeTransport::scripted([]);
    let client = client(dir.path(), transport.clone(), &clock);
    let entry = client.capture(photo_capture(9)).unwrap();
    std::fs::remove_file(client.outbox().media_path(&entry, &entry.copy)).unwrap();
    let report = client.drain().await.unwrap();
    assert_eq!(report.parked.len(), 1);
    let parked = &report.parked[0].1;
    assert_eq!((parked.step, parked.status), (Step::UploadCopy, None));
    assert_eq!(parked.code.as_deref(), Some("local_file"));
    assert_eq!(transport.seen().len(), 1);
}

/// A canned answer: status, extra headers, body.
type Canned = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// A tiny HTTP server answering each request with the next canned response
/// (status, extra headers, body), or never answering once they run out.
async fn fake_server(answers: Vec<Canned>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut answers = VecDeque::from(answers);
        let mut held = Vec::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            // Read the head and a Content-Length body.
            loop {
                let n = socket.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buffer.extend_from_slice(&chunk[..n]);
                if let Some(end) = find(&buffer, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buffer.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let Some((status, headers, body)) = answers.pop_front() else {
                held.push(socket); // never answered
                continue;
            };
            let mut response = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(body);
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    addr
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn the_real_transport_reads_retry_after_problems_and_times_out() {
    let addr = fake_server(vec![
        (429, vec![("Retry-After", "3")], ""),
        (
            413,
            vec![("content-type", "application/problem+json")],
            r#"{"code":"too_large","detail":"the upload is over 33554432 bytes"}"#,
        ),
        (201, vec![], r#"{"created":true}"#),
        (201, vec![], r#"{"created":true}"#),
        // then: no answer at all
    ])
    .await;
    // Long enough for the fake server (one task, one connection at a time)
    // to answer on a busy machine: only the unanswered turn may time out.
    let transport = Arc::new(
        ReqwestTransport::with_timeout(&format!("http://{addr}"), Duration::from_secs(3)).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(START_MS);
    let client = Client::new(
        Outbox::open(dir.path()).unwrap(),
        transport,
        Arc::new(clock.clone()),
    )
    .with_options(DrainOptions {
        max_passes: Some(2),
        ..options()
    });
    let parked = client.capture(photo_capture(10)).unwrap();
    clock.advance(Duration::from_millis(5));
    let waiting = client.capture(photo_capture(11)).unwrap();

    let report = client.drain().await.unwrap();
    // Pass 1: 429 with Retry-After 3 s on the first create. Pass 2: the
    // create is refused with 413 (parked); the second entry's create and
    // copy go through, then its turn gets no answer in time.
    assert_eq!(report.waits.len(), 2, "{:?}", report.waits);
    assert_eq!(report.waits[0].delay, Duration::from_secs(3));
    assert!(
        matches!(
            report.waits[1].cause,
            WaitCause::Link(TransportError::Timeout(_))
        ),
        "{:?}",
        report.waits[1].cause
    );
    assert!(report.gave_up);
    let stored = client.outbox().load(&parked.id).unwrap();
    let reason = stored.parked.unwrap();
    assert_eq!(
        (reason.status, reason.code.as_deref()),
        (Some(413), Some("too_large"))
    );
    assert_eq!(reason.detail, "the upload is over 33554432 bytes");
    let stored = client.outbox().load(&waiting.id).unwrap();
    assert_eq!(stored.state(), EntryState::Pending(Step::StartTurn));
}
