//! Startup from a checkpoint: the sealed segments before
//! the one holding the checkpoint's point are checked by their links only
//! (header, seal, seqs, chain values: FORMAT.md, "Recovery" step 2a), and
//! read in full by the scrub once the server listens. Damage there does not
//! stop the start but is reported, naming segment and offset; a checkpoint
//! that does not match the log is ignored and the whole log checked; a
//! missing or reordered segment is refused; kill -9 and restart from
//! checkpoints give the digest of a full replay.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ServerProcess;
use serde_json::{json, Value};
use spark_core::synth;
use spark_engine::clock::SystemClock;
use spark_engine::config::{log_dir, Settings};
use spark_engine::engine::EngineOpenError;
use spark_engine::Engine;
use spark_log_format::{Log, LogConfig, OsFs, RecordIn, DEFAULT_MAX_RECORD_BYTES};

/// Creates before the checkpoint, and after it.
const CREATES: u64 = 2_000;
const CREATES_AFTER: u64 = 300;

/// Small segments, so that the checkpoint covers several sealed ones.
fn log_config() -> LogConfig {
    LogConfig {
        segment_size_bytes: 32 * 1024,
        ..LogConfig::default()
    }
}

/// Settings with checkpoints on (`checkpoint_interval_ops` above 0, the
/// default) or off (0: the whole log is replayed and checked).
fn settings(data: &Path, checkpoints: bool) -> Settings {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    if !checkpoints {
        settings.log.checkpoint_interval_ops = 0;
    }
    settings
}

/// Appends synthetic creates `from..to` to the log of `data`, 20 to a
/// batch (so that the small segments roll every few batches).
fn append_creates(data: &Path, from: u64, to: u64) {
    append_creates_with(data, from, to, log_config());
}

/// [`append_creates`] into a log with segments of `config`.
fn append_creates_with(data: &Path, from: u64, to: u64, config: LogConfig) {
    let (mut log, _) = Log::open(&log_dir(data), config, Arc::new(OsFs), |_| Ok::<(), ()>(()))
        .unwrap_or_else(|_| panic!("the log opens"));
    let ops: Vec<(u16, u16, Vec<u8>)> = (from..to)
        .map(|k| synth::moment_create(k).encode().unwrap())
        .collect();
    for (n, chunk) in ops.chunks(20).enumerate() {
        let batch: Vec<RecordIn<'_>> = chunk
            .iter()
            .map(|(kind, kind_version, payload)| RecordIn {
                ts_ms: synth::BASE_MS + from + n as u64,
                kind: *kind,
                kind_version: *kind_version,
                payload,
            })
            .collect();
        log.append_batch(&batch).unwrap();
    }
}

/// A data directory: [`CREATES`] creates, a checkpoint at the last of
/// them, then [`CREATES_AFTER`] more creates.
fn data_with_checkpoint() -> tempfile::TempDir {
    let (dir, _, at) = data_ending_in_a_checkpoint();
    assert_eq!(at.seq, CREATES);
    append_creates(dir.path(), CREATES, CREATES + CREATES_AFTER);
    dir
}

/// The segment files of `data`, in seq order.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(log_dir(data))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

fn name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Opens the engine on `data`, or says why not. A `Locked` answer is
/// tried again for a while: a server child of another test in this binary
/// may hold a copy of the `LOCK` descriptor between its fork and exec
/// (see `main.rs`).
fn open(data: &Path, checkpoints: bool) -> Result<Engine, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Engine::open(
            &settings(data, checkpoints),
            Arc::new(OsFs),
            Arc::new(SystemClock),
        ) {
            Err(EngineOpenError::Locked(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            opened => return opened.map_err(|e| e.to_string()),
        }
    }
}

/// The mirror digest and head seq of the engine on `data`, closed again.
fn digest(data: &Path, checkpoints: bool) -> (String, u64) {
    let engine = open(data, checkpoints).unwrap();
    let found = (engine.read(|m| m.digest()), engine.head().seq);
    drop(engine);
    found
}

