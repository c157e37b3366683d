//! The outbox drains 50 captures through a lossy
//! proxy (it drops the reply after the server answered with probability
//! 0.5, and sometimes resets the connection before forwarding), and the
//! server's log holds exactly one moment.create, one copy and one original
//! media.put, and one practical turn.start per capture, and nothing else
//! (besides each turn's own finish).

use crate::common;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spark_client::outbox::sha256_hex;
use spark_client::{
    image, Capture, Client, DrainOptions, EntryState, MediaBytes, Outbox, PhotoBytes,
    ReqwestTransport, SystemClientClock,
};
use spark_engine::brain::scripted::ScriptedBrain;
use spark_engine::brain::Brain;
use spark_engine::OpKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{log_records, settings, TestServer};

/// What the proxy did.
#[derive(Default, Debug)]
struct ProxyStats {
    /// Connections reset before the request was forwarded.
    resets: AtomicUsize,
    /// Requests the server answered whose reply the proxy dropped.
    dropped_replies: AtomicUsize,
    /// Replies passed back to the client.
    delivered: AtomicUsize,
}

const RESET_BEFORE_FORWARDING: f64 = 0.1;
const DROP_REPLY: f64 = 0.5;

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one whole HTTP/1.1 request (head and Content-Length body).
async fn read_request(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                return Some((head, buffer[end + 4..end + 4 + length].to_vec()));
            }
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Closes with RST rather than FIN.
fn reset(socket: TcpStream) {
    let _ = socket.set_zero_linger();
    drop(socket);
}

async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    rng: Arc<Mutex<StdRng>>,
    stats: Arc<ProxyStats>,
) {
    let Some((head, body)) = read_request(&mut client).await else {
        return;
    };
    let (reset_now, drop_reply) = {
        let mut rng = rng.lock().unwrap();
        (
            rng.gen_bool(RESET_BEFORE_FORWARDING),
            rng.gen_bool(DROP_REPLY),
        )
    };
    if reset_now {
        stats.resets.fetch_add(1, Ordering::SeqCst);
        reset(client);
        return;
    }
    // One request per upstream connection: the server closes after its
    // answer, so the answer is everything up to EOF.
    let mut request: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    request.push_str("connection: close\r\n\r\n");
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let mut answer = Vec::new();
    let forwarded = async {
        server.write_all(request.as_bytes()).await?;
        server.write_all(&body).await?;
        server.read_to_end(&mut answer).await
    };
    if forwarded.await.is_err() || answer.is_empty() {
        reset(client);
        return;
    }
    if drop_reply {
        // The server answered (its op is durable); the phone never hears.
        stats.dropped_replies.fetch_add(1, Ordering::SeqCst);
        reset(client);
        return;
    }
    stats.delivered.fetch_add(1, Ordering::SeqCst);
    let _ = client.write_all(&answer).await;
    let _ = client.shutdown().await;
}

/// Starts the proxy on 127.0.0.1 in front of `upstream`.
async fn start_proxy(upstream: SocketAddr, seed: u64) -> (SocketAddr, Arc<ProxyStats>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(ProxyStats::default());
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    let shared = Arc::clone(&stats);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(handle(
                socket,
                upstream,
                Arc::clone(&rng),
                Arc::clone(&shared),
            ));
        }
    });
    (addr, stats)
}

