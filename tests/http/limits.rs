//! Connection hygiene: the connection limit, the request-head
//! timeout and the request timeout, against a live server over raw TCP so
//! that a client can be made as slow or as greedy as a bad one is.

use crate::common;

use std::time::{Duration, Instant};

use common::{log_records, settings, ulid, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 answer (head and a `Content-Length` body) and returns
/// its status and text (the head, a blank line, the body); `None` when the
/// connection closes first.
async fn read_answer(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            let text = String::from_utf8_lossy(&buffer[..end + 4 + length]).to_string();
            return Some((status, text));
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// The body of a [`read_answer`] text (what follows the head).
fn body_of(text: &str) -> &str {
    text.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// Settings with a 400 ms request timeout (the longest long poll cut to 0
/// so that the timeout may be that short).
fn request_timeout_400_ms(dir: &std::path::Path) -> spark_engine::Settings {
    let mut s = settings(dir);
    s.limits.request_timeout_ms = 400;
    s.brains.turn_wait_max_s = 0;
    s
}

/// Reads `stream` to its end, failing if the server keeps it open for 10 s;
/// returns what came before the close.
async fn closed_by_the_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection was held open");
    rest
}

async fn get_head(stream: &mut TcpStream) -> Option<(u16, String)> {
    stream
        .write_all(b"GET /api/log/head HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .ok()?;
    read_answer(stream).await
}

#[tokio::test]
async fn the_listener_pauses_at_the_connection_limit_and_resumes_when_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.connections_max = 2;
    let server = TestServer::start_with(s).await;
    let addr = server.running.addr;

    let mut first = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_head(&mut first).await.unwrap().0, 200);
    assert_eq!(get_head(&mut second).await.unwrap().0, 200);

    // The third connects (the kernel's backlog takes it) but is not served
    // while two are open.
    let mut third = TcpStream::connect(addr).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(700), get_head(&mut third)).await;
    assert!(
        waiting.is_err(),
        "a third connection was served over the limit of 2"
    );

    // One closes: the third is accepted and its request (already sent) is
    // answered.
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut third))
        .await
        .expect("served once a slot frees");
    assert_eq!(answer.unwrap().0, 200);
    // The kept-alive second connection still works.
    assert_eq!(get_head(&mut second).await.unwrap().0, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_request_head_that_never_ends_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.header_read_timeout_ms = 300;
    let server = TestServer::start_with(s).await;

    // Before the connection: the server's clock for the head starts when
    // it accepts, and a busy machine may pause this task between the
    // connect and the write for longer than the 100 ms of slack below.
    let started = Instant::now();
    let mut slow = TcpStream::connect(server.running.addr).await.unwrap();
    slow.write_all(b"GET /api/log/head HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    // The server closes it (perhaps after a 408); it does not wait forever.
    closed_by_the_server(&mut slow).await;
    assert!(started.elapsed() >= Duration::from_millis(200));

    // A prompt client on another connection is served as usual.
    let mut prompt = TcpStream::connect(server.running.addr).await.unwrap();
    assert_eq!(get_head(&mut prompt).await.unwrap().0, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_stalls_gets_408_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(request_timeout_400_ms(dir.path())).await;
    let before = log_records(dir.path()).len();

    let body = format!(r#"{{"id":"{}","client_request_id":"stall-1"}}"#, ulid());
    let mut stream = TcpStream::connect(server.running.addr).await.unwrap();
    let head = format!(
        "POST /api/moments HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Half the body, then nothing.
    stream
        .write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut stream))
        .await
        .expect("answered within the timeout")
        .expect("an answer, not a bare close");
    assert_eq!(status, 408, "{text}");
    let problem: serde_json::Value = serde_json::from_str(body_of(&text)).unwrap();
    assert_eq!(problem["code"], "request_timeout");
    assert_eq!(
        log_records(dir.path()).len(),
        before,
        "a stalled body wrote"
    );

    // The same create sent whole is answered 201 on a new connection.
    let (status, _) = server
        .post(
            "/api/moments",
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        )
        .await;
    assert_eq!(status, 201);
    server.stop().await;
}

#[test]
fn the_request_timeout_must_outlast_the_longest_long_poll() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.brains.turn_wait_max_s = 60;
    s.limits.request_timeout_ms = 60_000;
    let error = s.validate().unwrap_err().to_string();
    assert!(error.contains("limits.request_timeout_ms"), "{error}");
    s.limits.request_timeout_ms = 61_000;
    s.validate().unwrap();
    s.limits.connections_max = 0;
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .contains("connections_max"));
}