/// Flips one byte of a record in the second segment (sealed, covered by
/// the checkpoint): a payload byte of the first record that starts at or
/// after offset 1000, found by FORMAT.md's tables (`len` at +0, `seq` at
/// +8, `kind` at +24, 0 for the log's own frames), not the crate's decoder.
/// Returns the segment's name and where the error must place the damage:
/// `at offset <the record's> (seq <its own seq>):`.
fn damage_second_segment(data: &Path) -> (String, String) {
    let files = segments(data);
    assert!(files.len() > 4, "the checkpoint covers several segments");
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let le = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |v, &b| v << 8 | u64::from(b))
    };
    let mut at = 64;
    while at < 1000 || le(at + 24, 2) == 0 {
        assert_ne!(le(at, 4), 0, "a record after offset 1000");
        at += 8 + le(at, 4) as usize;
    }
    let seq = le(at + 8, 8);
    bytes[at + 30] ^= 0x40;
    std::fs::write(&files[1], bytes).unwrap();
    (name(&files[1]), format!("at offset {at} (seq {seq}):"))
}

/// Waits (at most a minute: a busy machine) until the scrub read every
/// deferred segment.
fn wait_for_scrub(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !engine.scrub_status().finished() {
        assert!(Instant::now() < deadline, "the scrub did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_checkpoint_over_a_damaged_sealed_segment_starts_and_the_scrub_names_the_damage() {
    let dir = data_with_checkpoint();
    let (before, head) = digest(dir.path(), false);
    let (damaged, place) = damage_second_segment(dir.path());

    let engine = open(dir.path(), true).expect("starts from the checkpoint");
    let deferred = &engine.recovery().deferred;
    assert!(deferred.len() >= 3, "{deferred:?}");
    assert_eq!(deferred[1].name, damaged);
    assert_eq!(engine.read(|m| m.digest()), before, "the same answers");
    assert_eq!(engine.head().seq, head);
    assert_eq!(
        engine.scrub_status().to_json().unwrap()["status"],
        "pending"
    );
    engine.start_scrub().unwrap();
    wait_for_scrub(&engine);
    let damage = engine.scrub_status().damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    // Segment, offset and the damaged record's own seq (not the last good
    // one before it).
    assert!(
        damage[0].contains(&format!("{damaged} {place}")),
        "names segment, offset and seq ({place}): {}",
        damage[0]
    );
    // `/readyz`'s `scrub` member says the same.
    let status = engine.scrub_status().to_json().unwrap();
    assert_eq!(status["status"], "damaged", "{status}");
    assert_eq!(status["damage"][0], damage[0], "{status}");
    drop(engine);

    // Without the checkpoint every byte is checked at startup: refused,
    // naming the same place.
    let refused = open(dir.path(), false).err().expect("refused");
    assert!(
        refused.contains(&format!("{damaged} {place}")),
        "{place}: {refused}"
    );
}

#[test]
fn a_clean_log_scrubs_clean_from_a_checkpoint() {
    let dir = data_with_checkpoint();
    let (full, _) = digest(dir.path(), false);
    let engine = open(dir.path(), true).unwrap();
    assert!(!engine.recovery().deferred.is_empty());
    assert_eq!(engine.read(|m| m.digest()), full);
    engine.start_scrub().unwrap();
    wait_for_scrub(&engine);
    assert_eq!(
        engine.scrub_status().to_json().unwrap(),
        json!({"status": "clean", "segments": engine.recovery().deferred.len(),
               "checked": engine.recovery().deferred.len(), "damage": []})
    );
}

#[test]
fn the_request_index_used_in_place_answers_as_a_full_replay_and_after_being_detached() {
    let dir = data_with_checkpoint();
    let (full, _) = digest(dir.path(), false);
    let engine = open(dir.path(), true).unwrap();
    // The checkpoint's request rows are used in place (mapped) and the
    // rows after it are in memory: every request id answers as after a
    // full replay, which built the whole index in memory.
    assert!(engine.read(|m| m.requests.mapped_rows().is_some()));
    assert_eq!(engine.read(|m| m.digest()), full);
    let answers = |engine: &Engine| {
        engine.read(|m| {
            (0..CREATES + CREATES_AFTER + 2)
                .map(|k| {
                    let request_id = format!("outbox-{k:012}-c2d98960");
                    (
                        m.requests.get(&request_id),
                        m.requests
                            .by_seq(k + 1)
                            .map(|(id, row)| (id.to_owned(), row)),
                    )
                })
                .collect::<Vec<_>>()
        })
    };
    let before = answers(&engine);
    assert_eq!(
        before.iter().filter(|(row, _)| row.is_some()).count() as u64,
        CREATES + CREATES_AFTER
    );
    assert!(
        engine.detach_request_index(),
        "the mapped rows are detached"
    );
    assert!(engine.read(|m| m.requests.mapped_rows().is_none()));
    assert!(!engine.detach_request_index(), "nothing left to detach");
    assert_eq!(answers(&engine), before);
    assert_eq!(engine.read(|m| m.digest()), full);
}

#[test]
fn a_checkpoint_whose_chain_value_does_not_match_is_ignored_and_the_whole_log_checked() {
    let dir = data_with_checkpoint();
    let (full, _) = digest(dir.path(), false);
    let checkpoint = spark_core::checkpoint::list(dir.path())[0].1.clone();
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    // The header's chain value (CHECKPOINT.md, "Layout": bytes 48..80).
    bytes[60] ^= 1;
    std::fs::write(&checkpoint, bytes).unwrap();

    let engine = open(dir.path(), true).expect("starts from the log alone");
    assert!(
        engine.recovery().deferred.is_empty(),
        "every segment checked"
    );
    assert_eq!(engine.read(|m| m.digest()), full);
    assert!(engine.scrub_status().to_json().is_none());
    drop(engine);

    // So damage in a sealed segment is refused at startup again.
    let (damaged, _) = damage_second_segment(dir.path());
    let refused = open(dir.path(), true).err().expect("refused");
    assert!(refused.contains(&damaged), "{refused}");
}

#[test]
fn a_missing_sealed_segment_before_the_checkpoint_is_refused() {
    let dir = data_with_checkpoint();
    let files = segments(dir.path());
    std::fs::remove_file(&files[2]).unwrap();
    let refused = open(dir.path(), true).err().expect("refused");
    assert!(refused.contains(&name(&files[3])), "{refused}");
}

#[test]
fn reordered_sealed_segments_before_the_checkpoint_are_refused() {
    let dir = data_with_checkpoint();
    let files = segments(dir.path());
    let aside = files[1].with_extension("aside");
    std::fs::rename(&files[1], &aside).unwrap();
    std::fs::rename(&files[2], &files[1]).unwrap();
    std::fs::rename(&aside, &files[2]).unwrap();
    let refused = open(dir.path(), true).err().expect("refused");
    assert!(refused.contains(&name(&files[1])), "{refused}");
}

/// Kill -9 while a client writes, with checkpoints every 40 ops and 8 KiB
/// segments, so that each restart starts from a checkpoint over sealed
/// segments: the final start (from a checkpoint, the scrub clean) gives
/// the digest of a replay of the whole log, and of `spark-replay rebuild`.
/// Whether a checkpoint of `data` lies in the second segment or later, so
/// that a start from it checks at least one sealed segment by its links
/// only and the scrub reads it.
fn a_checkpoint_covers_a_sealed_segment(data: &Path) -> bool {
    let mut first_seqs: Vec<u64> = std::fs::read_dir(log_dir(data))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            spark_log_format::format::parse_segment_file_name(&e.file_name().to_string_lossy())
        })
        .collect();
    first_seqs.sort_unstable();
    first_seqs.get(1).is_some_and(|second| {
        spark_core::checkpoint::list(data)
            .iter()
            .any(|(seq, _)| seq >= second)
    })
}

