//! The shipper against `object_store`'s in-memory store wrapped to fail
//! puts on demand: failures are retried while writes go on, and a manifest
//! written by a newer epoch fences the shipper. With puts held and
//! recorded: blobs are checked and a lost one is recorded missing while the
//! log ships, blob puts overlap (a bounded number) with the log's and all
//! land before the manifest,
//! and the lag grows while a put hangs (newcomer findings 2 to 4). In `sync` mode: no
//! acknowledgment precedes the manifest put naming its op, writes wait
//! while the store is down, and a fence or a shutdown answers them. With
//! leases: an idle writer renews, a second engine is refused while the lease
//! is live and takes over by itself once it expired, and the old writer is
//! fenced when it comes back.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use spark_archive::layout::{
    blob_key, checkpoint_key, epoch_key, manifest_key, missing_key, segment_key, CheckpointEntry,
    ChunkHeader, EpochDoc, Manifest, MissingBlobDoc, SegmentEntry, CHECKPOINTS_LISTED,
};
use spark_archive::ArchiveStore;
use spark_log_format::format::{
    chain_value, segment_file_name, ChainValue, HEADER_CHAIN_START_OFFSET,
};
use spark_log_format::{Fs, HEADER_LEN};

use super::start::{claim_epoch, read_writer_file, take_epoch, write_writer_file, WriterFile};
use super::*;
use crate::clock::SystemClock;
use crate::config::Settings;
use crate::engine::{Command, CreateMoment, Engine, EngineError};

/// An in-memory store whose puts fail while `down` is set and wait while
/// `hold` is set; it records the order of the puts that landed and how
/// many blob puts overlapped.
#[derive(Debug, Default)]
struct Flaky {
    /// The objects (shared by two `Flaky`s: two engines' views of one
    /// store, one of them cut off while the other is not).
    inner: Arc<InMemory>,
    down: AtomicBool,
    /// Puts asked for (failed ones included).
    puts: AtomicUsize,
    hold: AtomicBool,
    /// Blob puts take 30 ms (to overlap).
    slow_blobs: AtomicBool,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Keys of the puts that landed, in order.
    keys: parking_lot::Mutex<Vec<String>>,
    /// Each put first sleeps this many ms (a slow store).
    put_delay_ms: AtomicU64,
    /// When above 0: every this-many-th put fails.
    fail_every: AtomicUsize,
    /// The highest `shipped_seq` of a manifest whose put has completed.
    stored_seq: AtomicU64,
    /// Each put of an epoch object waits this long first (a race window).
    epoch_put_delay_ms: u64,
    /// Deletes fail while set (an injected error between the retention
    /// pass's steps).
    deletes_down: AtomicBool,
    /// Keys deleted, in order.
    deleted: parking_lot::Mutex<Vec<String>>,
}

fn flaky() -> Flaky {
    Flaky::default()
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

fn refused() -> object_store::Error {
    object_store::Error::Generic {
        store: "Flaky",
        source: "connection refused (the test took the store down)".into(),
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let nth = self.puts.fetch_add(1, Ordering::SeqCst) + 1;
        if self.epoch_put_delay_ms > 0 && location.as_ref().contains("epoch/") {
            tokio::time::sleep(Duration::from_millis(self.epoch_put_delay_ms)).await;
        }
        let delay_ms = self.put_delay_ms.load(Ordering::SeqCst);
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        let every = self.fail_every.load(Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) || (every > 0 && nth.is_multiple_of(every)) {
            return Err(refused());
        }
        while self.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if location.as_ref().contains("blob/") && self.slow_blobs.load(Ordering::SeqCst) {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(30)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        let bytes: Vec<u8> = payload.iter().flat_map(|b| b.iter().copied()).collect();
        let result = self.inner.put_opts(location, payload, opts).await;
        self.keys.lock().push(location.to_string());
        let stored = result?;
        if let Some(number) = location
            .as_ref()
            .rsplit_once("manifest/")
            .and_then(|(_, n)| n.parse::<u64>().ok())
        {
            let manifest = Manifest::decode(&bytes, number).expect("the shipper's manifest");
            self.stored_seq
                .fetch_max(manifest.shipped_seq, Ordering::SeqCst);
        }
        Ok(stored)
    }

    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &StorePath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &StorePath) -> object_store::Result<()> {
        if self.deletes_down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.delete(location).await?;
        self.deleted.lock().push(location.to_string());
        Ok(())
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&StorePath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &StorePath, to: &StorePath) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(
        &self,
        from: &StorePath,
        to: &StorePath,
    ) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

fn create(n: u64) -> Command {
    Command::CreateMoment(CreateMoment {
        id: Some(crate::Id::from_parts(1_767_225_600_000 + n, n.into())),
        request_id: Some(format!("r-{n}")),
        text: Some(format!(
            "moment {n} with enough words to fill small segments"
        )),
        caption: None,
        lang: None,
        captured_at_ms: None,
        device: "t".into(),
    })
}

async fn engine_on(data: &std::path::Path) -> Arc<Engine> {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = 4096;
    open_engine(&settings)
}

async fn ship_every_20_ms(
    store: ArchiveStore,
    data: &std::path::Path,
    engine: &Arc<Engine>,
) -> Result<Shipping, ArchiveStartError> {
    start_on(
        store,
        data,
        Arc::clone(engine),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        Duration::from_millis(20),
    )
    .await
}

/// A writer on a new data directory that wrote creates `1..=writes` and
/// shipped them all.
async fn shipped_writer(
    store: &ArchiveStore,
    writes: u64,
) -> (tempfile::TempDir, Arc<Engine>, Shipping) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    for n in 1..=writes {
        engine.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    (dir, engine, shipping)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_puts_are_retried_while_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "shard".into());
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    // Idle: nothing is put but the epoch.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.latest_manifest().await.unwrap(), None);

    flaky.down.store(true, Ordering::SeqCst);
    for n in 1..=60 {
        engine.submit(create(n)).await.unwrap();
    }
    until("a failure", || shipping.status.failing().is_some()).await;
    assert_eq!(shipping.status.shipped_seq(), 0);
    assert_eq!(shipping.status.to_json()["status"], "failing");

    flaky.down.store(false, Ordering::SeqCst);
    let head = engine.head();
    until("catching up", || shipping.status.shipped_seq() == head.seq).await;
    assert!(shipping.status.failing().is_none());
    let manifest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!(manifest.shipped_seq, head.seq);
    assert_eq!(manifest.shipped_chain, head.chain);
    assert!(manifest.segments.len() >= 2, "4 KiB segments sealed");
    // Segments are gapless from seq 1 and chunks follow them.
    let mut next = 1;
    for s in &manifest.segments {
        assert_eq!(s.first_seq, next);
        next = s.last_seq + 1;
    }
    for c in &manifest.chunks {
        assert_eq!(c.first_seq, next);
        next = c.last_seq + 1;
    }
    assert_eq!(next, head.seq + 1);
    // Caught up and idle: no request at all.
    let puts = flaky.puts.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(flaky.puts.load(Ordering::SeqCst), puts);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_data_directory_on_the_same_prefix_is_refused() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let first = tempfile::tempdir().unwrap();
    let engine = engine_on(first.path()).await;
    let shipping = ship_every_20_ms(store.clone(), first.path(), &engine)
        .await
        .unwrap();
    shipping.stop().await;
    let second = tempfile::tempdir().unwrap();
    let other = engine_on(second.path()).await;
    let refused = ship_every_20_ms(store.clone(), second.path(), &other).await;
    let said = refused.as_ref().err().map(ToString::to_string);
    assert!(
        matches!(refused, Err(ArchiveStartError::Held { epoch: 1, .. })),
        "{:?}",
        refused.err()
    );
    // It says what to do next (newcomer finding 10).
    let said = said.unwrap();
    assert!(
        said.contains("new prefix") && said.contains("--take-over"),
        "{said}"
    );
    // The first one resumes its epoch.
    let again = ship_every_20_ms(store.clone(), first.path(), &engine)
        .await
        .unwrap();
    assert_eq!(again.status.epoch(), 1);
    for n in 1..=5 {
        engine.submit(create(n)).await.unwrap();
    }
    let head = engine.head();
    until("shipping", || again.status.shipped_seq() == head.seq).await;
    again.stop().await;
    engine.shutdown().await;
    other.shutdown().await;
    // This writer's directory behind its archive (an older copy) is
    // refused, and told how to go on.
    let older = tempfile::tempdir().unwrap();
    std::fs::copy(
        first.path().join(WRITER_FILE),
        older.path().join(WRITER_FILE),
    )
    .unwrap();
    let older_engine = engine_on(older.path()).await;
    let behind = ship_every_20_ms(store, older.path(), &older_engine)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        behind.contains("spark-replay restore")
            && behind.contains("--take-over")
            && behind.contains("new prefix"),
        "{behind}"
    );
    older_engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_of_a_newer_epoch_fences_the_shipper() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let store = ArchiveStore::new(Arc::new(InMemory::new()), String::new());
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    assert_eq!(shipping.status.epoch(), 1);
    // Another writer took the prefix over and wrote the next manifest.
    let theirs = Manifest {
        number: 1,
        epoch: 2,
        ..Manifest::empty()
    };
    store
        .put_create(&manifest_key("", 1), Bytes::from(theirs.encode()))
        .await
        .unwrap();
    // Acknowledged, or refused when the ship that meets the fence comes
    // before its answer (a write whose answer comes back after the fence
    // is refused too).
    match engine.submit(create(1)).await {
        Ok(_) | Err(EngineError::Fenced(_)) => {}
        Err(other) => panic!("{other:?}"),
    }
    until("the fence", || {
        shipping
            .status
            .failing()
            .is_some_and(|e| e.starts_with("fenced"))
    })
    .await;
    assert_eq!(shipping.status.shipped_seq(), 0);
    // The same data directory is refused at its next start: a manifest
    // of epoch 2 with no epoch/2 object is a gap (damage).
    shipping.stop().await;
    let again = ship_every_20_ms(store, dir.path(), &engine).await;
    assert!(
        matches!(&again, Err(ArchiveStartError::Store(StoreError::Gap { key, .. })) if key == "epoch/00000000000000000002"),
        "{:?}",
        again.err()
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_fences_the_old_engine_which_acknowledges_nothing_after() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let (old_dir, old, shipping) = shipped_writer(&store, 80).await;
    // Without --take-over a second directory is refused, naming the flag.
    let new_dir = tempfile::tempdir().unwrap();
    let refused = take_epoch(&store, new_dir.path(), 0).await.unwrap_err();
    assert!(refused.to_string().contains("--take-over"), "{refused}");

    // An empty directory takes over: the archive's log is fetched.
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let taken = take_over_on(store.clone(), new_dir.path(), max)
        .await
        .unwrap();
    assert_eq!((taken.epoch, taken.shipped_seq), (2, old.head().seq));
    let new = engine_on(new_dir.path()).await;
    assert_eq!(new.head(), old.head());
    let new_shipping = ship_every_20_ms(store.clone(), new_dir.path(), &new)
        .await
        .unwrap();
    assert_eq!(new_shipping.status.epoch(), 2);

    // The old engine acknowledges until its next ship meets the take-over
    // manifest, then nothing.
    let mut n = 1000;
    while shipping.status.fenced_at().is_none() {
        n += 1;
        let _ = old.submit(create(n)).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(n < 20_000, "never fenced");
    }
    let refused = old.submit(create(n + 1)).await.unwrap_err();
    assert!(matches!(refused, EngineError::Fenced(_)), "{refused:?}");
    assert_eq!(shipping.status.status_name(), "fenced");
    assert_eq!(shipping.status.to_json()["status"], "fenced");
    assert_eq!(metrics::get().fenced.get(), 1);

    // The new engine ships on from the take-over point, as epoch 2.
    for n in 5000..5040 {
        new.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        new_shipping.status.shipped_seq() == new.head().seq
    })
    .await;
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!(latest.epoch, 2);
    assert_eq!(latest.shipped_chain, new.head().chain);
    // The old directory is refused at its next start.
    shipping.stop().await;
    let again = take_epoch(&store, old_dir.path(), 0).await;
    assert!(matches!(
        again,
        Err(ArchiveStartError::Held { epoch: 2, .. })
    ));
    new_shipping.stop().await;
    new.shutdown().await;
    old.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_take_overs_at_once_exactly_one_wins() {
    let slow = Arc::new(Flaky {
        epoch_put_delay_ms: 100,
        ..flaky()
    });
    let store = ArchiveStore::new(slow, "p".into());
    let (_old_dir, old, shipping) = shipped_writer(&store, 30).await;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    // Both read epoch 1 as the latest, then race to create epoch 2.
    let tasks: Vec<_> = dirs
        .iter()
        .map(|d| {
            let (store, path) = (store.clone(), d.path().to_owned());
            tokio::spawn(async move { take_over_on(store, &path, max).await })
        })
        .collect();
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(taken) => won.push((i, taken)),
            Err(e) => lost.push((i, e)),
        }
    }
    assert_eq!((won.len(), lost.len()), (1, 1), "{lost:?}");
    assert_eq!(won[0].1.epoch, 2);
    let (loser, why) = &lost[0];
    assert!(
        matches!(why, ArchiveStartError::TakeOver(m) if m.contains("at the same time")),
        "{why}"
    );
    // The loser refuses to start; the winner ships as epoch 2.
    let loser_engine = engine_on(dirs[*loser].path()).await;
    let refused = ship_every_20_ms(store.clone(), dirs[*loser].path(), &loser_engine).await;
    assert!(matches!(
        refused,
        Err(ArchiveStartError::Held { epoch: 2, .. })
    ));
    let winner = won[0].0;
    let engine = engine_on(dirs[winner].path()).await;
    let ships = ship_every_20_ms(store.clone(), dirs[winner].path(), &engine)
        .await
        .unwrap();
    assert_eq!(ships.status.epoch(), 2);
    ships.stop().await;
    shipping.stop().await;
    for e in [engine, loser_engine, old] {
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_refuses_a_local_log_with_ops_the_archive_lacks() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let (_old_dir, old, shipping) = shipped_writer(&store, 5).await;
    // Another history: its own ops, never shipped.
    let other_dir = tempfile::tempdir().unwrap();
    let other = engine_on(other_dir.path()).await;
    for n in 100..=103 {
        other.submit(create(n)).await.unwrap();
    }
    other.shutdown().await;
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let refused = take_over_on(store.clone(), other_dir.path(), max)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ArchiveStartError::Diverged(m) if m.contains("not a prefix")),
        "{refused}"
    );
    // Nothing was taken: the old writer still holds epoch 1 and ships.
    assert_eq!(store.latest_epoch().await.unwrap().unwrap().epoch, 1);
    old.submit(create(6)).await.unwrap();
    until("shipped", || {
        shipping.status.shipped_seq() == old.head().seq
    })
    .await;
    assert!(shipping.status.fenced_at().is_none());
    shipping.stop().await;
    old.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_fetches_the_blobs_of_the_ops_it_fetched() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let (old_dir, old, shipping) = shipped_writer(&store, 3).await;
    let bytes = b"jpeg bytes of a photo";
    let sha256: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(bytes).into();
    let blobs_dir = spark_core::blob::blobs_dir(old_dir.path());
    std::fs::create_dir_all(&blobs_dir).unwrap();
    std::fs::write(spark_core::blob::blob_path(&blobs_dir, &sha256), bytes).unwrap();
    old.submit(Command::PutMedia(crate::engine::PutMedia {
        id: crate::Id::from_parts(1_767_225_700_000, 1),
        moment_id: crate::Id::from_parts(1_767_225_600_001, 1),
        role: spark_core::op::MediaRole::Copy,
        photo: 0,
        sha256,
        size_bytes: bytes.len() as u64,
        content_type: "image/jpeg".into(),
        device: "t".into(),
    }))
    .await
    .unwrap();
    until("shipped", || {
        shipping.status.shipped_seq() == old.head().seq
    })
    .await;

    let new_dir = tempfile::tempdir().unwrap();
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let taken = take_over_on(store.clone(), new_dir.path(), max)
        .await
        .unwrap();
    let new = engine_on(new_dir.path()).await;
    assert_eq!(new.head(), old.head());
    assert_eq!(
        taken
            .fetch_missing_blobs(&new, new_dir.path())
            .await
            .unwrap(),
        1
    );
    let fetched =
        spark_core::blob::blob_path(&spark_core::blob::blobs_dir(new_dir.path()), &sha256);
    assert_eq!(std::fs::read(fetched).unwrap(), bytes);
    // Nothing is missing any more.
    assert_eq!(
        taken
            .fetch_missing_blobs(&new, new_dir.path())
            .await
            .unwrap(),
        0
    );
    shipping.stop().await;
    new.shutdown().await;
    old.shutdown().await;
}