#[tokio::test]
async fn silent_sockets_are_closed_and_do_not_hold_the_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.connections_max = 2;
    s.limits.header_read_timeout_ms = 300;
    let server = TestServer::start_with(s).await;
    let addr = server.running.addr;

    // Two sockets that never send a byte, and one that opens with the
    // HTTP/2 preface (cleartext HTTP/2 is not served).
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut preface = TcpStream::connect(addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    for stream in [&mut silent, &mut preface] {
        let rest = closed_by_the_server(stream).await;
        assert!(
            !String::from_utf8_lossy(&rest).contains("HTTP/2"),
            "answered in HTTP/2"
        );
    }
    // Their slots are free again: a prompt client is served.
    let mut prompt = TcpStream::connect(addr).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), get_head(&mut prompt))
        .await
        .expect("served once the silent sockets are closed");
    assert_eq!(answer.unwrap().0, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_upload_cut_by_the_timeout_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(request_timeout_400_ms(dir.path())).await;
    let moment = ulid();
    let (status, _) = server
        .post("/api/moments", serde_json::json!({ "id": moment }))
        .await;
    assert_eq!(status, 201);

    let mut stream = TcpStream::connect(server.running.addr).await.unwrap();
    let head = format!(
        "PUT /api/media/{} HTTP/1.1\r\nhost: localhost\r\nx-moment-id: {moment}\r\nx-media-role: original\r\ncontent-type: image/jpeg\r\ncontent-length: 3000\r\n\r\n",
        ulid()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&[7u8; 1000]).await.unwrap();
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut stream))
        .await
        .expect("answered within the timeout")
        .expect("an answer");
    assert_eq!(status, 408);
    let tmp = dir.path().join("media").join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in media/tmp: {left:?}");
    server.stop().await;
}

/// The disk reserve without root (the full-disk tests in
/// `tests/durability/disk_full.rs` need a small tmpfs): a reserve above the
/// file system's free space refuses every write that would grow the log or
/// the media store with `507 insufficient_storage` and `Retry-After`, an
/// upload by its declared length before a byte of its body is read (no
/// temporary file); reads, `/healthz` and the event stream's catch-up go
/// on; `/readyz` says why and the refusals are counted by reason.
#[tokio::test]
async fn a_reserve_above_the_free_space_refuses_writes_with_507_and_uploads_before_their_body() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = settings(dir.path());
    cfg.log.disk_reserve_bytes = 0;
    let server = TestServer::start_with(cfg.clone()).await;
    let moment = ulid();
    let (status, _) = server
        .post("/api/moments", serde_json::json!({ "id": moment }))
        .await;
    assert_eq!(status, 201);
    server.stop().await;

    let free = spark_engine::disk::free_bytes(dir.path()).unwrap();
    cfg.log.disk_reserve_bytes = free.saturating_mul(2).max(1 << 40);
    let server = TestServer::start_with(cfg).await;
    let refused = server
        .client
        .post(server.url("/api/moments"))
        .json(&serde_json::json!({ "id": ulid(), "text": "kein Platz" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 507);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "insufficient_storage", "{body}");

    // Reads go on.
    let (status, read) = server.get(&format!("/api/moments/{moment}")).await;
    assert_eq!((status, read["id"].as_str()), (200, Some(moment.as_str())));
    let (status, _) = server.get("/healthz").await;
    assert_eq!(status, 200);
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(
        (status, ready["code"].as_str()),
        (507, Some("insufficient_storage"))
    );
    let events = server
        .client
        .get(server.url("/api/events?after=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);

    // An upload declaring 10 MiB is refused on its head alone: the answer
    // comes though not one byte of the body was sent.
    let mut stream = TcpStream::connect(server.running.addr).await.unwrap();
    let head = format!(
        "PUT /api/media/{} HTTP/1.1\r\nhost: localhost\r\nx-moment-id: {moment}\r\nx-media-role: original\r\ncontent-type: image/jpeg\r\ncontent-length: 10485760\r\n\r\n",
        ulid()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut stream))
        .await
        .expect("answered before the body")
        .expect("an answer");
    assert_eq!(status, 507, "{text}");
    assert!(text.contains("insufficient_storage"), "{text}");
    // The body was never read, so the connection cannot carry another
    // request: the answer says so rather than leaving a dead socket.
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    let tmp = dir.path().join("media").join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in media/tmp: {left:?}");

    let metrics = server.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("spark_writes_refused_total{reason=\"disk_reserve\"}")),
        "{metrics}"
    );
    server.stop().await;
}

/// Sends `body` as a chunked create in `parts` chunks, each written (and
/// flushed) apart, so the server reads it in several pieces; returns the
/// answer.
async fn chunked_create(addr: std::net::SocketAddr, body: &str, parts: usize) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST /api/moments HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .await
        .unwrap();
    let bytes = body.as_bytes();
    let size = bytes.len().div_ceil(parts);
    let pieces: Vec<&[u8]> = bytes.chunks(size).collect();
    for (n, piece) in pieces.iter().enumerate() {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        // The end of the body goes with the last chunk, so that nothing is
        // left unread when the server answers a body over the limit (an
        // unread rest would make its close a reset that may drop the answer).
        if n + 1 == pieces.len() {
            chunk.extend_from_slice(b"0\r\n\r\n");
        }
        stream.write_all(&chunk).await.unwrap();
        stream.flush().await.unwrap();
        if n + 1 < pieces.len() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::timeout(Duration::from_secs(10), read_answer(&mut stream))
        .await
        .expect("answered")
        .expect("an answer, not a bare close")
}