#[test]
fn kill_9_and_restart_from_checkpoints_give_the_digest_of_a_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let env = [
        ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "40"),
        ("SPARK_LOG_SEGMENT_SIZE_BYTES", "8192"),
    ];
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut n = 0u64;
    for cycle in 0..4u64 {
        let server = ServerProcess::start_with_env(&data, &env);
        let until = Instant::now() + Duration::from_millis(400 + 150 * cycle);
        while Instant::now() < until {
            n += 1;
            let _ = client
                .post(server.url("/api/moments"))
                .json(&json!({"client_request_id": format!("r{n}"), "text": format!("moment {n}")}))
                .send();
        }
        // Time for the checkpoint worker (it polls every 100 ms).
        std::thread::sleep(Duration::from_millis(300));
        if cycle == 3 {
            // The last start must be from a checkpoint past a sealed
            // segment, so that the scrub has something to read: on a busy
            // machine the windows above may have written too little to
            // seal one, or the worker may not have caught up yet, so the
            // writes go on until it has.
            let deadline = Instant::now() + Duration::from_secs(120);
            while !a_checkpoint_covers_a_sealed_segment(&data) {
                assert!(
                    Instant::now() < deadline,
                    "no checkpoint past a sealed segment after two minutes of writes"
                );
                n += 1;
                let _ = client
                    .post(server.url("/api/moments"))
                    .json(&json!({"client_request_id": format!("r{n}"), "text": format!("moment {n}")}))
                    .send();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        server.kill();
    }
    let server = ServerProcess::start_with_env(&data, &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    let scrub = loop {
        let ready: Value = client
            .get(server.url("/readyz"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let scrub = ready["scrub"].clone();
        if scrub["status"] != "pending" && scrub["status"] != "running" {
            break scrub;
        }
        assert!(
            Instant::now() < deadline,
            "the scrub did not finish: {ready}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(scrub["status"], "clean", "{scrub}");
    assert!(scrub["segments"].as_u64().unwrap() > 0, "{scrub}");
    assert!(server.terminate().success());

    let (from_checkpoint, head) = digest(&data, true);
    let (full, full_head) = digest(&data, false);
    assert_eq!((&from_checkpoint, head), (&full, full_head));
    if let Some(replay) = common::replay_or_skip("checkpoint_start::kill_9 (its spark-replay part)")
    {
        let out = std::process::Command::new(&replay)
            .args(["rebuild", "--data"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&full), "rebuild's digest: {stdout}");
    }
}

/// Damage the scrub finds in a segment the checkpoint covers changes
/// nothing served: the event stream's catch-up and the next checkpoint
/// read the log only from the segment they need (a newcomer's run found
/// both failing on such damage: `event:error` for every subscriber, and no
/// checkpoint written again).
#[test]
fn damage_behind_the_checkpoint_stops_neither_the_event_stream_nor_the_next_checkpoint() {
    use std::io::{Read, Write};

    let dir = data_with_checkpoint();
    let data = dir.path();
    damage_second_segment(data);
    let head = CREATES + CREATES_AFTER;
    let server =
        ServerProcess::start_with_env(data, &[("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "100")]);

    // The next checkpoint, at the head (300 ops after the loaded one).
    let wanted = data.join("checkpoint").join(format!("{head:020}.ckpt"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wanted.is_file() {
        assert!(
            Instant::now() < deadline,
            "no checkpoint at seq {head} was written"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The catch-up of the last ten ops, from the log on disk.
    let base = server.url("");
    let address = base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    // The cursor of seq head - 10 (its seq and its batch's chain value),
    // read off the log as the server does.
    let cursor = spark_engine::history::cursor_of(
        &spark_core::layout::log_dir(data),
        head - 10,
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
    )
    .unwrap();
    write!(
        stream,
        "GET /api/events HTTP/1.1\r\nHost: {address}\r\nLast-Event-ID: {cursor}\r\n\r\n",
    )
    .unwrap();
    let mut read = Vec::new();
    let last = format!("id:{head}.");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&read).contains(&last) {
        let text = String::from_utf8_lossy(&read).into_owned();
        assert!(!text.contains("event:error"), "{text}");
        assert!(Instant::now() < deadline, "no event {head}: {text}");
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => panic!("the stream ended: {text}"),
            Ok(n) => read.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&read).into_owned();
    assert!(text.contains(&format!("id:{}.", head - 9)), "{text}");
    assert!(!text.contains("event:error"), "{text}");
    drop(stream);
    assert!(server.terminate().success());
}

/// A data directory whose log ends with a checkpoint: [`CREATES`] creates
/// and a checkpoint at the last of them; returns it with the checkpoint's
/// file and point.
fn data_ending_in_a_checkpoint() -> (tempfile::TempDir, PathBuf, spark_core::checkpoint::LogPoint) {
    let dir = tempfile::tempdir().unwrap();
    append_creates(dir.path(), 0, CREATES);
    let (file, at) = write_checkpoint(dir.path());
    (dir, file, at)
}

/// Writes a checkpoint of the log of `data` at its head (as the engine's
/// worker does); returns its file and point.
fn write_checkpoint(data: &Path) -> (PathBuf, spark_core::checkpoint::LogPoint) {
    let built = spark_core::checkpoint::build(
        &spark_log_format::OsFs,
        data,
        &log_dir(data),
        DEFAULT_MAX_RECORD_BYTES,
        3,
        u64::MAX,
        &|| false,
    )
    .unwrap()
    .expect("a checkpoint is written");
    (built.file, built.at)
}

/// The segment file of `data` that holds the point `at`.
fn segment_at(data: &Path, at: &spark_core::checkpoint::LogPoint) -> PathBuf {
    log_dir(data).join(spark_log_format::format::segment_file_name(
        at.segment_first_seq,
    ))
}

/// Zeros from 400 bytes before the end of the record at `at` to the end
/// of its segment, the file's length kept.
fn zero_the_tail_below(data: &Path, at: &spark_core::checkpoint::LogPoint) {
    let segment = segment_at(data, at);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[at.frame_end_offset as usize - 400..].fill(0);
    std::fs::write(&segment, bytes).unwrap();
}

/// The names and lengths of every file in the log directory of `data`.
fn log_files(data: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(log_dir(data))
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (name(&e.path()), e.metadata().unwrap().len()))
        .collect();
    files.sort();
    files
}

/// Asserts that opening `data` is refused as a log that lost acknowledged
/// records shown by `checkpoint`, with checkpoints on, then off, then on
/// again, and that the first refusal names `words`; returns it.
fn assert_lost(data: &Path, checkpoint: &Path, words: &str) -> String {
    let first = open(data, true).err().expect("refused");
    assert!(first.contains(words), "{first}");
    for refusal in [
        first.clone(),
        open(data, false).err().expect("refused"),
        open(data, true).err().expect("refused"),
    ] {
        assert!(
            refusal.contains("lost acknowledged records")
                && refusal.contains(&name(checkpoint))
                && refusal.contains(&format!("seq {CREATES} was committed")),
            "{refusal}"
        );
    }
    first
}

/// A last segment cut short below a checkpoint's point (a newcomer's
/// break-test: `truncate -s` on the newest `.seg`): recovery would take
/// the cut for a torn tail and hand the lost seqs out again. Refused,
/// before anything in the directory changes; moving the checkpoint away
/// is how an operator accepts the loss.
#[test]
fn a_last_segment_cut_short_below_a_checkpoint_is_refused_and_left_as_it_is() {
    let (dir, checkpoint, at) = data_ending_in_a_checkpoint();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(segment_at(dir.path(), &at))
        .unwrap();
    file.set_len(at.frame_end_offset - 300).unwrap();
    drop(file);
    let before = log_files(dir.path());

    let refusal = assert_lost(dir.path(), &checkpoint, "holds");
    assert!(
        refusal.contains("nothing in the data directory was changed"),
        "{refusal}"
    );
    assert_eq!(
        log_files(dir.path()),
        before,
        "no cut, no copy, no new segment"
    );

    std::fs::rename(&checkpoint, dir.path().join("aside.ckpt")).unwrap();
    let engine = open(dir.path(), true).expect("starts once the operator moved the proof away");
    assert!(engine.head().seq < CREATES);
}

/// A whole checkpoint copied in from another data directory (a restore of
/// `checkpoint/` from the wrong backup, a break-test's `cp`), whose point
/// lies past this log's segment but whose seq this log reaches: it does
/// not describe this log and proves nothing lost. Ignored with its
/// warning, and the start replays the log (it was refused as "lost
/// acknowledged records").
#[test]
fn a_foreign_checkpoint_whose_seq_the_log_reaches_is_ignored_not_proof_of_loss() {
    let dir = data_with_checkpoint();
    let (full, head) = digest(dir.path(), false);
    assert_eq!(head, CREATES + CREATES_AFTER);
    // Another log of the same length in one big segment: its checkpoint's
    // point lies far past this log's first (32 KiB) segment.
    let other = tempfile::tempdir().unwrap();
    append_creates_with(other.path(), 7, CREATES + 7, LogConfig::default());
    let (foreign, at) = write_checkpoint(other.path());
    assert_eq!((at.seq, at.segment_first_seq), (CREATES, 1));
    for (_, file) in spark_core::checkpoint::list(dir.path()) {
        std::fs::remove_file(file).unwrap();
    }
    let copied = spark_core::checkpoint::checkpoint_dir(dir.path()).join(name(&foreign));
    std::fs::copy(&foreign, &copied).unwrap();
    assert!(
        std::fs::metadata(segment_at(dir.path(), &at))
            .unwrap()
            .len()
            < at.frame_end_offset,
        "the point lies past this log's segment"
    );

    assert_eq!(
        spark_core::checkpoint::past_the_log(dir.path(), &log_dir(dir.path())),
        None
    );
    let engine = open(dir.path(), true).expect("starts, the foreign checkpoint ignored");
    assert_eq!(engine.head().seq, CREATES + CREATES_AFTER);
    assert_eq!(engine.read(|m| m.digest()), full);
}

/// Startup with a FIFO named as the newest checkpoint (opening it would
/// wait for a writer for ever) and a `*.ckpt.tmp` a crash left mid-write
/// (it may hold content a later delete erases, SPEC section 13): the FIFO
/// is ignored as not a regular file, the engine starts from the real
/// checkpoint, and the temp file is removed even with checkpoints off.
#[test]
fn a_fifo_named_as_a_checkpoint_is_ignored_and_a_temp_file_removed_at_start() {
    let dir = data_with_checkpoint();
    let checkpoints = spark_core::checkpoint::checkpoint_dir(dir.path());
    let fifo = checkpoints.join("00000000000000999999.ckpt");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let temp = checkpoints.join(format!(
        "00000000000000999998{}",
        spark_core::checkpoint::TMP_SUFFIX
    ));
    std::fs::write(&temp, b"MARKER left by a crash mid-write").unwrap();

    let data = dir.path().to_owned();
    let (sent, opened) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sent.send(open(&data, true).map(|engine| engine.head().seq));
    });
    let head = opened
        .recv_timeout(Duration::from_secs(60))
        .expect("the start does not hang on the FIFO")
        .expect("starts");
    assert_eq!(head, CREATES + CREATES_AFTER);
    assert_eq!(
        spark_core::checkpoint::peek(&fifo, &log_dir(dir.path()))
            .err()
            .map(|e| e.to_string()),
        Some("not a regular file".to_owned())
    );
    assert!(!temp.exists(), "the temp file is removed at start");

    std::fs::remove_file(&fifo).unwrap();
    std::fs::write(&temp, b"MARKER left by a crash mid-write").unwrap();
    drop(open(dir.path(), false).expect("starts with checkpoints off"));
    assert!(!temp.exists(), "removed with checkpoints off too");
}

/// The checkpoint whose request index the engine reads in place, written
/// to while it runs (a newcomer's break test: `cp` of another checkpoint
/// over it gave duplicate creates, cutting it short killed the engine with
/// SIGBUS): the next batch is refused, a retry included, the write path
/// stops until a restart, and nothing is written; the restart checks the
/// file again and answers the retry as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_written_in_place_while_its_index_is_read_stops_the_write_path() {
    use spark_engine::engine::{Command, CreateMoment};
    let create = |request_id: String| {
        Command::CreateMoment(CreateMoment {
            id: None,
            request_id: Some(request_id),
            text: Some("a retry".into()),
            caption: None,
            lang: None,
            captured_at_ms: None,
            device: "t".into(),
        })
    };
    let retry = || create(format!("outbox-{:012}-c2d98960", 5));
    let other = data_with_checkpoint();
    let foreign = std::fs::read(&spark_core::checkpoint::list(other.path())[0].1).unwrap();
    for cut_short in [false, true] {
        let dir = data_with_checkpoint();
        let checkpoint = spark_core::checkpoint::list(dir.path())[0].1.clone();
        let engine = open(dir.path(), true).unwrap();
        assert!(engine.read(|m| m.requests.mapped_rows().is_some()));
        let head = engine.head().seq;
        let answered = format!("{:?}", engine.submit(retry()).await.unwrap());
        assert_eq!(engine.head().seq, head, "a retry writes nothing");

        if cut_short {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&checkpoint)
                .unwrap();
            file.set_len(64).unwrap();
        } else {
            std::fs::write(&checkpoint, &foreign).unwrap();
        }
        // Not ready from the change on (`/readyz` asks `poisoned`), before
        // a write finds out.
        let not_ready = engine.poisoned().expect("the write path is stopped");
        assert!(
            not_ready.contains("written to while the engine ran"),
            "{not_ready}"
        );
        for command in [retry(), create("a-new-request".into())] {
            let refused = engine.submit(command).await.expect_err("refused");
            assert!(
                refused
                    .to_string()
                    .contains("written to while the engine ran")
                    && refused.to_string().contains(&name(&checkpoint)),
                "{refused}"
            );
        }
        assert_eq!(engine.head().seq, head, "nothing written");
        drop(engine);

        let engine = open(dir.path(), true).expect("restarts");
        assert_eq!(
            format!("{:?}", engine.submit(retry()).await.unwrap()),
            answered,
            "the retry is answered as before (cut short: {cut_short})"
        );
        assert_eq!(engine.head().seq, head);
    }
}

/// The segments from the one holding a checkpoint's point on deleted: the
/// log reads as whole (FORMAT.md, recovery step 5), but the checkpoint
/// shows it was longer. Refused.
#[test]
fn newest_segments_deleted_under_a_checkpoint_are_refused() {
    let dir = data_with_checkpoint();
    let checkpoint = spark_core::checkpoint::list(dir.path())[0].1.clone();
    let at = spark_core::checkpoint::peek(&checkpoint, &log_dir(dir.path()))
        .unwrap()
        .at;
    let files = segments(dir.path());
    let mut removed = 0;
    for file in &files {
        let first_seq: u64 = name(file)[..20].parse().unwrap();
        if first_seq >= at.segment_first_seq {
            std::fs::remove_file(file).unwrap();
            removed += 1;
        }
    }
    assert!(
        removed >= 1 && removed < files.len(),
        "{removed} of {}",
        files.len()
    );
    assert_lost(dir.path(), &checkpoint, "is missing");
}

/// Zeros from the last committed records to the file's end, its length
/// kept (a disk that lost writes it had confirmed, as a pre-allocated
/// segment's zero fill looks): the checkpoint's chain value
/// no longer matches, and recovery ends the log at the zeros. The
/// recovered log ends before the checkpoint's seq: refused.
#[test]
fn zeros_over_records_a_checkpoint_covers_are_refused() {
    let (dir, checkpoint, at) = data_ending_in_a_checkpoint();
    zero_the_tail_below(dir.path(), &at);
    let refusal = assert_lost(dir.path(), &checkpoint, "the recovered log ends at seq");
    // Recovery had cut the zeros as a torn tail before the refusal; what it
    // cut is kept beside the segment, as always.
    assert!(refusal.contains("(recovery: "), "{refusal}");
}

/// The same zeros with an older checkpoint beside the newest (two are kept
/// by default): the engine starts from the older one, whose chain value
/// still matches, and must still refuse, since the newest shows the lost
/// seqs were committed (found by a break-test: it started and handed the
/// lost seqs out again).
#[test]
fn zeros_over_records_are_refused_also_when_an_older_checkpoint_still_matches() {
    let dir = tempfile::tempdir().unwrap();
    append_creates(dir.path(), 0, CREATES - 200);
    write_checkpoint(dir.path());
    append_creates(dir.path(), CREATES - 200, CREATES);
    let (newest, at) = write_checkpoint(dir.path());
    assert_eq!(spark_core::checkpoint::list(dir.path()).len(), 2);
    zero_the_tail_below(dir.path(), &at);
    assert_lost(dir.path(), &newest, "the recovered log ends at seq");
}

/// A compaction rewrites sealed segments; the scrub reads the segments a
/// checkpointed start deferred against the chain values that start linked.
/// So a moment due for erasure waits until the scrub has read them all:
/// no false damage, and then the erasure runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_waits_for_the_scrub_of_the_segments_a_checkpointed_start_deferred() {
    let dir = data_with_checkpoint();
    let mut settings = settings(dir.path(), true);
    settings.retention.erase_after_ms = 0;
    let engine = Arc::new(open(dir.path(), true).unwrap());
    assert!(!engine.recovery().deferred.is_empty());
    let id = spark_core::ids::Id::from_parts(synth::BASE_MS + 1, 7919);
    engine
        .submit(spark_engine::engine::Command::DeleteMoment(
            spark_engine::engine::DeleteMoment {
                id,
                request_id: None,
                if_match: None,
                device: "t".into(),
            },
        ))
        .await
        .unwrap();
    let fs: Arc<dyn spark_log_format::Fs> = Arc::new(OsFs);
    let compactor = spark_engine::retention::Compactor::new(
        &settings,
        Arc::clone(&engine),
        spark_engine::media::MediaStore::open(dir.path(), Arc::clone(&fs)).unwrap(),
        fs,
        Arc::new(SystemClock),
    );
    let waiting = compactor.pass().await.unwrap();
    assert!(
        waiting.waiting_for_scrub && waiting.erased.is_empty(),
        "{waiting:?}"
    );
    assert!(!engine.read(|m| m.is_erased(id)));

    engine.start_scrub().unwrap();
    let scrubbing = Arc::clone(&engine);
    tokio::task::spawn_blocking(move || wait_for_scrub(&scrubbing))
        .await
        .unwrap();
    let done = compactor.pass().await.unwrap();
    assert_eq!(done.erased, vec![id], "{done:?}");
    assert!(engine.read(|m| m.is_erased(id)));
    assert!(engine.scrub_status().damage().is_empty());
    engine.shutdown().await;
}
