//! One writer per prefix against a real S3-compatible server (SPEC section
//! 11; ARCHIVE.md "Epoch"): 200 randomized take-overs with
//! two writers racing. Each round a standby data directory takes the prefix
//! over (`spark_engine::archive::take_over`, what `serve --take-over` runs)
//! while the engine holding it writes and ships; both write at once until
//! the old one is fenced; the old one is then retired and the next round's
//! standby is a new empty directory (the take-over fetches the archive into
//! it). Afterwards: every manifest extends the one before (never two
//! epochs' ops interleaved), every chunk's `chain_before` is the chain
//! before it, every write a surviving writer acknowledged is in a restore,
//! and no fenced engine acknowledged a write it was given after its fence.
//! Skipped (`skipped: ...`) without `weed` unless `SPARK_REQUIRE_S3=1`, and
//! without the `spark-replay` binary (the restore) unless
//! `SPARK_REQUIRE_REPLAY=1`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spark_archive::layout::{ChunkHeader, Manifest};
use spark_archive::{ArchiveStore, StoreConfig};
use spark_engine::archive::Shipping;
use spark_engine::clock::SystemClock;
use spark_engine::config::{ArchiveMode, ArchiveSettings, Settings};
use spark_engine::engine::{EngineError, Outcome};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use crate::common::replay_or_skip;
use crate::s3_common::{create, json, restore, unique_prefix, weed_or_skip};

const ROUNDS: usize = 200;
const SHIP_INTERVAL_MS: u64 = 15;

/// A small deterministic generator; the seed is printed so a failing run
/// can be replayed (`SPARK_TAKEOVER_SEED`).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One write an engine was asked for: its id, when it was asked and
/// answered, and whether it was acknowledged.
#[derive(Clone, Debug)]
struct Asked {
    id: Id,
    called: Instant,
    answered: Instant,
    acknowledged: bool,
}

/// An engine that holds (or held) the prefix, with the writer task that
/// writes to it.
struct Writer {
    data: tempfile::TempDir,
    engine: Arc<Engine>,
    shipping: Shipping,
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<Asked>>>,
    task: tokio::task::JoinHandle<()>,
}

fn archive_settings(url: &str, endpoint: &str) -> ArchiveSettings {
    ArchiveSettings {
        url: url.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".into(),
        ship_interval_ms: SHIP_INTERVAL_MS,
        mode: ArchiveMode::Async,
        lease_ms: 0,
        retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
    }
}

fn settings(data: &Path, archive: &ArchiveSettings) -> Settings {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        archive: Some(archive.clone()),
        ..Settings::default()
    };
    // Segments seal (and fold into the manifests) every few dozen ops.
    settings.log.segment_size_bytes = 16 * 1024;
    settings.validate().unwrap();
    settings
}

/// Opens the engine on `data` and starts shipping, after taking the
/// prefix over when `take_over` (as `serve --take-over` does: take over,
/// open, start), then starts writing ids from `next_id`. After a take-over,
/// the log (the archive at the take-over point) is copied into `seed`: the
/// next standby starts from that copy, a prefix of the archive, so its
/// take-over fetches only what was shipped since.
async fn start_writer(
    data: tempfile::TempDir,
    archive: &ArchiveSettings,
    take_over: Option<&Path>,
    next_id: Arc<AtomicU64>,
    seed: u64,
) -> Writer {
    let settings = settings(data.path(), archive);
    let max_record_bytes = settings.log.max_record_bytes;
    let mut taken_over = None;
    if let Some(seed_dir) = take_over {
        let taken = spark_engine::archive::take_over(archive, data.path(), max_record_bytes)
            .await
            .unwrap_or_else(|e| panic!("take-over: {e}"));
        copy_log(data.path(), seed_dir);
        taken_over = Some(taken);
    }
    let engine = Arc::new(open_engine(&settings).await);
    let engine_ = Arc::clone(&engine);
    let shipping = match &taken_over {
        Some(taken) => {
            taken
                .start(archive, data.path(), engine_, max_record_bytes)
                .await
        }
        None => spark_engine::archive::start(archive, data.path(), engine_, max_record_bytes).await,
    }
    .unwrap_or_else(|e| panic!("start: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let task = tokio::spawn(write_until_stopped(
        Arc::clone(&engine),
        Arc::clone(&stop),
        Arc::clone(&asked),
        next_id,
        seed,
    ));
    Writer {
        data,
        engine,
        shipping,
        stop,
        asked,
        task,
    }
}

