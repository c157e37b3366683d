//! Commands that arrive while the batch before them is being synced. A
//! slowed fdatasync (`FaultyFs::set_delay`) keeps a batch in its sync long
//! enough for the next commands to queue behind it; whichever way the
//! threads interleave, the assertions hold. (Written for a pipelined
//! commit, tried and dropped; they hold for any journal that
//! keeps the write path's rules.)

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use spark_log_format::{Fault, FaultOp, FaultyFs, OsFs};

use crate::clock::SystemClock;
use crate::config::Settings;
use crate::engine::{Command, CreateMoment, EditMoment, Engine, EngineError, Outcome};
use spark_core::ids::Id;

/// How long each fdatasync is held back while a test queues commands
/// behind it (not a speed check: the outcome is the same at any delay).
const SYNC_DELAY: Duration = Duration::from_millis(150);

fn settings(data: &std::path::Path) -> Settings {
    Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    }
}

fn open(data: &std::path::Path, fs: &FaultyFs) -> Arc<Engine> {
    Arc::new(Engine::open(&settings(data), Arc::new(fs.clone()), Arc::new(SystemClock)).unwrap())
}

fn create(id: Id, request_id: &str) -> Command {
    Command::CreateMoment(CreateMoment {
        id: Some(id),
        request_id: Some(request_id.into()),
        text: Some("sign".into()),
        caption: None,
        lang: None,
        captured_at_ms: None,
        device: "test".into(),
    })
}

fn edit(id: Id, text: &str) -> Command {
    Command::EditMoment(EditMoment {
        id,
        request_id: None,
        if_match: None,
        text: Some(Some(text.into())),
        caption: None,
        lang: None,
        device: "test".into(),
    })
}

fn new_id() -> Id {
    Id::from_parts(crate::clock::Clock::now_ms(&SystemClock), rand::random())
}

/// Each answer with the name of its command and the engine's published
/// head seq when the answer reached its task (a batch's head is published
/// only after its fdatasync), in the order the tasks recorded them.
type Answers = Arc<Mutex<Vec<(&'static str, Result<Outcome, EngineError>, u64)>>>;

/// Submits `command` on its own task; its answer lands in `answers` under
/// `name`, with the head seq it was answered at.
fn submit(
    engine: &Arc<Engine>,
    answers: &Answers,
    name: &'static str,
    command: Command,
) -> tokio::task::JoinHandle<()> {
    let (engine, answers) = (Arc::clone(engine), Arc::clone(answers));
    tokio::spawn(async move {
        let answer = engine.submit(command).await;
        let head_seq = engine.head().seq;
        answers.lock().push((name, answer, head_seq));
    })
}

/// The published head seq when `name`'s answer reached its task.
fn head_at_answer(answers: &Answers, name: &str) -> u64 {
    answers
        .lock()
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|(.., head_seq)| *head_seq)
        .unwrap_or_else(|| panic!("{name} was not answered"))
}