/// The value of an archive gauge as a scrape renders it now.
fn scraped(gauge: &str) -> f64 {
    let mut text = String::from("# EOF\n");
    metrics::render_into(&mut text);
    text.lines()
        .find_map(|l| l.strip_prefix(gauge)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {gauge} in {text}"))
        .parse()
        .unwrap()
}

fn sha256_of(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// A `media.put` for moment `moment` naming `bytes`; the blob is written
/// to `data`'s blob store as `stored` (None: not at all).
async fn put_media(
    engine: &Engine,
    data: &std::path::Path,
    moment: u64,
    bytes: &[u8],
    stored: Option<&[u8]>,
) -> [u8; 32] {
    let sha256 = sha256_of(bytes);
    let blobs = spark_core::blob::blobs_dir(data);
    std::fs::create_dir_all(&blobs).unwrap();
    if let Some(stored) = stored {
        std::fs::write(spark_core::blob::blob_path(&blobs, &sha256), stored).unwrap();
    }
    engine
        .submit(Command::PutMedia(crate::engine::PutMedia {
            id: crate::Id::from_parts(1_767_225_700_000 + moment, moment.into()),
            moment_id: crate::Id::from_parts(1_767_225_600_000 + moment, moment.into()),
            role: spark_core::op::MediaRole::Copy,
            photo: 0,
            sha256,
            size_bytes: bytes.len() as u64,
            content_type: "image/jpeg".into(),
            device: "t".into(),
        }))
        .await
        .unwrap();
    sha256
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_local_blob_is_never_shipped_and_the_log_keeps_shipping() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    for n in 1..=3 {
        engine.submit(create(n)).await.unwrap();
    }
    let good = put_media(
        &engine,
        dir.path(),
        1,
        b"a good photo",
        Some(b"a good photo"),
    )
    .await;
    let missing = put_media(&engine, dir.path(), 2, b"a lost photo", None).await;
    let damaged = put_media(
        &engine,
        dir.path(),
        3,
        b"a damaged photo",
        Some(b"a damaged phoTo"),
    )
    .await;
    for n in 4..=6 {
        engine.submit(create(n)).await.unwrap();
    }
    let head = engine.head();
    until("shipping past the lost blobs", || {
        shipping.status.shipped_seq() == head.seq
    })
    .await;
    assert!(shipping.status.failing().is_none());
    // The good blob is stored; the lost ones are not, each has its marker.
    assert_eq!(
        store.get(&blob_key("p", &good)).await.unwrap().unwrap(),
        &b"a good photo"[..]
    );
    for (sha, says) in [(missing, "missing: "), (damaged, "damaged: ")] {
        assert_eq!(store.get(&blob_key("p", &sha)).await.unwrap(), None);
        let bytes = store
            .get(&missing_key("p", &sha))
            .await
            .unwrap()
            .expect("a marker");
        let marker = MissingBlobDoc::decode(&bytes, &sha).unwrap();
        assert!(marker.reason.starts_with(says), "{}", marker.reason);
        assert!(marker.reason.contains(&hex::encode(sha)), "the path");
        assert_eq!(marker.epoch, 1);
        assert!(MissingBlobDoc::decode(&bytes, &good).is_err());
    }
    // Named in /readyz and the metrics.
    assert_eq!(shipping.status.blobs_missing(), 2);
    let json = shipping.status.to_json();
    assert_eq!(json["status"], "shipping", "{json}");
    assert_eq!(json["blobs_missing"], 2);
    let listed: Vec<&str> = json["missing_blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["sha256"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&hex::encode(missing).as_str()), "{json}");
    assert!(listed.contains(&hex::encode(damaged).as_str()), "{json}");
    assert!(scraped("spark_archive_blobs_missing") >= 2.0);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_put_a_few_at_a_time_beside_the_log_and_before_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    for n in 1..=24 {
        engine.submit(create(n)).await.unwrap();
        let bytes = format!("photo {n}").into_bytes();
        put_media(&engine, dir.path(), n, &bytes, Some(&bytes)).await;
    }
    let store_puts = Arc::new(Flaky::default());
    store_puts.slow_blobs.store(true, Ordering::SeqCst);
    let store = ArchiveStore::new(store_puts.clone(), String::new());
    let shipping = ship_every_20_ms(store, dir.path(), &engine).await.unwrap();
    let head = engine.head();
    until("shipping", || shipping.status.shipped_seq() == head.seq).await;
    let most = store_puts.most_in_flight.load(Ordering::SeqCst);
    assert!(
        (2..=BLOB_PUTS_AT_ONCE).contains(&most),
        "{most} blob puts at once"
    );
    let keys = store_puts.keys.lock().clone();
    let blobs: Vec<usize> = (0..keys.len())
        .filter(|&i| keys[i].starts_with("blob/"))
        .collect();
    assert_eq!(blobs.len(), 24);
    let first_log = keys
        .iter()
        .position(|k| k.starts_with("chunk/") || k.starts_with("segment/"))
        .unwrap();
    let first_manifest = keys
        .iter()
        .position(|k| k.starts_with("manifest/"))
        .unwrap();
    // The manifest, the commit point, comes after every object it names.
    assert!(
        blobs.iter().all(|&i| i < first_manifest) && first_log < first_manifest,
        "the manifest before an object of its ship: {keys:?}"
    );
    // The log's puts do not wait for the blobs' (three rounds of 30 ms
    // here): the chunk lands while blob puts are still in flight.
    assert!(
        first_log < *blobs.last().unwrap(),
        "the log waited for every blob: {keys:?}"
    );
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_puts_blobs_ahead_of_their_ship_and_the_ship_skips_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let store_puts = Arc::new(Flaky::default());
    let store = ArchiveStore::new(store_puts.clone(), String::new());
    // No ship for a minute: only the puts ahead happen meanwhile.
    let shipping = start_on(
        store,
        dir.path(),
        Arc::clone(&engine),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    engine.submit(create(1)).await.unwrap();
    let bytes = b"photo ahead".to_vec();
    put_media(&engine, dir.path(), 1, &bytes, Some(&bytes)).await;
    let blob_puts = || {
        store_puts
            .keys
            .lock()
            .iter()
            .filter(|k| k.starts_with("blob/"))
            .count()
    };
    until("the blob put ahead of its ship", || blob_puts() == 1).await;
    let keys = store_puts.keys.lock().clone();
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("manifest/") || k.starts_with("chunk/")),
        "a ship ran: {keys:?}"
    );
    assert_eq!(shipping.status.shipped_seq(), 0);
    // The last ship (at the stop) names the op, and does not put the
    // blob again.
    let head = engine.head();
    let status = Arc::clone(&shipping.status);
    shipping.stop().await;
    assert_eq!(status.shipped_seq(), head.seq);
    let keys = store_puts.keys.lock().clone();
    assert_eq!(blob_puts(), 1, "{keys:?}");
    let blob = keys.iter().position(|k| k.starts_with("blob/")).unwrap();
    let manifest = keys
        .iter()
        .position(|k| k.starts_with("manifest/"))
        .unwrap();
    assert!(blob < manifest, "{keys:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_grows_while_a_put_hangs_and_readyz_says_behind() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let store_puts = Arc::new(Flaky::default());
    let store = ArchiveStore::new(store_puts.clone(), String::new());
    let shipping = ship_every_20_ms(store, dir.path(), &engine).await.unwrap();
    assert_eq!(shipping.status.lag_seconds(), 0.0);
    store_puts.hold.store(true, Ordering::SeqCst);
    engine.submit(create(1)).await.unwrap();
    until("the lag to pass 0.3 s", || {
        shipping.status.lag_seconds() >= 0.3
    })
    .await;
    {
        let next = shipping.status.next.lock();
        let ts_ms = shipping.status.ts_ms_of(&next);
        assert!(ts_ms.is_some(), "the op's time is read from the log");
        assert_eq!(next.ts_ms, ts_ms, "and kept");
    }
    // Nothing failed, the put hangs: behind, with the lag, not "shipping".
    let json = shipping.status.to_json();
    assert_eq!(json["status"], "behind", "{json}");
    assert!(json["error"].is_null(), "{json}");
    assert!(json["lag_seconds"].as_f64().unwrap() >= 0.3, "{json}");
    // The gauge is read at the scrape, not when a ship ends.
    assert!(scraped("spark_archive_lag_seconds") >= 0.3);
    // The lag is the age of the oldest unshipped op: a later write does
    // not reset it.
    let before = shipping.status.lag_seconds();
    engine.submit(create(2)).await.unwrap();
    assert!(shipping.status.lag_seconds() >= before);
    store_puts.hold.store(false, Ordering::SeqCst);
    let head = engine.head();
    until("catching up", || shipping.status.shipped_seq() == head.seq).await;
    assert_eq!(shipping.status.lag_seconds(), 0.0);
    assert_eq!(shipping.status.to_json()["status"], "shipping");
    shipping.stop().await;
    engine.shutdown().await;
}

/// Settings for an engine on `data` with an archive in `mode` (shipping
/// every 20 ms to a store the test hands the shipper itself).
fn archived_settings(data: &std::path::Path, mode: crate::config::ArchiveMode) -> Settings {
    Settings {
        data_dir: data.to_owned(),
        archive: Some(crate::config::ArchiveSettings {
            url: "s3://unused/p".into(),
            endpoint: None,
            region: "us-east-1".into(),
            ship_interval_ms: 20,
            mode,
            lease_ms: 0,
            retention_ms: crate::config::ARCHIVE_RETENTION_MS_DEFAULT,
        }),
        ..Settings::default()
    }
}

/// The engine of `settings`, on the real file system.
fn open_engine(settings: &Settings) -> Arc<Engine> {
    Arc::new(
        Engine::open(
            settings,
            Arc::new(spark_log_format::OsFs),
            Arc::new(SystemClock),
        )
        .unwrap(),
    )
}

/// An engine with 4 KiB segments, opened for an archive in `mode` (in
/// `sync` mode it has an archive gate).
async fn engine_in(data: &std::path::Path, mode: crate::config::ArchiveMode) -> Arc<Engine> {
    let mut settings = archived_settings(data, mode);
    settings.log.segment_size_bytes = 4096;
    open_engine(&settings)
}

/// Hang guard for a write that is expected to finish (never a speed check).
const HANG_GUARD: Duration = Duration::from_secs(120);

async fn ship_sync(flaky: &Arc<Flaky>, data: &std::path::Path, engine: &Arc<Engine>) -> Shipping {
    assert!(engine.archive_gate().is_some(), "opened in sync mode");
    ship_every_20_ms(
        ArchiveStore::new(flaky.clone(), "shard".into()),
        data,
        engine,
    )
    .await
    .unwrap()
}

fn moment_id(n: u64) -> crate::Id {
    crate::Id::from_parts(1_767_225_600_000 + n, n.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_acknowledgments_never_precede_the_manifest_put() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    // A slow store that fails every 7th put: batches pile up during a
    // ship, and failed ships are retried.
    flaky.put_delay_ms.store(15, Ordering::SeqCst);
    flaky.fail_every.store(7, Ordering::SeqCst);
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    let writers: Vec<_> = (0..16u64)
        .map(|w| {
            let engine = Arc::clone(&engine);
            let flaky = Arc::clone(&flaky);
            tokio::spawn(async move {
                for i in 0..10u64 {
                    let n = 1 + w * 10 + i;
                    let outcome = tokio::time::timeout(HANG_GUARD, engine.submit(create(n)))
                        .await
                        .expect("hang guard")
                        .unwrap();
                    let stored = flaky.stored_seq.load(Ordering::SeqCst);
                    let seq = engine.read(|m| m.moments[&moment_id(n)].created_seq());
                    assert!(
                        seq <= stored,
                        "create {n} (seq {seq}) acknowledged before a manifest naming it was stored (stored up to {stored}): {outcome:?}"
                    );
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    // Group commit over the archive: fewer manifests than acknowledged
    // batches is the point, but any count is correct; every op is named.
    let manifest = shipping
        .status
        .shipped_seq()
        .max(flaky.stored_seq.load(Ordering::SeqCst));
    assert_eq!(manifest, engine.head().seq);
    // A retry of an archived write is answered at once, the same way.
    let again = engine.submit(create(1)).await.unwrap();
    assert!(matches!(
        again,
        crate::engine::Outcome::MomentCreated { created: false, .. }
    ));
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_writes_and_their_retries_wait_while_the_store_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    engine.submit(create(1)).await.unwrap();
    flaky.down.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.submit(create(2)).await }
    });
    // Durable locally and visible to readers, not acknowledged.
    until("the local commit", || engine.head().seq == 2).await;
    assert!(engine.read(|m| m.moments.contains_key(&moment_id(2))));
    // A retry of it (same request id): answered from the index, and held
    // the same way.
    let retry = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.submit(create(2)).await }
    });
    until("a failure", || shipping.status.failing().is_some()).await;
    until("the retry held", || {
        engine.archive_gate().unwrap().waiting_answers() == 2
    })
    .await;
    assert!(!first.is_finished() && !retry.is_finished());
    assert_eq!(shipping.status.shipped_seq(), 1);

    flaky.down.store(false, Ordering::SeqCst);
    let first = tokio::time::timeout(HANG_GUARD, first)
        .await
        .expect("hang guard")
        .unwrap()
        .unwrap();
    let retry = tokio::time::timeout(HANG_GUARD, retry)
        .await
        .expect("hang guard")
        .unwrap()
        .unwrap();
    assert!(flaky.stored_seq.load(Ordering::SeqCst) >= 2);
    assert!(matches!(
        first,
        crate::engine::Outcome::MomentCreated { created: true, .. }
    ));
    assert!(matches!(
        retry,
        crate::engine::Outcome::MomentCreated { created: false, .. }
    ));
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_media_blobs_are_stored_before_the_put_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    flaky.put_delay_ms.store(10, Ordering::SeqCst);
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    engine.submit(create(1)).await.unwrap();
    let media =
        crate::media::MediaStore::open(dir.path(), Arc::new(spark_log_format::OsFs)).unwrap();
    let body = futures_util::stream::iter(vec![Ok(bytes::Bytes::from_static(b"jpeg bytes"))]);
    let received = media.receive(Box::pin(body), 1 << 20).await.unwrap();
    media.commit(&received).await.unwrap();
    engine
        .submit(Command::PutMedia(crate::engine::PutMedia {
            id: crate::Id::from_parts(1_767_225_700_000, 1),
            moment_id: moment_id(1),
            role: spark_core::op::MediaRole::Copy,
            photo: 0,
            sha256: received.sha256,
            size_bytes: 10,
            content_type: "image/jpeg".into(),
            device: "t".into(),
        }))
        .await
        .unwrap();
    let key = StorePath::from(blob_key("shard", &received.sha256));
    let stored = flaky.inner.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(&stored[..], b"jpeg bytes");
    assert_eq!(flaky.stored_seq.load(Ordering::SeqCst), engine.head().seq);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_shutdown_answers_waiting_writes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    flaky.down.store(true, Ordering::SeqCst);
    let waiting = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.submit(create(1)).await }
    });
    until("the local commit", || engine.head().seq == 1).await;
    engine.shutdown().await;
    tokio::time::timeout(HANG_GUARD, shipping.stop())
        .await
        .expect("hang guard");
    let answer = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("hang guard")
        .unwrap();
    match answer {
        Err(crate::engine::EngineError::Unavailable(why)) => {
            assert!(why.contains("archived after the restart"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(flaky.stored_seq.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_a_fenced_shipper_fails_waiting_writes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    // Another writer took the prefix over and wrote the next manifest.
    let theirs = Manifest {
        number: 1,
        epoch: 2,
        ..Manifest::empty()
    };
    ArchiveStore::new(flaky.clone(), "shard".into())
        .put_create(&manifest_key("shard", 1), Bytes::from(theirs.encode()))
        .await
        .unwrap();
    let answer = tokio::time::timeout(HANG_GUARD, engine.submit(create(1)))
        .await
        .expect("hang guard");
    match answer {
        Err(crate::engine::EngineError::Fenced(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(engine.archive_gate().unwrap().closed().is_some());
    // Later writes are refused at once, never acknowledged.
    assert!(engine.submit(create(2)).await.is_err());
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_merges_chunks_so_manifests_stay_small() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_engine(&archived_settings(
        dir.path(),
        crate::config::ArchiveMode::Sync,
    ));
    let flaky = Arc::new(Flaky::default());
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    // One write at a time: a ship (a chunk) each, in one open segment.
    let writes = 300;
    for n in 1..=writes {
        engine.submit(create(n)).await.unwrap();
    }
    let store = ArchiveStore::new(flaky.clone(), "shard".into());
    let manifest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!(manifest.shipped_seq, writes);
    assert!(manifest.segments.is_empty());
    // 300 ships in levels of 16: 300 = 1*256 + 2*16 + 12.
    assert_eq!(manifest.chunks.len(), 1 + 2 + 12, "{:?}", manifest.chunks);
    // The chunks are the segment's bytes, in order, with their chains.
    let mut bytes = Vec::new();
    let segment =
        std::fs::read(spark_core::layout::log_dir(dir.path()).join(segment_file_name(1))).unwrap();
    let chain_start: ChainValue = segment[HEADER_CHAIN_START_OFFSET..HEADER_LEN]
        .try_into()
        .unwrap();
    let mut chain = chain_start;
    for entry in &manifest.chunks {
        let object = flaky
            .inner
            .get(&StorePath::from(entry.key.as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(*blake3::hash(&object).as_bytes(), entry.blake3);
        let (header, body) = ChunkHeader::decode(&object).unwrap();
        assert_eq!(header.offset, bytes.len() as u64);
        assert_eq!(header.chain_before, chain);
        bytes.extend_from_slice(body);
        chain = chain_value(&chain_start, &bytes);
        assert_eq!(header.chain_after, chain);
    }
    assert_eq!(&bytes[..], &segment[..bytes.len()]);
    assert_eq!(chain, engine.head().chain);
    shipping.stop().await;
    engine.shutdown().await;
}

/// A writer with a lease of `lease_ms`, shipping every 20 ms.
async fn ship_leased(
    store: ArchiveStore,
    data: &std::path::Path,
    engine: &Arc<Engine>,
    lease_ms: u64,
) -> Result<Shipping, ArchiveStartError> {
    start_on_leased(
        store,
        data,
        Arc::clone(engine),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        Duration::from_millis(20),
        lease_ms,
    )
    .await
}

/// Every manifest `1..=latest` of `store`, in order.
async fn history(store: &ArchiveStore) -> Vec<Manifest> {
    let latest = store
        .latest_manifest()
        .await
        .unwrap()
        .map_or(0, |m| m.number);
    let mut out = Vec::new();
    for n in 1..=latest {
        out.push(store.manifest(n).await.unwrap());
    }
    out
}

/// The history extends manifest by manifest (what `verify --from` checks,
/// ARCHIVE.md "Manifest history").
fn assert_extends(history: &[Manifest]) {
    for pair in history.windows(2) {
        assert_eq!(
            spark_archive::layout::extends(&pair[0], &pair[1]),
            Ok(()),
            "manifest {} -> {}",
            pair[0].number,
            pair[1].number
        );
    }
}

fn manifest_puts(flaky: &Flaky) -> usize {
    flaky
        .keys
        .lock()
        .iter()
        .filter(|k| k.contains("manifest/"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_off_an_idle_writer_puts_nothing_and_a_second_engine_is_refused() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let shipping = ship_leased(store.clone(), dir.path(), &engine, 0)
        .await
        .unwrap();
    assert_eq!(shipping.status.lease_ms(), 0);
    for n in 1..=5 {
        engine.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    // Idle for what would be several leases: not one request.
    let puts = flaky.puts.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(flaky.puts.load(Ordering::SeqCst), puts);
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!(latest.lease_ms, 0);
    assert!(!String::from_utf8_lossy(&latest.encode()).contains("lease_ms"));
    // A second engine with leases off is not even asked about the lease;
    // with leases on it finds no lease to expire: refused either way, and
    // told about --take-over.
    let other = tempfile::tempdir().unwrap();
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let off = take_over_if_expired_on(store.clone(), other.path(), max, 0, &SystemClock)
        .await
        .unwrap();
    assert!(off.is_none());
    let refused = take_epoch(&store, other.path(), 0).await.unwrap_err();
    assert!(refused.to_string().contains("--take-over"), "{refused}");
    let on = take_over_if_expired_on(store.clone(), other.path(), max, 60, &SystemClock)
        .await
        .expect_err("refused");
    let said = on.to_string();
    assert!(
        matches!(on, ArchiveStartError::Held { epoch: 1, .. }),
        "{said}"
    );
    assert!(
        said.contains("without a lease") && said.contains("--take-over"),
        "{said}"
    );
    assert_eq!(store.latest_epoch().await.unwrap().unwrap().epoch, 1);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_writer_renews_its_lease_about_every_third_of_it() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let lease_ms = 300;
    let shipping = ship_leased(store.clone(), dir.path(), &engine, lease_ms)
        .await
        .unwrap();
    assert_eq!(shipping.status.to_json()["lease_ms"], lease_ms);
    // Idle from the start: the first renewal is manifest 1, empty.
    until("a first renewal", || manifest_puts(&flaky) >= 1).await;
    let first = store.manifest(1).await.unwrap();
    assert_eq!((first.epoch, first.shipped_seq), (1, 0));
    assert_eq!(first.lease_ms, lease_ms);
    for n in 1..=30 {
        engine.submit(create(n)).await.unwrap();
    }
    let head = engine.head();
    until("shipped", || shipping.status.shipped_seq() == head.seq).await;
    let shipped = store.latest_manifest().await.unwrap().unwrap();
    // Idle for 1.5 s: about one renewal per lease_ms / 3 = 100 ms.
    let before = manifest_puts(&flaky);
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let renewals = manifest_puts(&flaky) - before;
    // Never more often than one per lease_ms / 3, and not much less.
    let most = idle_from.elapsed().as_millis() as usize / 100 + 1;
    assert!(
        (5..=most).contains(&renewals),
        "{renewals} renewals in {:?} with a 300 ms lease",
        idle_from.elapsed()
    );
    assert_eq!(engine.head(), head, "renewals add no op");
    let all = history(&store).await;
    assert_extends(&all);
    let renewed: Vec<&Manifest> = all.iter().filter(|m| m.number > shipped.number).collect();
    assert!(renewed.len() >= renewals);
    let mut written = shipped.written_ms;
    for m in &renewed {
        // The last manifest's entries, numbered next, written later.
        assert_eq!(
            (
                &m.segments,
                &m.chunks,
                m.shipped_seq,
                &m.shipped_chain,
                m.epoch
            ),
            (
                &shipped.segments,
                &shipped.chunks,
                shipped.shipped_seq,
                &shipped.shipped_chain,
                1
            )
        );
        assert_eq!(m.lease_ms, lease_ms);
        assert!(m.written_ms >= written);
        // Never near the lease: a renewal is due every third of it.
        assert!(
            m.written_ms - written < lease_ms,
            "{} ms between manifests {} and {}",
            m.written_ms - written,
            m.number - 1,
            m.number
        );
        written = m.written_ms;
    }
    // A take-over from an archive with renewals: the log is fetched and
    // equal (what restore reads too: the latest manifest's entries).
    shipping.stop().await;
    let new_dir = tempfile::tempdir().unwrap();
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let taken = take_over_on(store.clone(), new_dir.path(), max)
        .await
        .unwrap();
    assert_eq!(taken.shipped_seq, head.seq);
    let new = engine_on(new_dir.path()).await;
    assert_eq!(new.head(), head);
    new.shutdown().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_engine_waits_for_the_lease_then_takes_over_and_the_old_one_is_fenced() {
    // Two engines' views of one store: the old writer's can be cut off.
    let objects = Arc::new(InMemory::new());
    let old_side = Arc::new(Flaky {
        inner: Arc::clone(&objects),
        ..flaky()
    });
    let new_side = Arc::new(Flaky {
        inner: Arc::clone(&objects),
        ..flaky()
    });
    let old_store = ArchiveStore::new(old_side.clone(), "p".into());
    let new_store = ArchiveStore::new(new_side.clone(), "p".into());
    let lease_ms = 600;
    let old_dir = tempfile::tempdir().unwrap();
    let old = engine_on(old_dir.path()).await;
    let shipping = ship_leased(old_store.clone(), old_dir.path(), &old, lease_ms)
        .await
        .unwrap();
    for n in 1..=40 {
        old.submit(create(n)).await.unwrap();
    }
    let head = old.head();
    until("shipped", || shipping.status.shipped_seq() == head.seq).await;
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let new_dir = tempfile::tempdir().unwrap();

    // While the old writer runs (idle, renewing) its lease stays live, for
    // longer than the lease: refused, and told when it expires.
    let until_ms = spark_log_format::system_now_ms() + 2 * lease_ms;
    while spark_log_format::system_now_ms() < until_ms {
        let refused = take_over_if_expired_on(
            new_store.clone(),
            new_dir.path(),
            max,
            lease_ms,
            &SystemClock,
        )
        .await
        .expect_err("refused while the lease is live");
        let said = refused.to_string();
        assert!(
            matches!(refused, ArchiveStartError::Held { epoch: 1, .. }),
            "{said}"
        );
        assert!(
            said.contains("expires in") && said.contains("by this machine's clock"),
            "{said}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(new_store.latest_epoch().await.unwrap().unwrap().epoch, 1);
    assert!(shipping.status.fenced_at().is_none());

    // The old writer is cut off from the store (it cannot renew): once its
    // lease expired, the second engine takes over by itself.
    old_side.down.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let taken = loop {
        match take_over_if_expired_on(
            new_store.clone(),
            new_dir.path(),
            max,
            lease_ms,
            &SystemClock,
        )
        .await
        {
            Ok(Some(taken)) => break taken,
            Ok(None) => panic!("the prefix is held: not a normal start"),
            Err(ArchiveStartError::Held { .. }) => {
                assert!(cut_at.elapsed() < Duration::from_secs(20), "never expired");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        cut_at.elapsed() >= Duration::from_millis(lease_ms / 2),
        "taken over {:?} after the last possible renewal",
        cut_at.elapsed()
    );
    assert_eq!((taken.epoch, taken.shipped_seq), (2, head.seq));
    let epoch2 = new_store.latest_epoch().await.unwrap().unwrap();
    assert_eq!(epoch2.lease_ms, lease_ms);
    let new = engine_on(new_dir.path()).await;
    assert_eq!(new.head(), head);
    let new_shipping = ship_leased(new_store.clone(), new_dir.path(), &new, lease_ms)
        .await
        .unwrap();
    assert_eq!(new_shipping.status.epoch(), 2);

    // The old writer comes back, idle: its next renewal meets the new
    // epoch's manifest and it is fenced; it acknowledges nothing after.
    old_side.down.store(false, Ordering::SeqCst);
    until("the old writer's fence", || {
        shipping.status.fenced_at().is_some()
    })
    .await;
    let refused = old.submit(create(1000)).await.unwrap_err();
    assert!(matches!(refused, EngineError::Fenced(_)), "{refused:?}");
    assert_eq!(shipping.status.status_name(), "fenced");

    // The new one ships on; the history never interleaves two epochs.
    for n in 2000..2020 {
        new.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        new_shipping.status.shipped_seq() == new.head().seq
    })
    .await;
    let all = history(&new_store).await;
    assert_extends(&all);
    let first_new = all.iter().position(|m| m.epoch == 2).unwrap();
    assert!(all[first_new..].iter().all(|m| m.epoch == 2));
    assert_eq!(all.last().unwrap().shipped_chain, new.head().chain);
    // The old directory is refused at its next start, leases or not: the
    // new writer's lease is live.
    shipping.stop().await;
    let again = take_over_if_expired_on(
        old_store.clone(),
        old_dir.path(),
        max,
        lease_ms,
        &SystemClock,
    )
    .await
    .expect_err("refused");
    assert!(
        matches!(again, ArchiveStartError::Held { epoch: 2, .. }),
        "{again}"
    );
    new_shipping.stop().await;
    new.shutdown().await;
    old.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_a_lease_stops_advertising_one() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let leased = ship_leased(store.clone(), dir.path(), &engine, 300)
        .await
        .unwrap();
    engine.submit(create(1)).await.unwrap();
    until("shipped", || leased.status.shipped_seq() == 1).await;
    leased.stop().await;
    assert_eq!(
        store.latest_manifest().await.unwrap().unwrap().lease_ms,
        300
    );
    // The leased writer may have renewed before it stopped (a busy
    // machine): count from here.
    let stored = manifest_puts(&flaky);
    // Restarted with leases off: one manifest says so (else another engine
    // would take a lease nobody renews for expired), then no request.
    let plain = ship_leased(store.clone(), dir.path(), &engine, 0)
        .await
        .unwrap();
    until("the lease withdrawn", || {
        flaky.stored_seq.load(Ordering::SeqCst) == 1 && manifest_puts(&flaky) > stored
    })
    .await;
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!((latest.lease_ms, latest.shipped_seq), (0, 1));
    let puts = flaky.puts.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(flaky.puts.load(Ordering::SeqCst), puts);
    assert_extends(&history(&store).await);
    plain.stop().await;
    engine.shutdown().await;
}

#[test]
fn a_lease_is_read_from_the_holders_last_manifest_or_its_epoch() {
    let doc = EpochDoc {
        epoch: 2,
        writer: "w2".into(),
        taken_ms: 10_000,
        lease_ms: 900,
    };
    let manifest = |epoch, written_ms, lease_ms| Manifest {
        number: 7,
        epoch,
        written_ms,
        shipped_seq: 0,
        shipped_chain: [0; 32],
        segments: Vec::new(),
        chunks: Vec::new(),
        lease_ms,
        checkpoints: Vec::new(),
        compactions: Vec::new(),
        retained_from: 1,
    };
    // Before its first manifest: the epoch object's.
    let before = LeaseView::of(&doc, Some(&manifest(1, 50_000, 3000)));
    assert_eq!((before.renewed_ms, before.lease_ms), (10_000, 900));
    let none = LeaseView::of(&doc, None);
    assert_eq!(none, before);
    // After: its manifest's.
    let after = LeaseView::of(&doc, Some(&manifest(2, 20_000, 600)));
    assert_eq!((after.renewed_ms, after.lease_ms), (20_000, 600));
    // The longer of the two settings applies; expired at exactly the lease.
    assert_eq!(after.effective_ms(300), Some(600));
    assert_eq!(after.effective_ms(1200), Some(1200));
    assert_eq!(after.expires_in_ms(300, 20_100), Some(500));
    assert_eq!(after.expires_in_ms(300, 20_600), Some(0));
    assert_eq!(after.expires_in_ms(1200, 20_600), Some(600));
    // A clock behind the holder's: not expired (the age saturates).
    assert_eq!(after.expires_in_ms(300, 1_000), Some(19_600));
    // No lease: never.
    let unleased = LeaseView::of(&doc, Some(&manifest(2, 20_000, 0)));
    assert_eq!(unleased.expires_in_ms(300, u64::MAX), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_keeps_its_lease_while_a_local_fault_holds_its_ship_back() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let lease_ms = 300;
    let shipping = ship_leased(store.clone(), dir.path(), &engine, lease_ms)
        .await
        .unwrap();
    engine.submit(create(1)).await.unwrap();
    until("shipped", || shipping.status.shipped_seq() == 1).await;
    // A blob that cannot be read (a directory where its file should be):
    // not a loss, the ship fails with kind `blob` and is retried.
    let bytes = b"a photo behind a directory";
    let blob =
        spark_core::blob::blob_path(&spark_core::blob::blobs_dir(dir.path()), &sha256_of(bytes));
    std::fs::create_dir_all(&blob).unwrap();
    put_media(&engine, dir.path(), 1, bytes, None).await;
    until("the ship to fail", || {
        shipping
            .status
            .failing()
            .is_some_and(|e| e.starts_with("blob"))
    })
    .await;
    // The lease is renewed all the same: no standby takes over from an
    // archive that lacks a write this engine still holds.
    let before = store.latest_manifest().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(2 * lease_ms)).await;
    let after = store.latest_manifest().await.unwrap().unwrap();
    assert!(
        after.number >= before.number + 2,
        "manifests {} then {}",
        before.number,
        after.number
    );
    assert_eq!((after.shipped_seq, after.epoch), (1, 1));
    assert!(shipping
        .status
        .failing()
        .is_some_and(|e| e.starts_with("blob")));
    let other = tempfile::tempdir().unwrap();
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let refused = take_over_if_expired_on(store.clone(), other.path(), max, lease_ms, &SystemClock)
        .await
        .expect_err("the lease is live");
    assert!(
        matches!(refused, ArchiveStartError::Held { epoch: 1, .. }),
        "{refused}"
    );
    // Repaired: the op ships.
    std::fs::remove_dir(&blob).unwrap();
    std::fs::write(&blob, bytes).unwrap();
    let head = engine.head();
    until("shipped", || shipping.status.shipped_seq() == head.seq).await;
    assert_extends(&history(&store).await);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_renewals_while_idle_leave_writes_acknowledged_once_archived() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), crate::config::ArchiveMode::Sync).await;
    let flaky = Arc::new(Flaky::default());
    let store = ArchiveStore::new(flaky.clone(), "shard".into());
    let shipping = ship_leased(store.clone(), dir.path(), &engine, 150)
        .await
        .unwrap();
    for n in 1..=5 {
        engine.submit(create(n)).await.unwrap();
        assert!(flaky.stored_seq.load(Ordering::SeqCst) >= engine.head().seq);
    }
    let shipped = store.latest_manifest().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let renewed = store.latest_manifest().await.unwrap().unwrap();
    assert!(renewed.number >= shipped.number + 2, "{}", renewed.number);
    assert_eq!(
        (renewed.shipped_seq, &renewed.chunks),
        (shipped.shipped_seq, &shipped.chunks)
    );
    // A write after renewals: acknowledged once a manifest names it.
    engine.submit(create(6)).await.unwrap();
    assert_eq!(flaky.stored_seq.load(Ordering::SeqCst), engine.head().seq);
    assert_extends(&history(&store).await);
    shipping.stop().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_that_stopped_before_its_manifest_is_finished_at_the_next_leased_start() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let lease_ms = 150;
    let old_dir = tempfile::tempdir().unwrap();
    let old = engine_on(old_dir.path()).await;
    let shipping = ship_leased(store.clone(), old_dir.path(), &old, lease_ms)
        .await
        .unwrap();
    for n in 1..=10 {
        old.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == old.head().seq
    })
    .await;
    shipping.stop().await;
    // A standby claimed epoch 2 and stopped before its take-over manifest.
    let new_dir = tempfile::tempdir().unwrap();
    claim_epoch(&store, new_dir.path(), None, 2, lease_ms)
        .await
        .unwrap();
    assert_eq!(store.latest_manifest().await.unwrap().unwrap().epoch, 1);
    // Its next start (leases on, no --take-over) finishes the take-over.
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let taken = take_over_if_expired_on(store.clone(), new_dir.path(), max, lease_ms, &SystemClock)
        .await
        .unwrap()
        .expect("the take-over is finished");
    assert_eq!((taken.epoch, taken.shipped_seq), (2, old.head().seq));
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!((latest.epoch, latest.lease_ms), (2, lease_ms));
    let new = engine_on(new_dir.path()).await;
    assert_eq!(new.head(), old.head());
    let ships = ship_leased(store.clone(), new_dir.path(), &new, lease_ms)
        .await
        .unwrap();
    assert_eq!(ships.status.epoch(), 2);
    // Then a start of the same directory is the usual one.
    ships.stop().await;
    let again = take_over_if_expired_on(store.clone(), new_dir.path(), max, lease_ms, &SystemClock)
        .await
        .unwrap();
    assert!(again.is_none());
    assert_extends(&history(&store).await);
    new.shutdown().await;
    old.shutdown().await;
}

/// ARCHIVE.md "Checkpoint": with checkpoints on, a `sync`-mode writer
/// ships every checkpoint it writes (create-only, the local file's bytes,
/// keyed by seq and epoch) while writes go on being acknowledged once
/// archived; manifests list at most [`CHECKPOINTS_LISTED`], oldest first,
/// each covered by the archived log; an idle writer still lists the last
/// one (a manifest of the same entries); and no object is ever deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_ship_create_only_and_manifests_list_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = archived_settings(dir.path(), crate::config::ArchiveMode::Sync);
    settings.log.segment_size_bytes = 4096;
    settings.log.checkpoint_interval_ops = 40;
    let engine = open_engine(&settings);
    let flaky = Arc::new(Flaky::default());
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    let store = ArchiveStore::new(flaky.clone(), "shard".into());
    let mut stored_checkpoints = std::collections::BTreeSet::new();
    let deadline = Instant::now() + HANG_GUARD;
    let mut prev_listed = None;
    // Writes in rounds, with pauses so that the worker writes checkpoints
    // and the shipper (one look a second) ships several of them.
    for round in 0..5u64 {
        for i in 0..45u64 {
            let n = 1 + round * 45 + i;
            tokio::time::timeout(HANG_GUARD, engine.submit(create(n)))
                .await
                .expect("hang guard")
                .unwrap();
        }
        // Until the newest local checkpoint is listed.
        loop {
            assert!(Instant::now() < deadline, "checkpoints not shipped");
            let newest_local = spark_core::checkpoint::list(dir.path())
                .first()
                .map(|(seq, _)| *seq);
            let manifest = store.latest_manifest().await.unwrap().unwrap();
            for c in &manifest.checkpoints {
                stored_checkpoints.insert(c.key.clone());
            }
            let listed = manifest.checkpoints.last().map(|c| c.seq);
            // Each round writes more than an interval: a newer checkpoint
            // is written, then listed.
            if newest_local.is_some() && listed == newest_local && listed > prev_listed {
                prev_listed = listed;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let manifest = store.latest_manifest().await.unwrap().unwrap();
    assert!(manifest.checkpoints.len() <= CHECKPOINTS_LISTED);
    assert!(
        manifest.checkpoints.windows(2).all(|w| w[0].seq < w[1].seq),
        "{:?}",
        manifest.checkpoints
    );
    assert!(
        stored_checkpoints.len() > CHECKPOINTS_LISTED,
        "{stored_checkpoints:?}"
    );
    for c in &manifest.checkpoints {
        assert!(c.seq <= manifest.shipped_seq);
        assert_eq!(c.key, checkpoint_key("shard", c.seq, 1));
        let object = store.get_listed(&c.key, c.bytes, &c.blake3).await.unwrap();
        let header = spark_core::checkpoint::decode_header(&object).unwrap();
        assert_eq!((header.at.seq, header.ts_ms), (c.seq, c.ts_ms));
        assert_eq!(header.at.chain, c.chain);
    }
    // Retired from the list, never deleted.
    for key in &stored_checkpoints {
        assert!(store.exists(key).await.unwrap(), "{key}");
    }
    // Every checkpoint put was create-only: the keys were put once each.
    let keys = flaky.keys.lock().clone();
    let puts = keys.iter().filter(|k| k.contains("/checkpoint/")).count();
    let distinct: std::collections::BTreeSet<_> =
        keys.iter().filter(|k| k.contains("/checkpoint/")).collect();
    assert_eq!(puts, distinct.len(), "{keys:?}");
    shipping.stop().await;
}

/// An engine on `data` (4 KiB segments, no archive gate: `async`
/// shipping) writing a checkpoint every `interval_ops` ops.
fn engine_checkpointing(data: &std::path::Path, interval_ops: u64) -> Arc<Engine> {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = 4096;
    settings.log.checkpoint_interval_ops = interval_ops;
    open_engine(&settings)
}

/// Waits until the latest manifest's newest checkpoint satisfies `ok`.
async fn until_listed(store: &ArchiveStore, ok: impl Fn(&CheckpointEntry) -> bool) -> Manifest {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(m) = store.latest_manifest().await.unwrap() {
            if m.checkpoints.last().is_some_and(&ok) {
                return m;
            }
        }
        assert!(Instant::now() < deadline, "no such checkpoint listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A take-over keeps the archived checkpoints (they stand at seqs of the
/// log both writers share) and the new writer's own are keyed by its
/// epoch; the fenced writer lists none after the take-over point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_keeps_the_archived_checkpoints_and_ships_its_own() {
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let old_dir = tempfile::tempdir().unwrap();
    let old = engine_checkpointing(old_dir.path(), 30);
    let shipping = ship_every_20_ms(store.clone(), old_dir.path(), &old)
        .await
        .unwrap();
    for n in 1..=100 {
        old.submit(create(n)).await.unwrap();
    }
    let before = until_listed(&store, |c| c.key.ends_with("-00000000000000000001.ckpt")).await;
    let max = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    let new_dir = tempfile::tempdir().unwrap();
    let taken = take_over_on(store.clone(), new_dir.path(), max)
        .await
        .unwrap();
    assert_eq!(taken.epoch, 2);
    let takeover = store.latest_manifest().await.unwrap().unwrap();
    assert_eq!(takeover.epoch, 2);
    // The take-over manifest lists what the one before it listed.
    assert!(takeover.number > before.number);
    let last_old = store.manifest(takeover.number - 1).await.unwrap();
    assert!(!takeover.checkpoints.is_empty());
    assert_eq!(takeover.checkpoints, last_old.checkpoints);
    let new = engine_checkpointing(new_dir.path(), 30);
    let new_shipping = ship_every_20_ms(store.clone(), new_dir.path(), &new)
        .await
        .unwrap();
    // The old writer goes on until fenced; none of its later ops is listed.
    let mut n = 1000;
    while shipping.status.fenced_at().is_none() {
        n += 1;
        let _ = old.submit(create(n)).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(n < 20_000, "never fenced");
    }
    for n in 5000..5080 {
        new.submit(create(n)).await.unwrap();
    }
    let after = until_listed(&store, |c| c.key.ends_with("-00000000000000000002.ckpt")).await;
    for c in &after.checkpoints {
        assert!(c.seq <= after.shipped_seq);
        if c.key.ends_with("-00000000000000000001.ckpt") {
            assert!(c.seq <= taken.shipped_seq, "{c:?}");
        }
        // Each listed checkpoint is valid against the new writer's log.
        let object = store.get_listed(&c.key, c.bytes, &c.blake3).await.unwrap();
        let header = spark_core::checkpoint::decode_header(&object).unwrap();
        let log_dir = spark_core::layout::log_dir(new_dir.path());
        assert_eq!(
            spark_core::checkpoint::chain_at(
                &log_dir,
                header.at.segment_first_seq,
                header.at.frame_end_offset
            )
            .unwrap(),
            header.at.chain,
            "{c:?}"
        );
    }
    new_shipping.stop().await;
    shipping.stop().await;
    new.shutdown().await;
    old.shutdown().await;
}

/// A writer of creates `1..=40` shipped in two rounds (so at least two
/// manifests), on `store` over `inner`.
async fn writer_of_two_rounds(store: &ArchiveStore) -> (tempfile::TempDir, Arc<Engine>, Shipping) {
    let (dir, engine, shipping) = shipped_writer(store, 20).await;
    for n in 21..=40 {
        engine.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    (dir, engine, shipping)
}

/// A well-formed manifest under this writer's epoch at the
/// number it needs, which it did not store, is never adopted: one that
/// does not extend the manifest the state is at (before: adopted when its
/// shipped_seq was not above the ship's, rolling the state back), and one
/// that extends it but whose last entry is not the local log's (before:
/// a sealed segment last was adopted unchecked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_of_this_epoch_the_writer_did_not_store_is_never_adopted() {
    for forge in ["rolls back", "another segment"] {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        let (_dir, engine, shipping) = writer_of_two_rounds(&store).await;
        let latest = store.latest_manifest().await.unwrap().unwrap();
        let number = latest.number + 1;
        let forged = match forge {
            "rolls back" => Manifest {
                number,
                epoch: 1,
                written_ms: 1,
                ..Manifest::empty()
            },
            _ => {
                let first_seq = latest
                    .chunks
                    .first()
                    .map_or(latest.shipped_seq + 1, |c| c.segment_first_seq);
                let mut segments = latest.segments.clone();
                segments.push(SegmentEntry {
                    key: segment_key("p", first_seq, 1),
                    first_seq,
                    last_seq: latest.shipped_seq + 1,
                    bytes: 200,
                    blake3: [0xab; 32],
                    chain_end: [0xcd; 32],
                });
                Manifest {
                    number,
                    epoch: 1,
                    written_ms: 1,
                    shipped_seq: latest.shipped_seq + 1,
                    shipped_chain: [0xcd; 32],
                    segments,
                    chunks: Vec::new(),
                    lease_ms: 0,
                    checkpoints: Vec::new(),
                    compactions: Vec::new(),
                    retained_from: latest.retained_from,
                }
            }
        };
        // The forgery is the kind meant: not extending, or extending.
        let extending = spark_archive::layout::extends(&latest, &forged).is_ok();
        assert_eq!(extending, forge == "another segment", "{forge}");
        store
            .put_create(&manifest_key("p", number), Bytes::from(forged.encode()))
            .await
            .unwrap();
        engine.submit(create(41)).await.unwrap();
        until("the refusal", || {
            shipping
                .status
                .failing()
                .is_some_and(|e| e.contains("is not one this writer stored"))
        })
        .await;
        let failing = shipping.status.failing().unwrap();
        assert!(
            failing.contains(&manifest_key("p", number)),
            "{forge}: {failing}"
        );
        assert_eq!(shipping.status.shipped_seq(), latest.shipped_seq, "{forge}");
        assert!(
            !store.exists(&manifest_key("p", number + 1)).await.unwrap(),
            "{forge}: shipped past the forged manifest"
        );
        shipping.stop().await;
        engine.shutdown().await;
    }
}

/// The writer refuses to start over a gap, naming the
/// missing manifest (before: it resumed from the manifest before the gap,
/// stored a new one there and adopted the old ones after it), and over a
/// lost epoch object (before: it claimed epoch 1 again), creating nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_refuses_to_start_over_a_gap_naming_it() {
    for lost in ["manifest", "epoch"] {
        let inner = Arc::new(InMemory::new());
        let store = ArchiveStore::new(inner.clone(), "p".into());
        let (dir, engine, shipping) = writer_of_two_rounds(&store).await;
        shipping.stop().await;
        let latest = store.latest_manifest().await.unwrap().unwrap().number;
        assert!(latest >= 2, "{latest}");
        let key = match lost {
            "manifest" => manifest_key("p", latest / 2),
            _ => epoch_key("p", 1),
        };
        inner.delete(&StorePath::from(key.as_str())).await.unwrap();
        let refused = ship_every_20_ms(store.clone(), dir.path(), &engine).await;
        assert!(
            matches!(&refused, Err(ArchiveStartError::Store(StoreError::Gap { key: k, .. })) if *k == key),
            "{lost}: {:?}",
            refused.err()
        );
        assert!(refused.err().unwrap().to_string().contains(&key));
        assert!(!store.exists(&key).await.unwrap(), "{key} put again");
        assert!(!store.exists(&manifest_key("p", latest + 1)).await.unwrap());
        engine.shutdown().await;
    }
}

/// Async RPO under load: the shipper slept a whole interval
/// after each ship, so with slow puts ships started `interval + ship time`
/// apart and an op acknowledged just after a ship read the head waited up
/// to twice the ship time plus the interval. Ships now start an interval
/// after the last one started. A store whose every put takes 150 ms (a
/// ship: chunk and manifest, 300 ms) and a 400 ms interval: in 6 s of
/// steady writes the old cadence (700 ms) stores at most 9 manifests, the
/// new one (400 ms) about 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ships_start_an_interval_apart_however_long_a_ship_takes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    let slow = Arc::new(flaky());
    let store = ArchiveStore::new(slow.clone(), "p".into());
    let shipping = start_on(
        store,
        dir.path(),
        Arc::clone(&engine),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        Duration::from_millis(400),
    )
    .await
    .unwrap();
    slow.put_delay_ms.store(150, Ordering::SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (engine, stop) = (Arc::clone(&engine), Arc::clone(&stop));
        async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                engine.submit(create(n)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let manifests = || {
        slow.keys
            .lock()
            .iter()
            .filter(|k| k.contains("manifest/"))
            .count()
    };
    // Let the first ship land, then count over 6 s.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = manifests();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let stored = manifests() - before;
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    assert!(
        stored >= 12,
        "{stored} manifests in 6 s: ships start further apart than the interval"
    );
    shipping.stop().await;
    engine.shutdown().await;
}

/// The writer-epoch file, what fencing rests on, written through `MemFs`
/// and crashed after each of its file system calls (the cut between the
/// rename and the directory fsync included), then power-cut in every
/// mode: it reads back as the old record or the new one, whole, never torn
/// or unreadable; a write that returned `Ok` survives; a failed one is an
/// error naming the file.
#[test]
fn the_writer_file_is_old_or_new_whole_after_a_power_cut() {
    use spark_log_format::MemFs;
    let data = Path::new("/data");
    let record = |epoch| WriterFile {
        writer: "0123abcd".into(),
        epoch,
    };
    let disk = |old: Option<u64>| {
        let fs = MemFs::new();
        match old {
            Some(epoch) => fs.insert_durable(
                &data.join(WRITER_FILE),
                &serde_json::to_vec(&record(epoch)).unwrap(),
            ),
            None => {
                fs.create_dir_all(data).unwrap();
                fs.sync_dir(Path::new("/")).unwrap();
            }
        }
        fs
    };
    for old in [None, Some(3)] {
        MemFs::every_crash_point(
            || disk(old),
            |fs| write_writer_file(fs, data, &record(4)),
            8,
            |fs, written, point| {
                let back = read_writer_file(fs, data)
                    .unwrap_or_else(|e| panic!("crash after {point:?}: {e}"));
                let epoch = back.as_ref().map(|b| b.epoch);
                assert!(
                    epoch == old || epoch == Some(4),
                    "crash after {point:?}: {epoch:?}"
                );
                if let Some(back) = back {
                    assert_eq!(back.writer, "0123abcd");
                }
                match written {
                    Ok(()) => assert_eq!(epoch, Some(4), "acknowledged, then lost"),
                    Err(e) => assert!(e.to_string().contains("archive-writer"), "{e}"),
                }
            },
        );
    }
}

/// An error injected at each file system call of writing the writer-epoch
/// file (create, write, fsync, rename, directory fsync) refuses the claim
/// with an error naming the file (the start is refused: no epoch is taken
/// on a record that may not be durable), and the file there is the old
/// record or the new one, whole.
#[test]
fn an_injected_error_writing_the_writer_file_refuses_and_leaves_it_whole() {
    use spark_log_format::{Fault, FaultOp, FaultyFs, MemFs};
    let data = Path::new("/data");
    let record = |epoch| WriterFile {
        writer: "0123abcd".into(),
        epoch,
    };
    for op in FaultOp::DURABLE_WRITE {
        let mem = Arc::new(MemFs::new());
        mem.insert_durable(
            &data.join(WRITER_FILE),
            &serde_json::to_vec(&record(3)).unwrap(),
        );
        let fs = FaultyFs::new(mem.clone());
        fs.fail_next(op, Fault::Os(5));
        let e = write_writer_file(&fs, data, &record(4)).expect_err("the fault is returned");
        assert!(
            matches!(&e, ArchiveStartError::Local { path, .. } if path.ends_with(WRITER_FILE)),
            "{op:?}: {e}"
        );
        let epoch = read_writer_file(mem.as_ref(), data)
            .unwrap_or_else(|e| panic!("{op:?}: {e}"))
            .map(|b| b.epoch);
        match op {
            // The rename happened: the new record is in place, durable or
            // not.
            FaultOp::SyncDir => assert_eq!(epoch, Some(4), "{op:?}"),
            _ => assert_eq!(epoch, Some(3), "{op:?}"),
        }
    }
}

fn delete(n: u64) -> Command {
    Command::DeleteMoment(crate::engine::DeleteMoment {
        id: moment_id(n),
        request_id: None,
        if_match: None,
        device: "t".into(),
    })
}

/// A compactor on the engine's data directory (`erase_after_ms` 0 in
/// `settings`: a deleted moment is due at once).
fn compactor(settings: &Settings, engine: &Arc<Engine>) -> crate::retention::Compactor {
    let fs: Arc<dyn Fs> = Arc::new(spark_log_format::OsFs);
    let media = crate::media::MediaStore::open(&settings.data_dir, Arc::clone(&fs)).unwrap();
    crate::retention::Compactor::new(
        settings,
        Arc::clone(engine),
        media,
        fs,
        Arc::new(SystemClock),
    )
}

/// The local log of `data` as a new directory fetched from the latest
/// manifest (a restore's catch-up), opened: its mirror's digest, and
/// whether each of `erased` is erased there.
async fn fetched_copy(store: &ArchiveStore, erased: &[u64]) -> (String, Vec<bool>) {
    let latest = store.latest_manifest().await.unwrap().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let log_dir = spark_core::layout::log_dir(copy.path());
    std::fs::create_dir_all(&log_dir).unwrap();
    super::takeover::catch_up(
        store,
        &log_dir,
        Some(&latest),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        false,
        false,
    )
    .await
    .unwrap();
    let engine = open_engine(&Settings {
        data_dir: copy.path().to_owned(),
        ..Settings::default()
    });
    let out = engine.read(|m| {
        (
            m.digest(),
            erased.iter().map(|n| m.is_erased(moment_id(*n))).collect(),
        )
    });
    engine.shutdown().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mode_ships_a_compaction_and_a_restart_before_its_ship_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = archived_settings(dir.path(), crate::config::ArchiveMode::Sync);
    settings.log.segment_size_bytes = 4096;
    settings.retention.erase_after_ms = 0;
    let engine = open_engine(&settings);
    let flaky = Arc::new(Flaky::default());
    flaky.put_delay_ms.store(5, Ordering::SeqCst);
    let shipping = ship_sync(&flaky, dir.path(), &engine).await;
    let store = ArchiveStore::new(flaky.clone(), "shard".into());
    for n in 1..=80 {
        engine.submit(create(n)).await.unwrap();
    }
    for n in [5, 40] {
        engine.submit(delete(n)).await.unwrap();
    }
    // Writes go on while the compaction commits and ships: each is
    // acknowledged only once a manifest naming it is stored.
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (engine, flaky) = (Arc::clone(&engine), Arc::clone(&flaky));
            tokio::spawn(async move {
                for i in 0..15u64 {
                    let n = 1000 + w * 100 + i;
                    tokio::time::timeout(HANG_GUARD, engine.submit(create(n)))
                        .await
                        .expect("hang guard")
                        .unwrap();
                    let seq = engine.read(|m| m.moments[&moment_id(n)].created_seq());
                    let stored = flaky.stored_seq.load(Ordering::SeqCst);
                    assert!(
                        seq <= stored,
                        "create {n} (seq {seq}) acknowledged before it was archived ({stored})"
                    );
                }
            })
        })
        .collect();
    let report = compactor(&settings, &engine).pass().await.unwrap();
    assert_eq!(report.erased.len(), 2, "{report:?}");
    for writer in writers {
        writer.await.unwrap();
    }
    engine.submit(create(2000)).await.unwrap();
    until("the compaction shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    let manifests = history(&store).await;
    assert_extends(&manifests);
    let applied: Vec<_> = manifests
        .iter()
        .filter(|m| !m.compactions.is_empty())
        .collect();
    assert_eq!(applied.len(), 1, "one manifest applies the compaction");
    let latest = manifests.last().unwrap();
    assert!(latest.segments.iter().any(|s| s.key.contains("-c")));
    // Its checkpoints, if any, stand before the first rewritten segment.
    let first_rewritten = applied[0].compactions[0].segments[0].first_seq;
    assert!(applied[0]
        .checkpoints
        .iter()
        .all(|c| c.seq < first_rewritten));
    let (digest, erased) = fetched_copy(&store, &[5, 40, 6]).await;
    assert_eq!(digest, engine.read(|m| m.digest()));
    assert_eq!(erased, [true, true, false]);
    shipping.stop().await;
    engine.shutdown().await;

    // A compaction while no shipper runs (a crash before its ship): the
    // next start resumes from the manifest before it and ships it.
    let mut settings = archived_settings(dir.path(), crate::config::ArchiveMode::Async);
    settings.log.segment_size_bytes = 4096;
    settings.retention.erase_after_ms = 0;
    let engine = open_engine(&settings);
    for n in [6, 60] {
        engine.submit(delete(n)).await.unwrap();
    }
    let report = compactor(&settings, &engine).pass().await.unwrap();
    assert_eq!(report.erased.len(), 2, "{report:?}");
    engine.submit(create(3000)).await.unwrap();
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    until("the second compaction shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    let manifests = history(&store).await;
    assert_extends(&manifests);
    assert_eq!(
        manifests
            .iter()
            .filter(|m| !m.compactions.is_empty())
            .count(),
        2
    );
    let (digest, erased) = fetched_copy(&store, &[5, 6, 60, 7]).await;
    assert_eq!(digest, engine.read(|m| m.digest()));
    assert_eq!(erased, [true, true, true, false]);
    shipping.stop().await;
    engine.shutdown().await;
}

/// A writer with `[archive] retention_ms` = `retention_ms`, shipping every
/// 20 ms.
async fn ship_retained(
    store: ArchiveStore,
    data: &std::path::Path,
    engine: &Arc<Engine>,
    retention_ms: u64,
) -> Shipping {
    start_on_retained(
        store,
        data,
        Arc::clone(engine),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        Duration::from_millis(20),
        0,
        retention_ms,
    )
    .await
    .unwrap()
}

/// Every key the manifests `from..=to` name (segments, chunks,
/// checkpoints).
async fn named_by(store: &ArchiveStore, from: u64, to: u64) -> std::collections::HashSet<String> {
    let mut named = std::collections::HashSet::new();
    for n in from..=to {
        let m = store.manifest(n).await.unwrap();
        named.extend(m.segments.iter().map(|s| s.key.clone()));
        named.extend(m.chunks.iter().map(|c| c.key.clone()));
        named.extend(m.checkpoints.iter().map(|c| c.key.clone()));
    }
    named
}

/// ARCHIVE.md "Retention": with deletes failing, the pass still raises the
/// floor (its commit point) and the archive reads as before; once deletes
/// work, the manifests below the floor are gone and so is every log object
/// no retained manifest names (the chunks folded into sealed segments),
/// and nothing a retained manifest names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_exactly_what_no_retained_manifest_names() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    flaky.deletes_down.store(true, Ordering::SeqCst);
    let retention_ms = 400;
    let shipping = ship_retained(store.clone(), dir.path(), &engine, retention_ms).await;
    for n in 1..=40 {
        engine.submit(create(n)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    tokio::time::sleep(Duration::from_millis(retention_ms + 100)).await;
    for n in 41..=60 {
        engine.submit(create(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    // The floor is raised even though nothing can be deleted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let raised = loop {
        let latest = store.latest_manifest().await.unwrap().unwrap();
        if latest.retained_from > 1 {
            break latest;
        }
        assert!(Instant::now() < deadline, "the floor was never raised");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(flaky.deleted.lock().is_empty());
    assert!(store.exists(&manifest_key("p", 1)).await.unwrap());
    let (_, low) = store.latest_manifest_and_low().await.unwrap().unwrap();
    assert_eq!(low, 1, "nothing deleted: the whole history is there");
    // Deletes work again: the next pass finishes the job.
    flaky.deletes_down.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (latest, low) = store.latest_manifest_and_low().await.unwrap().unwrap();
        let deleted_chunks = flaky.deleted.lock().iter().any(|k| k.contains("/chunk/"));
        if low == latest.retained_from && low >= raised.retained_from && deleted_chunks {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "below-floor manifests never deleted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shipping.stop().await;
    let (latest, low) = store.latest_manifest_and_low().await.unwrap().unwrap();
    let named = named_by(&store, low, latest.number).await;
    let deleted = flaky.deleted.lock().clone();
    for key in &deleted {
        assert!(
            !named.contains(key),
            "{key} is named by a retained manifest"
        );
    }
    for n in 1..low {
        assert!(deleted.contains(&manifest_key("p", n)), "manifest {n}");
    }
    // Every old log object that remains is named; every named one is there.
    let horizon = spark_log_format::system_now_ms() - retention_ms;
    for family in ["segment", "chunk", "checkpoint"] {
        for (key, _, modified_ms) in store.list_family_dated(family).await.unwrap() {
            assert!(
                named.contains(&key) || modified_ms > horizon,
                "{key} is named by no retained manifest"
            );
        }
    }
    for key in &named {
        assert!(store.exists(key).await.unwrap(), "{key} is gone");
    }
    // Epochs and the latest state stay readable.
    assert!(store.exists(&epoch_key("p", 1)).await.unwrap());
    assert_eq!(latest.shipped_seq, engine.head().seq);
    engine.shutdown().await;
}

/// A writer fenced by a newer epoch deletes nothing: its pass starts with
/// the fencing HEAD (here the only request an idle writer makes, so the
/// pass is what finds the fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_deletes_nothing() {
    let flaky = Arc::new(flaky());
    let store = ArchiveStore::new(flaky.clone(), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_on(dir.path()).await;
    // Long enough that no pass finds anything old before the fence.
    let retention_ms = 1500;
    let shipping = ship_retained(store.clone(), dir.path(), &engine, retention_ms).await;
    // Two ships at least: the floor can then move once the second
    // manifest is old enough, so a pass comes due.
    for round in 0..2 {
        for n in 1..=20 {
            engine.submit(create(round * 20 + n)).await.unwrap();
        }
        until("shipped", || {
            shipping.status.shipped_seq() == engine.head().seq
        })
        .await;
    }
    let doc = EpochDoc {
        epoch: 2,
        writer: "another".into(),
        taken_ms: spark_log_format::system_now_ms(),
        lease_ms: 0,
    };
    store
        .put_create(&epoch_key("p", 2), Bytes::from(doc.encode()))
        .await
        .unwrap();
    until("fenced by the retention pass", || engine.fenced().is_some()).await;
    assert!(
        flaky.deleted.lock().is_empty(),
        "{:?}",
        flaky.deleted.lock()
    );
    assert_eq!(
        store
            .latest_manifest()
            .await
            .unwrap()
            .unwrap()
            .retained_from,
        1
    );
    shipping.stop().await;
    engine.shutdown().await;
}

/// Objects and bytes of the archive, by family.
async fn archive_size(store: &ArchiveStore) -> Vec<(&'static str, usize, u64)> {
    let mut out = Vec::new();
    for family in [
        "manifest",
        "segment",
        "chunk",
        "checkpoint",
        "blob",
        "epoch",
    ] {
        let listed = store.list_family(family).await.unwrap();
        out.push((
            family,
            listed.len(),
            listed.iter().map(|(_, bytes)| bytes).sum::<u64>(),
        ));
    }
    out
}

fn size_line(sizes: &[(&'static str, usize, u64)]) -> String {
    let objects: usize = sizes.iter().map(|s| s.1).sum();
    let bytes: u64 = sizes.iter().map(|s| s.2).sum();
    let parts: Vec<String> = sizes
        .iter()
        .map(|(family, n, b)| format!("{family} {n} ({b} B)"))
        .collect();
    format!("{objects} objects, {bytes} bytes: {}", parts.join(", "))
}

/// The figure of docs/performance/erasure.md ("Archive"): an archive's
/// size before and after retention for a history where half the moments
/// were deleted and erased. `cargo test --release -p spark-engine --lib
/// archive::tests::archive_size_before_and_after_retention -- --ignored
/// --nocapture` (`SPARK_RETENTION_FIGURE_MOMENTS=N`, default 20000). The
/// store is in memory: counts and bytes are the store's, whatever it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the figure"]
async fn archive_size_before_and_after_retention() {
    let moments: u64 = std::env::var("SPARK_RETENTION_FIGURE_MOMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        data_dir: dir.path().to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = 1 << 20;
    settings.log.preallocate_bytes = 0;
    settings.log.checkpoint_interval_ops = 0;
    settings.retention.erase_after_ms = 0;
    let engine = open_engine(&settings);
    // Built and compacted under the default retention (a week): nothing
    // is deleted yet.
    let shipping = ship_every_20_ms(store.clone(), dir.path(), &engine)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for client in 0..8u64 {
        let engine = Arc::clone(&engine);
        tasks.push(tokio::spawn(async move {
            let mut n = 1 + client;
            while n <= moments {
                engine.submit(create(n)).await.unwrap();
                n += 8;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for n in (1..=moments).step_by(2) {
        engine.submit(delete(n)).await.unwrap();
    }
    until("shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    let built = archive_size(&store).await;
    let report = compactor(&settings, &engine).pass().await.unwrap();
    assert_eq!(report.erased.len() as u64, moments.div_ceil(2));
    until("compaction shipped", || {
        shipping.status.shipped_seq() == engine.head().seq
    })
    .await;
    let compacted = archive_size(&store).await;
    shipping.stop().await;
    // The same writer with retention_ms = 1 s: its first passes delete
    // what the compaction superseded, the folded chunks and the history.
    let retention_ms = 1000;
    tokio::time::sleep(Duration::from_millis(retention_ms + 100)).await;
    let shipping = ship_retained(store.clone(), dir.path(), &engine, retention_ms).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (latest, low) = store.latest_manifest_and_low().await.unwrap().unwrap();
        let sizes = archive_size(&store).await;
        let chunks_named = latest.chunks.len();
        let chunk_objects = sizes.iter().find(|s| s.0 == "chunk").unwrap().1;
        if latest.retained_from > 1 && low == latest.retained_from && chunk_objects == chunks_named
        {
            break sizes;
        }
        assert!(Instant::now() < deadline, "retention never ran");
    };
    shipping.stop().await;
    let log_bytes: u64 = std::fs::read_dir(spark_core::layout::log_dir(dir.path()))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "archive retention figure: {moments} moments created, {} deleted and erased, segments of 1 MiB, shipped every 20 ms",
        moments.div_ceil(2)
    );
    println!("built (before the compaction):   {}", size_line(&built));
    println!("compacted, before retention:     {}", size_line(&compacted));
    println!("after retention:                 {}", size_line(&after));
    println!("local log after the compaction:  {log_bytes} bytes");
    engine.shutdown().await;
}