/// Replaces `to`'s log with a copy of `from`'s.
fn copy_log(from: &Path, to: &Path) {
    let (from, to) = (from.join("log"), to.join("log"));
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A new standby data directory holding a copy of `seed`'s log.
fn standby_from(seed: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if seed.join("log").is_dir() {
        copy_log(seed, dir.path());
    }
    dir
}

/// Writes one create after another (a pause of 0 to 2 ms between), each
/// recorded with its times, until `stop`.
async fn write_until_stopped(
    engine: Arc<Engine>,
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<Asked>>>,
    next_id: Arc<AtomicU64>,
    seed: u64,
) {
    let mut rng = Rng(seed | 1);
    while !stop.load(Ordering::Acquire) {
        let n = next_id.fetch_add(1, Ordering::Relaxed);
        let called = Instant::now();
        let answer = engine.submit(create(n)).await;
        let answered = Instant::now();
        let id = match &answer {
            Ok(Outcome::MomentCreated { moment, .. }) => moment.id,
            _ => Id::from_parts(1_767_225_600_000 + n, n.into()),
        };
        match &answer {
            Ok(_) | Err(EngineError::Fenced(_)) => {}
            Err(e) => panic!("write {n}: {e}"),
        }
        asked.lock().unwrap().push(Asked {
            id,
            called,
            answered,
            acknowledged: answer.is_ok(),
        });
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
    }
}

/// What one retired (fenced) writer did.
struct Retired {
    /// Its acknowledged writes with their create seqs, as its log holds them.
    acknowledged: Vec<(Id, u64)>,
    /// The take-over point that fenced it (the shipped seq).
    taken_over_at: u64,
    /// Acknowledged after the take-over point, lost at its fence (the
    /// async window).
    lost: usize,
    /// Acknowledged, asked before the fence, answered after it.
    straddling: usize,
}

/// Waits for `old`'s fence, checks that it acknowledged nothing it was
/// asked after it, stops it.
async fn retire(old: Writer, taken_over_at: u64) -> Retired {
    let deadline = Instant::now() + Duration::from_secs(120);
    let fenced_at = loop {
        if let Some(at) = old.shipping.status.fenced_at() {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "the old writer was not fenced within 120 s ({:?})",
            old.shipping.status.failing()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Let it be asked more after the fence (refused), then stop.
    while !old
        .asked
        .lock()
        .unwrap()
        .iter()
        .any(|a| a.called > fenced_at)
    {
        assert!(Instant::now() < deadline, "the old writer's task stalled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    old.stop.store(true, Ordering::Release);
    old.task.await.unwrap();
    let asked = old.asked.lock().unwrap().clone();
    let mut straddling = 0;
    for a in &asked {
        if a.acknowledged {
            assert!(
                a.called < fenced_at,
                "write {} was acknowledged though asked {:?} after the fence",
                a.id,
                a.called - fenced_at
            );
            if a.answered > fenced_at {
                straddling += 1;
            }
        }
    }
    assert!(
        asked.iter().any(|a| !a.acknowledged),
        "the fenced writer refused nothing"
    );
    let acknowledged: Vec<(Id, u64)> = old.engine.read(|mirror| {
        asked
            .iter()
            .filter(|a| a.acknowledged)
            .map(|a| {
                let moment = mirror.moments.get(&a.id).expect("acknowledged: in its log");
                (a.id, moment.created_seq())
            })
            .collect()
    });
    let lost = acknowledged
        .iter()
        .filter(|(_, seq)| *seq > taken_over_at)
        .count();
    old.shipping.stop().await;
    old.engine.shutdown().await;
    drop(old.data);
    Retired {
        acknowledged,
        taken_over_at,
        lost,
        straddling,
    }
}

/// Opens the engine on a directory the take-over just released. The
/// directory's `LOCK` is an flock: a child process another test in this
/// binary spawns at that moment (a `spark-engine`, `weed` or nginx) holds a
/// copy of the descriptor between its fork and its exec, so the lock may
/// still be held for a moment. Retried for up to 10 s, on `Locked` only.
async fn open_engine(settings: &Settings) -> Engine {
    let started = Instant::now();
    loop {
        match Engine::open(settings, Arc::new(OsFs), Arc::new(SystemClock)) {
            Ok(engine) => return engine,
            Err(spark_engine::engine::EngineOpenError::Locked(dir))
                if started.elapsed() < Duration::from_secs(10) =>
            {
                let _ = dir;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the engine opens: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_take_overs_with_two_writers_racing() {
    let test = "two_hundred_take_overs_with_two_writers_racing";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_or_skip(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("takeover");
    let archive = archive_settings(&url, &endpoint);
    let seed = std::env::var("SPARK_TAKEOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: seed {seed} (SPARK_TAKEOVER_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let next_id = Arc::new(AtomicU64::new(1));
    let started = Instant::now();

    let seed_dir = tempfile::tempdir().unwrap();
    let mut active = start_writer(
        tempfile::tempdir().unwrap(),
        &archive,
        None,
        Arc::clone(&next_id),
        rng.below(u64::MAX),
    )
    .await;
    let mut retired = Vec::new();
    for round in 0..ROUNDS {
        // The holder writes and ships for a while, then a standby (the
        // archive as of the last take-over, or empty at first) takes over
        // while it goes on writing.
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        let standby = start_writer(
            standby_from(seed_dir.path()),
            &archive,
            Some(seed_dir.path()),
            Arc::clone(&next_id),
            rng.below(u64::MAX),
        )
        .await;
        assert_eq!(
            standby.shipping.status.epoch(),
            round as u64 + 2,
            "round {round}"
        );
        let taken_over_at = standby.shipping.status.shipped_seq();
        let old = std::mem::replace(&mut active, standby);
        retired.push(retire(old, taken_over_at).await);
        if (round + 1) % 50 == 0 {
            eprintln!(
                "{test}: {} take-overs, {:.1} s",
                round + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    // The last writer ships all it acknowledged, then stops.
    tokio::time::sleep(Duration::from_millis(20)).await;
    active.stop.store(true, Ordering::Release);
    active.task.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while active.shipping.status.shipped_seq() < active.engine.head().seq {
        assert!(Instant::now() < deadline, "the last writer did not ship");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let final_head = active.engine.head();
    let survivor: Vec<Id> = active
        .asked
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.acknowledged)
        .map(|a| a.id)
        .collect();
    active.shipping.stop().await;
    active.engine.shutdown().await;
    let rounds_took = started.elapsed();

    let store = ArchiveStore::connect(&StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let manifests = walk_manifests(&store).await;
    assert_eq!(
        manifests.last().map(|m| m.epoch),
        Some(ROUNDS as u64 + 1),
        "the last manifest is the last writer's"
    );
    assert_eq!(
        manifests.last().map(|m| m.shipped_chain),
        Some(final_head.chain)
    );
    check_chunk_chains(&store, &manifests).await;

    // Every write a surviving writer acknowledged is in a restore, at the
    // same seq.
    let work = tempfile::tempdir().unwrap();
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], final_head.seq, "{out}");
    let engine = Engine::open(
        &Settings {
            data_dir: restored,
            ..Settings::default()
        },
        Arc::new(OsFs),
        Arc::new(SystemClock),
    )
    .unwrap();
    assert_eq!(engine.head(), final_head);
    let (mut kept, mut lost, mut straddling) = (0usize, 0usize, 0usize);
    engine.read(|mirror| {
        for r in &retired {
            for (id, seq) in &r.acknowledged {
                if *seq <= r.taken_over_at {
                    let there = mirror.moments.get(id).map(|m| m.created_seq());
                    assert_eq!(there, Some(*seq), "write {id} (seq {seq}) is not restored");
                    kept += 1;
                }
            }
            lost += r.lost;
            straddling += r.straddling;
        }
        for id in &survivor {
            assert!(
                mirror.moments.contains_key(id),
                "write {id} is not restored"
            );
            kept += 1;
        }
    });
    engine.shutdown().await;
    eprintln!(
        "{test}: {ROUNDS} take-overs in {:.1} s; {} manifests; {kept} acknowledged writes \
         restored; {lost} acknowledged by a writer after the take-over point and before its \
         fence (the async window, not in the archive); {straddling} asked before a fence and \
         answered after it",
        rounds_took.as_secs_f64(),
        manifests.len()
    );
    drop(weed);
}

/// Reads manifests 1..latest and checks that each extends the one before:
/// epochs never decrease; the sealed segments are the previous ones plus
/// new ones after them; the chunks are the previous ones plus new ones
/// after its shipped seq, or, when a segment sealed, a fold (the new
/// sealed segment starts where the previous chunks' segment did); chunk
/// epochs never decrease within a manifest and never pass its epoch.
async fn walk_manifests(store: &ArchiveStore) -> Vec<Manifest> {
    let latest = store
        .latest(|n| spark_archive::layout::manifest_key(store.prefix(), n))
        .await
        .unwrap();
    assert!(latest > ROUNDS as u64, "{latest} manifests");
    let mut manifests: Vec<Manifest> = Vec::new();
    for number in 1..=latest {
        let m = store.manifest(number).await.unwrap();
        let mut epochs = m.chunks.iter().map(|c| c.epoch);
        let mut last = 0;
        assert!(
            epochs.all(|e| {
                let ok = e >= last && e <= m.epoch;
                last = e;
                ok
            }),
            "manifest {number}: chunk epochs interleave or pass its epoch"
        );
        if let Some(prev) = manifests.last() {
            let at = format!("manifest {number} after {}", prev.number);
            assert!(m.epoch >= prev.epoch, "{at}: epoch went back");
            assert!(
                m.shipped_seq >= prev.shipped_seq,
                "{at}: shipped seq went back"
            );
            assert!(
                m.segments.len() >= prev.segments.len()
                    && m.segments[..prev.segments.len()] == prev.segments[..],
                "{at}: the sealed segments changed"
            );
            let folded = m.segments.len() > prev.segments.len();
            if folded {
                if let Some(first) = prev.chunks.first() {
                    assert_eq!(
                        m.segments[prev.segments.len()].first_seq,
                        first.segment_first_seq,
                        "{at}: the fold does not start at the chunks' segment"
                    );
                }
            } else {
                assert!(
                    m.chunks.len() >= prev.chunks.len()
                        && m.chunks[..prev.chunks.len()] == prev.chunks[..],
                    "{at}: the chunks are not the previous ones plus new ones"
                );
                if let Some(new) = m.chunks.get(prev.chunks.len()) {
                    assert_eq!(new.first_seq, prev.shipped_seq + 1, "{at}");
                }
            }
            if m.epoch > prev.epoch {
                // A take-over point names exactly what the archive held.
                assert_eq!(
                    (&m.segments, &m.chunks, &m.shipped_chain),
                    (&prev.segments, &prev.chunks, &prev.shipped_chain),
                    "{at}: the take-over manifest does not list the previous entries"
                );
            }
        }
        manifests.push(m);
    }
    manifests
}

/// Every chunk any manifest names: its header agrees with the entry and
/// its `chain_before` is the `chain_after` of the chunk before it (for a
/// segment's first chunk, the previous sealed segment's `chain_end`).
async fn check_chunk_chains(store: &ArchiveStore, manifests: &[Manifest]) {
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    for m in manifests {
        let mut before = m.segments.last().map_or([0; 32], |s| s.chain_end);
        for c in &m.chunks {
            if seen.insert(c.key.clone(), ()).is_none() {
                let object = store.get_listed(&c.key, c.bytes, &c.blake3).await.unwrap();
                let (header, _) = ChunkHeader::decode(&object).unwrap();
                assert_eq!(
                    header.chain_before, before,
                    "{}: chain_before is not the chain before it (manifest {})",
                    c.key, m.number
                );
                assert_eq!(header.chain_after, c.chain_after, "{}", c.key);
                assert_eq!(header.epoch, c.epoch, "{}", c.key);
            }
            before = c.chain_after;
        }
    }
}