#[tokio::test]
async fn a_body_in_several_chunks_is_read_whole_and_held_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.json_body_limit_bytes = 1024;
    let server = TestServer::start_with(s).await;
    let addr = server.running.addr;

    // Under the limit, in one chunk and in five: stored as sent.
    for parts in [1, 5] {
        let id = ulid();
        let text = format!("sign read in {parts} pieces");
        let body =
            format!(r#"{{"id":"{id}","client_request_id":"chunks-{parts}","text":"{text}"}}"#);
        let (status, answer) = chunked_create(addr, &body, parts).await;
        assert_eq!(status, 201, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(body_of(&answer)).unwrap();
        assert_eq!(answer["moment"]["text"], text.as_str(), "{answer}");
    }

    // Over the limit: one chunk alone too large, and chunks that pass it
    // only together; neither writes.
    let before = log_records(dir.path()).len();
    let big = format!(r#"{{"id":"{}","text":"{}"}}"#, ulid(), "z".repeat(1100));
    for parts in [1, 4] {
        let (status, answer) = chunked_create(addr, &big, parts).await;
        assert_eq!(status, 413, "{parts} parts: {answer}");
        let problem: serde_json::Value = serde_json::from_str(body_of(&answer)).unwrap();
        assert_eq!(problem["code"], "too_large");
    }
    assert_eq!(
        log_records(dir.path()).len(),
        before,
        "a refused body wrote"
    );
    server.stop().await;
}

/// Open event streams cannot starve the health checks:
/// streams have their own cap (`limits.event_streams_max`, taking effect
/// up to `connections_max - 1`); one more is `503 unavailable` with
/// `Retry-After`, and `/healthz` and `/readyz` still answer. Before the
/// cap, `connections_max` streams held every connection and the health
/// routes got no answer at all.
#[tokio::test]
async fn open_event_streams_leave_room_for_the_health_checks() {
    for (connections_max, streams_max, cap) in [(3, 256, 2), (8, 3, 3)] {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path());
        s.limits.connections_max = connections_max;
        s.limits.event_streams_max = streams_max;
        let server = TestServer::start_with(s).await;
        let open_stream = || async {
            reqwest::Client::new()
                .get(server.url("/api/events?after=0"))
                .send()
                .await
                .unwrap()
        };
        let mut streams = Vec::new();
        for _ in 0..cap {
            let stream = open_stream().await;
            assert_eq!(stream.status().as_u16(), 200);
            streams.push(stream);
        }
        let refused = open_stream().await;
        assert_eq!(refused.status().as_u16(), 503);
        assert_eq!(refused.headers()["retry-after"], "5");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "unavailable", "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("limits.event_streams_max"),
            "{body}"
        );
        for path in ["/healthz", "/readyz"] {
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                reqwest::Client::new().get(server.url(path)).send(),
            )
            .await
            .unwrap_or_else(|_| panic!("{path} answers with {cap} streams open"))
            .unwrap();
            assert_eq!(answer.status().as_u16(), 200, "{path}");
        }
        // A stream that closes gives its place back.
        streams.pop();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stream = open_stream().await;
            if stream.status().as_u16() == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "no place freed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(streams);
        server.stop().await;
    }
}

/// A stream refused at the cap closes its connection (`Connection: close`):
/// a keep-alive client (curl, a browser) that holds the refused connection
/// would otherwise keep a place of `connections_max` with nothing on it,
/// and with streams at the cap and the connections at their limit the
/// health routes waited for it (seen by a break-test: `/healthz` blocked
/// about 10 s, until the idle connection timed out).
#[tokio::test]
async fn a_stream_refused_at_the_cap_closes_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.connections_max = 3;
    s.limits.event_streams_max = 1;
    let server = TestServer::start_with(s).await;
    let addr = server.running.addr;
    let open = reqwest::Client::new()
        .get(server.url("/api/events?after=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);

    let mut refused = TcpStream::connect(addr).await.unwrap();
    refused
        .write_all(b"GET /api/events?after=0 HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut refused))
        .await
        .expect("answered")
        .expect("an answer, not a bare close");
    assert_eq!(status, 503, "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    closed_by_the_server(&mut refused).await;
    // The refused connection is gone, so the two places left (one held by
    // the open stream) still carry a health check at once, even with a
    // second keep-alive client idle on the other.
    let _idle = TcpStream::connect(addr).await.unwrap();
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        reqwest::Client::new().get(server.url("/healthz")).send(),
    )
    .await
    .expect("/healthz answers while the refused connection is closed")
    .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    drop(open);
    server.stop().await;
}

#[test]
fn the_event_streams_cap_is_a_setting() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    assert_eq!(s.limits.event_streams_max, 256);
    s.limits.event_streams_max = 0;
    let error = s.validate().unwrap_err().to_string();
    assert!(error.contains("limits.event_streams_max"), "{error}");
}
