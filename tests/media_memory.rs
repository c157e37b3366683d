//! A 30 MiB upload and download keep the server's memory bounded: the bytes
//! stream through a temporary file, never held whole. Measured as the peak
//! of the bytes allocated and not yet freed (a counting global allocator
//! around the system one, as log-format's `record_limit` test does), with
//! the server in this process: unlike the resident set, a count of
//! allocated bytes does not move with the allocator's page use or with how
//! busy the machine is.

use spark_test_support::server as common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{ulid, TestServer};
use serde_json::json;

const UPLOAD_BYTES: usize = 30 << 20;
/// Chunks of the upload as the client sends them.
const CHUNK_BYTES: usize = 64 * 1024;
/// Most bytes the upload and the download may hold at once beyond what was
/// held before (client and server together): buffers only. Holding the
/// upload would add 30 MiB.
const BOUND_BYTES: usize = 8 << 20;

/// Counts the bytes allocated and not yet freed, and their peak.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE_BYTES.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Starts a new measure: the peak from now on, over what is held now.
fn start_measure() -> usize {
    let live = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(live, Ordering::Relaxed);
    live
}

/// The byte `i` of the upload's pattern.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_30_mib_upload_and_download_keep_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data")).await;
    let moment = ulid();
    let (s, _) = server.post("/api/moments", json!({"id": moment})).await;
    assert_eq!(s, 201);

    // The body is made chunk by chunk as it is sent, never held whole.
    let chunks = futures_util::stream::iter((0..UPLOAD_BYTES).step_by(CHUNK_BYTES).map(|at| {
        let chunk: Vec<u8> = (at..(at + CHUNK_BYTES).min(UPLOAD_BYTES))
            .map(pattern)
            .collect();
        Ok::<_, std::io::Error>(chunk)
    }));
    let media = ulid();
    let before_upload = start_measure();
    let r = server
        .client
        .put(server.url(&format!("/api/media/{media}")))
        .header("X-Moment-Id", &moment)
        .header("X-Media-Role", "original")
        .header("Content-Type", "image/jpeg")
        .header("Content-Length", UPLOAD_BYTES)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    let upload_peak = PEAK_BYTES.load(Ordering::Relaxed) - before_upload;
    assert_eq!(r.status().as_u16(), 201, "{:?}", r.text().await);
    drop(r);

    let before_download = start_measure();
    let mut download = server
        .client
        .get(server.url(&format!("/api/media/{media}")))
        .send()
        .await
        .unwrap();
    assert_eq!(download.status().as_u16(), 200);
    let mut got = 0usize;
    while let Some(chunk) = download.chunk().await.unwrap() {
        assert!(
            chunk
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(got + i)),
            "the bytes served are the bytes sent"
        );
        got += chunk.len();
    }
    assert_eq!(got, UPLOAD_BYTES);
    let download_peak = PEAK_BYTES.load(Ordering::Relaxed) - before_download;
    eprintln!(
        "peak bytes held beyond the start: {upload_peak} during a 30 MiB upload, \
         {download_peak} while downloading it"
    );
    assert!(
        upload_peak < BOUND_BYTES,
        "the upload held {upload_peak} bytes"
    );
    assert!(
        download_peak < BOUND_BYTES,
        "the download held {download_peak} bytes"
    );
    server.stop().await;
}