/// Waits until the fdatasync calls reach `count` (a batch is in its sync).
async fn until_syncs(fs: &FaultyFs, count: u64) {
    while fs.count(FaultOp::SyncData) < count {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// An engine on `data` whose every fdatasync is held back by
/// [`SYNC_DELAY`]: its file system, the engine, where answers land, and the
/// fdatasync calls made before any command (at open).
fn open_slowed(data: &std::path::Path) -> (FaultyFs, Arc<Engine>, Answers, u64) {
    let fs = FaultyFs::new(Arc::new(OsFs));
    let engine = open(data, &fs);
    let syncs = fs.count(FaultOp::SyncData);
    fs.set_delay(FaultOp::SyncData, Some(SYNC_DELAY));
    (fs, engine, Answers::default(), syncs)
}

fn answer_of(answers: &Answers, name: &str) -> Result<Outcome, EngineError> {
    answers
        .lock()
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|(_, a, _)| a.clone())
        .unwrap_or_else(|| panic!("{name} was not answered"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_arriving_while_its_create_syncs_answers_the_stored_moment_once() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, engine, answers, syncs) = open_slowed(dir.path());
    let (a, b) = (new_id(), new_id());
    let first = submit(&engine, &answers, "create", create(a, "r-a"));
    until_syncs(&fs, syncs + 1).await;
    // The create's batch is in its fdatasync: its retry and an unrelated
    // create queue behind it.
    let retry = submit(&engine, &answers, "retry", create(a, "r-a"));
    let other = submit(&engine, &answers, "other", create(b, "r-b"));
    for task in [first, retry, other] {
        task.await.unwrap();
    }
    fs.set_delay(FaultOp::SyncData, None);

    let Ok(Outcome::MomentCreated {
        created: true,
        moment: created,
        ..
    }) = answer_of(&answers, "create")
    else {
        panic!("the create: {:?}", answer_of(&answers, "create"));
    };
    let Ok(Outcome::MomentCreated {
        created: false,
        replayed: Some(replayed),
        moment: retried,
    }) = answer_of(&answers, "retry")
    else {
        panic!("the retry: {:?}", answer_of(&answers, "retry"));
    };
    assert_eq!(retried, created, "the retry answers the stored moment");
    assert_eq!(replayed.request_id.as_deref(), Some("r-a"));
    assert!(matches!(
        answer_of(&answers, "other"),
        Ok(Outcome::MomentCreated { created: true, .. })
    ));
    // One op per moment: the retry wrote nothing.
    assert_eq!(engine.read(|m| (m.seq, m.moments.len())), (2, 2));
    // The retry was answered from durable state: the create's batch was
    // published (after its fdatasync) before the retry's answer arrived.
    // (Which of the two tasks records its answer first is the
    // scheduler's choice, not the journal's.)
    let created_seq = replayed.seq;
    assert!(
        head_at_answer(&answers, "retry") >= created_seq,
        "the retry was answered at head {} before the create (seq {created_seq}) was durable",
        head_at_answer(&answers, "retry")
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_queued_behind_its_create_waits_for_it_and_answers_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, engine, answers, syncs) = open_slowed(dir.path());
    let (a, b) = (new_id(), new_id());
    let first = submit(&engine, &answers, "create a", create(a, "r-a"));
    until_syncs(&fs, syncs + 1).await;
    let edited = submit(&engine, &answers, "edit a", edit(a, "edited"));
    let other = submit(&engine, &answers, "create b", create(b, "r-b"));
    for task in [first, edited, other] {
        task.await.unwrap();
    }
    fs.set_delay(FaultOp::SyncData, None);

    // The edit was decided against a mirror holding the create.
    let Ok(Outcome::MomentEdited {
        changed: true,
        moment,
    }) = answer_of(&answers, "edit a")
    else {
        panic!("the edit: {:?}", answer_of(&answers, "edit a"));
    };
    assert_eq!(
        (moment.version, moment.text.as_deref()),
        (2, Some("edited"))
    );
    let order: Vec<&str> = answers.lock().iter().map(|(n, ..)| *n).collect();
    let at = |name| order.iter().position(|n| *n == name).unwrap();
    assert!(at("create a") < at("edit a"), "answer order: {order:?}");
    // Time never runs backwards across batches.
    let (seqs, times): (Vec<u64>, Vec<u64>) = engine.read(|m| {
        let mut ops: Vec<(u64, u64)> = m
            .moments
            .values()
            .map(|m| (m.created_seq(), m.created_at_ms))
            .collect();
        ops.sort_unstable();
        ops.into_iter().unzip()
    });
    assert_eq!(seqs.len(), 2);
    assert!(times.windows(2).all(|t| t[0] <= t[1]), "ts_ms {times:?}");
    assert_eq!(engine.read(|m| m.seq), 3);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fdatasync_refuses_its_batch_the_one_behind_it_and_all_after() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, engine, answers, syncs) = open_slowed(dir.path());
    let (a, b, c) = (new_id(), new_id(), new_id());
    fs.fail(FaultOp::SyncData, syncs + 1, Fault::Os(5));
    let first = submit(&engine, &answers, "n", create(a, "r-a"));
    until_syncs(&fs, syncs + 1).await;
    // Decided while batch N syncs, then refused once its sync fails.
    let behind = submit(&engine, &answers, "n+1", create(b, "r-b"));
    first.await.unwrap();
    behind.await.unwrap();
    let after = submit(&engine, &answers, "after", create(c, "r-c"));
    after.await.unwrap();
    fs.set_delay(FaultOp::SyncData, None);

    for name in ["n", "n+1", "after"] {
        assert!(
            matches!(answer_of(&answers, name), Err(EngineError::Unavailable(_))),
            "{name}: {:?}",
            answer_of(&answers, name)
        );
    }
    assert!(engine.poisoned().is_some());
    assert_eq!(engine.read(|m| m.seq), 0, "nothing reached the mirror");
    // No fdatasync after the failed one: it is never retried, and batch
    // N+1 was never written.
    assert_eq!(fs.count(FaultOp::SyncData), syncs + 1);
    engine.shutdown().await;
    drop(engine);

    // After a restart, N+1 and what came after are not in the log (N may
    // be: written, its sync failed, never acknowledged).
    let reopened = open(dir.path(), &FaultyFs::new(Arc::new(OsFs)));
    reopened.read(|m| {
        assert!(!m.moments.contains_key(&b) && !m.moments.contains_key(&c));
        assert!(m.seq <= 1);
    });
    reopened.shutdown().await;
}