/// A small distinct photo per capture.
fn photo(n: u32) -> Vec<u8> {
    let buffer = ::image::ImageBuffer::from_fn(96, 64, |x, y| {
        ::image::Rgb([(x * 2 + n) as u8, (y * 3) as u8, (n * 5) as u8])
    });
    let mut out = Vec::new();
    ::image::DynamicImage::ImageRgb8(buffer)
        .write_to(&mut Cursor::new(&mut out), ::image::ImageFormat::Png)
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_captures_through_a_lossy_link_land_exactly_once() {
    let data = tempfile::tempdir().unwrap();
    let brain = ScriptedBrain::answering("Keep the exit clear.");
    let server = TestServer::start_with_brains(
        settings(data.path()),
        vec![("pippa", Arc::new(brain.clone()) as Arc<dyn Brain>)],
    )
    .await;
    let seed = rand::random::<u64>();
    let (proxy, stats) = start_proxy(server.running.addr, seed).await;

    let outbox_dir = tempfile::tempdir().unwrap();
    let transport =
        ReqwestTransport::with_timeout(&format!("http://{proxy}"), Duration::from_secs(20))
            .unwrap();
    let client = Client::new(
        Outbox::open(outbox_dir.path()).unwrap(),
        Arc::new(transport),
        Arc::new(SystemClientClock),
    )
    .with_options(DrainOptions {
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(20),
        max_passes: Some(50_000),
        ..DrainOptions::default()
    });

    let photo_bytes = |n: u32| {
        let original = photo(n);
        PhotoBytes {
            copy: image::make_copy(&original).unwrap(),
            original: MediaBytes {
                content_type: image::content_type_of(&original),
                bytes: original,
            },
        }
    };
    // Every fifth capture is a moment of three photos (issue 27).
    let more = |n: u32| if n.is_multiple_of(5) { 2 } else { 0 };
    let mut entries = Vec::new();
    for n in 0..50 {
        let first = photo_bytes(n);
        let entry = client
            .capture(Capture {
                copy: first.copy,
                original: first.original,
                more_photos: (1..=more(n)).map(|k| photo_bytes(1000 * k + n)).collect(),
                text: Some(format!("Ausfahrt {n} freihalten")),
                caption: None,
                lang: Some("de".into()),
                captured_at_ms: None,
            })
            .unwrap();
        entries.push(entry);
    }

    let report = client.drain().await.unwrap();
    let resets = stats.resets.load(Ordering::SeqCst);
    let dropped = stats.dropped_replies.load(Ordering::SeqCst);
    eprintln!(
        "seed {seed}: {} requests in {} passes; {resets} resets, {dropped} dropped replies, {} delivered",
        report.requests,
        report.passes,
        stats.delivered.load(Ordering::SeqCst)
    );
    assert!(!report.gave_up, "seed {seed}: {report:?}");
    assert_eq!(report.entries_done.len(), 50, "seed {seed}");
    assert_eq!((report.pending_entries, report.parked_entries), (0, 0));
    assert!(resets > 0 && dropped > 0, "the link really was lossy");

    // Every capture landed whole: its moment, its media (a copy and an
    // original per photo, with the bytes' hashes and photo numbers),
    // exactly one turn.
    for stored in client.outbox().scan().unwrap().entries {
        assert_eq!(stored.state(), EntryState::Done);
        let (status, moment) = server
            .get(&format!("/api/moments/{}", stored.moment_id))
            .await;
        assert_eq!(status, 200, "seed {seed}: {moment}");
        let media = moment["media"].as_array().unwrap();
        assert_eq!(
            media.len(),
            2 * (1 + stored.more_photos.len()),
            "seed {seed}: {moment}"
        );
        let mut uploads = vec![
            (stored.copy_id, 0, "copy", &stored.copy),
            (stored.original_id, 0, "original", &stored.original),
        ];
        for more in &stored.more_photos {
            uploads.push((more.copy_id, more.photo, "copy", &more.copy));
            uploads.push((more.original_id, more.photo, "original", &more.original));
        }
        for (id, photo, role, file) in uploads {
            let item = media
                .iter()
                .find(|m| m["id"] == id.to_string().as_str())
                .unwrap_or_else(|| panic!("seed {seed}: no {role} in {moment}"));
            assert_eq!(item["role"], role);
            assert_eq!(item["photo"], photo);
            assert_eq!(item["sha256"], file.sha256.as_str());
            let bytes = std::fs::read(client.outbox().media_path(&stored, file)).unwrap();
            assert_eq!(sha256_hex(&bytes), file.sha256);
        }
        let turns = moment["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 1, "seed {seed}: {moment}");
        // Let the brain finish, so the log is complete before counting.
        let turn_id = turns[0].as_str().unwrap();
        let (status, turn) = server.get(&format!("/api/turns/{turn_id}?wait=10")).await;
        assert_eq!(status, 200);
        assert_eq!(turn["status"], "done", "{turn}");
        assert_eq!(turn["request_id"], stored.turn_request_id.as_str());
    }
    let (_, page) = server.get("/api/moments?limit=1000").await;
    assert_eq!(page["moments"].as_array().unwrap().len(), 50);
    assert_eq!(brain.calls(), 50, "the brain was asked once per capture");
    server.stop().await;

    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, code) in log_records(data.path()) {
        let name = OpKind::from_code(code).map_or("unknown", OpKind::name);
        *kinds.entry(name).or_default() += 1;
    }
    let expected: BTreeMap<&str, usize> = [
        ("moment.create", 50),
        ("media.put", 100 + 10 * 4),
        ("turn.start", 50),
        // Each turn's own outcome, written by the server, not the client.
        ("turn.finish", 50),
    ]
    .into_iter()
    .collect();
    assert_eq!(kinds, expected, "seed {seed}");
}
