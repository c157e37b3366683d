//! A model test: random sequences of creates, edits, deletes and uploads
//! (with reused ids and request ids, If-Match, clean restarts and crashes
//! with power cuts in between, and crashes while a create's write is in
//! flight, its pages then persisting in any order) go through the real
//! engine, on the in-memory file system that models power loss, and through
//! a few lines of plain model; every answer and the final state must agree,
//! a restart or a crash must give back the same mirror, and a crash in the
//! middle of a write must neither stop the engine from starting nor lose an
//! acknowledged op (the unacknowledged create comes back whole or not at
//! all).

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use spark_core::op::{MediaRole, OpKind};
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command, CreateMoment, DeleteMoment, EditMoment, PutMedia};
use spark_engine::{Engine, EngineError, Id, Outcome};
use spark_log_format::{CutMode, MemFs};

#[derive(Clone, Debug)]
enum Step {
    Create {
        id: Option<u8>,
        rid: Option<u8>,
        text: u8,
    },
    Edit {
        id: u8,
        rid: Option<u8>,
        text: u8,
        if_match: Option<u32>,
    },
    Delete {
        id: u8,
        rid: Option<u8>,
    },
    Media {
        media: u8,
        moment: u8,
        photo: u8,
        original: bool,
        bytes: u8,
    },
    Restart,
    Crash {
        mode: u8,
        seed: u64,
    },
    /// The machine stops while a create's write is in flight (written, its
    /// fdatasync never returns), then the power goes: the write's pages
    /// persist in any order (`CutMode::Pages`).
    CrashMidWrite {
        text: u8,
        seed: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (proptest::option::of(0..6u8), proptest::option::of(0..8u8), 0..3u8)
            .prop_map(|(id, rid, text)| Step::Create { id, rid, text }),
        3 => (0..6u8, proptest::option::of(0..8u8), 0..3u8, proptest::option::of(1..4u32))
            .prop_map(|(id, rid, text, if_match)| Step::Edit { id, rid, text, if_match }),
        2 => (0..6u8, proptest::option::of(0..8u8)).prop_map(|(id, rid)| Step::Delete { id, rid }),
        2 => (0..5u8, 0..6u8, 0..2u8, any::<bool>(), 0..2u8).prop_map(
            |(media, moment, photo, original, bytes)| Step::Media { media, moment, photo, original, bytes }
        ),
        1 => Just(Step::Restart),
        1 => (any::<u8>(), any::<u64>()).prop_map(|(mode, seed)| Step::Crash { mode, seed }),
        1 => (0..3u8, any::<u64>()).prop_map(|(text, seed)| Step::CrashMidWrite { text, seed }),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct ModelMoment {
    text: String,
    version: u32,
    deleted: bool,
}

#[derive(Default)]
struct Model {
    moments: HashMap<Id, ModelMoment>,
    /// media id -> (moment, photo, role, first byte of the digest)
    media: HashMap<Id, (Id, u8, MediaRole, u8)>,
    requests: HashMap<String, (OpKind, Id)>,
    ops: u64,
}

/// What the model expects: Ok((flag, id, version, deleted)) or the error's kind.
type Expect = Result<(bool, Id, u32, bool), &'static str>;

impl Model {
    fn known(
        &self,
        rid: &Option<String>,
        kind: OpKind,
        id: Option<Id>,
    ) -> Option<Result<Id, &'static str>> {
        let (k, e) = self.requests.get(rid.as_ref()?)?;
        if *k != kind || id.is_some_and(|id| id != *e) {
            return Some(Err("conflict"));
        }
        Some(Ok(*e))
    }

    fn answer(&self, flag: bool, id: Id) -> Expect {
        let m = &self.moments[&id];
        Ok((flag, id, m.version, m.deleted))
    }

    fn record(&mut self, rid: Option<String>, kind: OpKind, id: Id) {
        self.ops += 1;
        if let Some(r) = rid {
            self.requests.entry(r).or_insert((kind, id));
        }
    }
}

fn ulid(n: u8) -> Id {
    Id::from_parts(1_767_225_600_000, u128::from(n) + 1)
}

fn media_ulid(n: u8) -> Id {
    Id::from_parts(1_767_225_700_000, u128::from(n) + 1)
}

fn view(outcome: Result<Outcome, EngineError>) -> Expect {
    match outcome {
        Ok(Outcome::MomentCreated {
            created: f, moment, ..
        })
        | Ok(Outcome::MomentEdited { changed: f, moment })
        | Ok(Outcome::MomentDeleted { deleted: f, moment }) => {
            Ok((f, moment.id, moment.version, moment.deleted))
        }
        // For media: (created, media id, first digest byte, false).
        Ok(Outcome::MediaPut { created, media, .. }) => Ok((
            created,
            media.id,
            u32::from_str_radix(&media.sha256[..2], 16).unwrap(),
            false,
        )),
        Err(EngineError::Conflict(_)) => Err("conflict"),
        Err(EngineError::MomentNotFound(_)) => Err("not_found"),
        Err(EngineError::Deleted(_)) => Err("deleted"),
        Err(EngineError::PreconditionFailed { .. }) => Err("precondition_failed"),
        Err(EngineError::Unavailable(_)) => Err("unavailable"),
        Err(EngineError::InsufficientStorage(_)) => Err("insufficient_storage"),
        Err(EngineError::Fenced(_)) => Err("fenced"),
        Err(EngineError::Missing(_)) => Err("missing"),
        Err(EngineError::Invalid(_)) => Err("invalid"),
        Err(EngineError::ClockSkew { .. }) => Err("clock_skew"),
        Err(EngineError::RequestId(_)) => Err("request_id"),
        Ok(other) => panic!("the model sends no command that answers {other:?}"),
    }
}

/// The engine over the in-memory file system that models power loss.
fn open(settings: &Settings, fs: &Arc<MemFs>) -> Engine {
    let fs: Arc<dyn spark_log_format::Fs> = fs.clone();
    Engine::open(settings, fs, Arc::new(SystemClock)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_the_model(steps in proptest::collection::vec(step(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings { data_dir: dir.path().to_owned(), ..Settings::default() };
        let fs = Arc::new(MemFs::new());
        let mut engine = open(&settings, &fs);
        let mut model = Model::default();
        for step in steps {
            let rid = |r: Option<u8>| r.map(|r| format!("rid-{r}"));
            let (command, expect): (Command, Expect) = match step {
                Step::Restart => {
                    let before = engine.read(|m| m.digest());
                    runtime.block_on(engine.shutdown());
                    drop(engine);
                    engine = open(&settings, &fs);
                    prop_assert_eq!(engine.read(|m| m.digest()), before);
                    continue;
                }
                Step::Crash { mode, seed } => {
                    // No shutdown: the process dies and the power goes.
                    // Every answered op was synced, so the mirror replayed
                    // from what the disk kept must be the same.
                    let before = engine.read(|m| m.digest());
                    drop(engine);
                    fs.power_cut(CutMode::ALL[usize::from(mode) % CutMode::ALL.len()], seed);
                    engine = open(&settings, &fs);
                    prop_assert_eq!(engine.read(|m| m.digest()), before);
                    continue;
                }
                Step::CrashMidWrite { text, seed } => {
                    let before = engine.read(|m| m.digest());
                    // An id no other step names: the model learns it only
                    // if the create comes back.
                    let id = ulid(100 + (model.ops % 100) as u8);
                    // About 9 KB: the write spans three or four pages, so
                    // a cut can keep any of them.
                    let long_text = format!("t{text}{}", "x".repeat(9000));
                    let command = Command::CreateMoment(CreateMoment {
                        id: Some(id), request_id: None, text: Some(long_text.clone()),
                        caption: None, lang: None, captured_at_ms: None, device: "model".into(),
                    });
                    fs.crash_after(1);
                    let got = runtime.block_on(engine.submit(command));
                    prop_assert!(got.is_err(), "a create whose fdatasync failed was acknowledged");
                    drop(engine);
                    fs.power_cut(CutMode::Pages, seed);
                    engine = open(&settings, &fs);
                    if engine.head().seq == model.ops {
                        prop_assert_eq!(engine.read(|m| m.digest()), before);
                    } else {
                        // Every page arrived: the whole create is back.
                        prop_assert_eq!(engine.head().seq, model.ops + 1);
                        model.moments.insert(id, ModelMoment { text: long_text, version: 1, deleted: false });
                        model.ops += 1;
                    }
                    continue;
                }
                Step::Create { id, rid: r, text } => {
                    let id = id.map(ulid);
                    let r = rid(r);
                    let expect = match model.known(&r, OpKind::MomentCreate, None) {
                        Some(Ok(e)) => model.answer(false, e),
                        Some(Err(e)) => Err(e),
                        None => match id.filter(|i| model.moments.contains_key(i)) {
                            Some(i) => model.answer(false, i),
                            // Minted ids are unknown to the model: checked below.
                            None => Ok((true, id.unwrap_or_default(), 1, false)),
                        },
                    };
                    let command = Command::CreateMoment(CreateMoment {
                        id, request_id: r, text: Some(format!("t{text}")), caption: None,
                        lang: None, captured_at_ms: None, device: "model".into(),
                    });
                    (command, expect)
                }
                Step::Edit { id, rid: r, text, if_match } => {
                    let id = ulid(id);
                    let r = rid(r);
                    let new_text = format!("t{text}");
                    let expect = match model.known(&r, OpKind::MomentEdit, Some(id)) {
                        Some(Ok(e)) => model.answer(false, e),
                        Some(Err(e)) => Err(e),
                        None => match model.moments.get(&id) {
                            None => Err("not_found"),
                            Some(m) if m.deleted => Err("deleted"),
                            Some(m) if if_match.is_some_and(|v| v != m.version) => Err("precondition_failed"),
                            Some(m) if m.text == new_text => model.answer(false, id),
                            Some(_) => Ok((true, id, model.moments[&id].version + 1, false)),
                        },
                    };
                    let command = Command::EditMoment(EditMoment {
                        id, request_id: r, if_match, text: Some(Some(new_text)), caption: None,
                        lang: None, device: "model".into(),
                    });
                    (command, expect)
                }
                Step::Media { media, moment, photo, original, bytes } => {
                    let (id, moment_id) = (media_ulid(media), ulid(moment));
                    let role = if original { MediaRole::Original } else { MediaRole::Copy };
                    let digest = [bytes; 32];
                    // Each photo of a moment holds one copy and one original
                    // (issue 27).
                    let expect = match model.media.get(&id) {
                        Some((_, _, _, b)) if *b != bytes => Err("conflict"),
                        Some((m, p, r, _)) if *m != moment_id || *p != photo || *r != role => {
                            Err("conflict")
                        }
                        Some(_) => Ok((false, id, u32::from(bytes), false)),
                        None => match model.moments.get(&moment_id) {
                            None => Err("not_found"),
                            Some(m) if m.deleted => Err("deleted"),
                            Some(_) if model.media.values().any(|(m, p, r, _)| {
                                *m == moment_id && *p == photo && *r == role
                            }) => Err("conflict"),
                            Some(_) => Ok((true, id, u32::from(bytes), false)),
                        },
                    };
                    let command = Command::PutMedia(PutMedia {
                        id, moment_id, role, photo, sha256: digest, size_bytes: 10,
                        content_type: "image/jpeg".into(), device: "model".into(),
                    });
                    (command, expect)
                }
                Step::Delete { id, rid: r } => {
                    let id = ulid(id);
                    let r = rid(r);
                    let expect = match model.known(&r, OpKind::MomentDelete, Some(id)) {
                        Some(Ok(e)) => model.answer(false, e),
                        Some(Err(e)) => Err(e),
                        None => match model.moments.get(&id) {
                            None => Err("not_found"),
                            Some(m) if m.deleted => model.answer(false, id),
                            Some(m) => Ok((true, id, m.version + 1, true)),
                        },
                    };
                    let command = Command::DeleteMoment(DeleteMoment {
                        id, request_id: r, if_match: None, device: "model".into(),
                    });
                    (command, expect)
                }
            };
            let got = view(runtime.block_on(engine.submit(command.clone())));
            match (&expect, &got) {
                (Ok((true, want_id, _, _)), Ok((true, got_id, 1, false))) if *want_id == Id::default() => {
                    // A minted id: new to the model.
                    prop_assert!(!model.moments.contains_key(got_id));
                }
                _ => prop_assert_eq!(&got, &expect, "{:?}", command),
            }
            // Apply what was written to the model.
            if let Ok((true, id, version, deleted)) = got {
                match &command {
                    Command::CreateMoment(c) => {
                        model.moments.insert(id, ModelMoment { text: c.text.clone().unwrap(), version, deleted });
                        model.record(c.request_id.clone(), OpKind::MomentCreate, id);
                    }
                    Command::EditMoment(c) => {
                        let m = model.moments.get_mut(&id).unwrap();
                        m.text = c.text.clone().unwrap().unwrap();
                        m.version = version;
                        model.record(c.request_id.clone(), OpKind::MomentEdit, id);
                    }
                    Command::DeleteMoment(c) => {
                        let m = model.moments.get_mut(&id).unwrap();
                        m.deleted = true;
                        m.version = version;
                        model.record(c.request_id.clone(), OpKind::MomentDelete, id);
                    }
                    Command::PutMedia(c) => {
                        model.media.insert(id, (c.moment_id, c.photo, c.role, c.sha256[0]));
                        model.moments.get_mut(&c.moment_id).unwrap().version += 1;
                        model.ops += 1;
                    }
                    other => panic!("the model sends no {other:?}"),
                }
            }
        }
        prop_assert_eq!(engine.head().seq, model.ops);
        let state: HashMap<Id, ModelMoment> = engine.read(|m| {
            m.moments.values().map(|x| (x.id, ModelMoment {
                text: x.text().unwrap_or_default().to_owned(), version: x.version, deleted: x.deleted,
            })).collect()
        });
        prop_assert_eq!(state, model.moments.clone());
        let media: HashMap<Id, (Id, u8, MediaRole, u8)> = engine.read(|m| {
            m.media.values().map(|x| (x.id, (x.moment_id, x.photo, x.role, x.sha256.0[0]))).collect()
        });
        prop_assert_eq!(media, model.media.clone());
        runtime.block_on(engine.shutdown());
    }
}

/// Media under the power-cut model: the blob path (temporary
/// file, fsync, rename, directory fsync, then the op) runs on the same
/// `MemFs` as the log. The machine stops after every possible number of
/// file-system calls while three uploads go through the engine's own put
/// path: a new one, one refused with the bytes of a committed media (its
/// blob must stay), and one refused with bytes of its own (its blob goes);
/// then the power is cut. After the restart every `media.put` has its blob
/// with its bytes, every acknowledged upload is there, and the startup
/// sweep leaves no orphan.
#[test]
fn a_power_cut_never_leaves_a_media_op_without_its_blob() {
    use sha2::{Digest, Sha256};
    use spark_engine::media::{MediaStore, PutError};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        data_dir: dir.path().to_owned(),
        ..Settings::default()
    };
    let moment = ulid(1);
    let put = |id: u8, role: MediaRole, bytes: &[u8]| {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        (
            bytes.to_vec(),
            PutMedia {
                id: media_ulid(id),
                moment_id: moment,
                role,
                photo: 0,
                sha256: digest,
                size_bytes: bytes.len() as u64,
                content_type: "image/jpeg".into(),
                device: "model".into(),
            },
        )
    };
    let first = put(0, MediaRole::Copy, &[1u8; 9000]);
    let under_cut = [
        put(1, MediaRole::Original, &[2u8; 9000]),
        put(2, MediaRole::Copy, &[1u8; 9000]),
        put(3, MediaRole::Copy, &[3u8; 5000]),
    ];
    let upload =
        |store: &MediaStore, engine: &Arc<Engine>, (bytes, command): (Vec<u8>, PutMedia)| {
            let body = futures_util::stream::iter(vec![Ok(bytes::Bytes::from(bytes))]);
            runtime.block_on(async {
                let received = store
                    .receive(body, 1 << 20)
                    .await
                    .map_err(|e| PutError::Store(std::io::Error::other(e.to_string())))?;
                store
                    .spawn_put(Arc::clone(engine), received, command)
                    .await
                    .unwrap()
            })
        };
    let mut calls_run = 0;
    for crash_after in 0.. {
        let fs = Arc::new(MemFs::new());
        let seam: Arc<dyn spark_log_format::Fs> = fs.clone();
        let engine = Arc::new(open(&settings, &fs));
        let store = MediaStore::open(dir.path(), Arc::clone(&seam)).unwrap();
        runtime
            .block_on(engine.submit(Command::CreateMoment(CreateMoment {
                id: Some(moment),
                request_id: None,
                text: None,
                caption: None,
                lang: None,
                captured_at_ms: None,
                device: "model".into(),
            })))
            .unwrap();
        let mut acked = vec![first.1.id];
        assert!(upload(&store, &engine, first.clone()).is_ok());
        let ops_before = fs.ops();
        fs.crash_after(crash_after);
        for (n, step) in under_cut.iter().enumerate() {
            let answer = upload(&store, &engine, step.clone());
            match (n, answer) {
                (0, Ok(Outcome::MediaPut { created: true, .. })) => acked.push(step.1.id),
                (_, Err(PutError::Engine(EngineError::Conflict(_)))) if n > 0 => {}
                (_, Err(PutError::Store(_) | PutError::Engine(EngineError::Unavailable(_)))) => {}
                (n, other) => panic!("upload {n} after {crash_after} calls: {other:?}"),
            }
        }
        let crashed = fs.crashed();
        calls_run = fs.ops() - ops_before;
        drop(store);
        assert_eq!(Arc::strong_count(&engine), 1);
        drop(engine);
        fs.power_cut(
            CutMode::ALL[crash_after as usize % CutMode::ALL.len()],
            crash_after,
        );
        let engine = open(&settings, &fs);
        let store = MediaStore::open(dir.path(), seam).unwrap();
        let media: Vec<_> = engine.read(|m| m.media.values().cloned().collect());
        for id in &acked {
            assert!(
                media.iter().any(|m| m.id == *id),
                "acknowledged media {id} lost after {crash_after} calls"
            );
        }
        let referenced = media.iter().map(|m| m.sha256.0).collect();
        store
            .remove_orphans(&referenced, std::time::Duration::ZERO)
            .unwrap();
        let mut blobs: Vec<_> = fs
            .paths()
            .into_iter()
            .filter(|p| p.starts_with(store.blobs_dir()))
            .collect();
        blobs.sort();
        for m in &media {
            let bytes = fs
                .read(&store.blob_path(&m.sha256.0))
                .unwrap_or_else(|| panic!("media {} has no blob after {crash_after} calls", m.id));
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            assert_eq!(
                (digest, bytes.len() as u64),
                (m.sha256.0, m.size_bytes),
                "media {} after {crash_after} calls",
                m.id
            );
        }
        assert_eq!(
            blobs.len(),
            referenced.len(),
            "orphans after {crash_after} calls: {blobs:?}"
        );
        runtime.block_on(engine.shutdown());
        if !crashed {
            break;
        }
    }
    // The last run went through without a crash: every call was cut after.
    assert!(calls_run >= 12, "the uploads made {calls_run} calls");
}

/// One step of the HTTP model: writes through the real server's routes,
/// and the machine stopping (with a power cut whose last write may persist
/// its pages in any order) while batches of concurrent creates are in
/// flight.
#[derive(Clone, Debug)]
enum HttpStep {
    Create {
        id: Option<u8>,
        rid: Option<u8>,
        text: u8,
    },
    Edit {
        id: u8,
        text: u8,
    },
    Delete {
        id: u8,
    },
    Restart,
    /// `creates` concurrent creates of about 3 KB each (so the journal
    /// group-commits several into one write spanning pages); the machine
    /// stops after `calls` more file-system calls, then the power goes with
    /// the last write of each file persisting its pages in any order.
    CrashUnderCreates {
        creates: u8,
        calls: u8,
        seed: u64,
    },
}

fn http_step() -> impl Strategy<Value = HttpStep> {
    prop_oneof![
        4 => (proptest::option::of(0..6u8), proptest::option::of(0..8u8), 0..3u8)
            .prop_map(|(id, rid, text)| HttpStep::Create { id, rid, text }),
        2 => (0..6u8, 0..3u8).prop_map(|(id, text)| HttpStep::Edit { id, text }),
        1 => (0..6u8).prop_map(|id| HttpStep::Delete { id }),
        1 => Just(HttpStep::Restart),
        2 => (2..16u8, 0..6u8, any::<u64>())
            .prop_map(|(creates, calls, seed)| HttpStep::CrashUnderCreates { creates, calls, seed }),
    ]
}

/// A moment as the HTTP model keeps it: what the last acknowledged answer
/// said.
#[derive(Clone, Debug, PartialEq)]
struct SeenMoment {
    text: Option<String>,
    version: u64,
    deleted: bool,
}

fn seen(moment: &serde_json::Value) -> (String, SeenMoment) {
    (
        moment["id"]
            .as_str()
            .expect("a moment has an id")
            .to_owned(),
        SeenMoment {
            text: moment["text"].as_str().map(str::to_owned),
            version: moment["version"].as_u64().expect("a version"),
            deleted: moment["deleted"].as_bool().expect("deleted"),
        },
    )
}

/// The server over `fs` (the power-loss model), on an ephemeral port.
async fn http_server(settings: &Settings, fs: &Arc<MemFs>) -> spark_engine::server::RunningServer {
    let seam: Arc<dyn spark_log_format::Fs> = fs.clone();
    spark_engine::server::start_with(settings.clone(), seam, Arc::new(SystemClock))
        .await
        .expect("the server starts: a torn last batch never stops it")
}

async fn http_call(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = client.request(method, format!("http://{addr}{path}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (
                status,
                response.json().await.unwrap_or(serde_json::Value::Null),
            )
        }
        // The write path stopping may end a connection: no answer is not an
        // acknowledgement.
        Err(_) => (0, serde_json::Value::Null),
    }
}

/// Every acknowledged moment is served as its last acknowledged answer
/// said, and nothing else is in the feed.
async fn check_served(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    model: &HashMap<String, SeenMoment>,
    what: &str,
) -> Result<(), TestCaseError> {
    for (id, want) in model {
        let (status, body) = http_call(
            client,
            addr,
            reqwest::Method::GET,
            &format!("/api/moments/{id}"),
            None,
        )
        .await;
        if want.deleted {
            // A deleted moment is gone for reads (SPEC section 4).
            prop_assert_eq!(status, 410, "{}: deleted moment {}: {}", what, id, body);
            continue;
        }
        prop_assert_eq!(status, 200, "{}: acknowledged moment {} lost", what, id);
        prop_assert_eq!(&seen(&body).1, want, "{}: moment {}", what, id);
    }
    // The feed lists the live moments, each once, and nothing else.
    let mut listed = Vec::new();
    let mut path = "/api/moments?limit=100".to_owned();
    loop {
        let (status, page) = http_call(client, addr, reqwest::Method::GET, &path, None).await;
        prop_assert_eq!(status, 200, "{}: {}", what, page);
        for moment in page["moments"].as_array().into_iter().flatten() {
            listed.push(moment["id"].as_str().unwrap_or_default().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/api/moments?limit=100&after={next}"),
            None => break,
        }
    }
    listed.sort();
    let mut live: Vec<String> = model
        .iter()
        .filter(|(_, m)| !m.deleted)
        .map(|(id, _)| id.clone())
        .collect();
    live.sort();
    prop_assert_eq!(listed, live, "{}: the feed", what);
    Ok(())
}

async fn http_head_seq(client: &reqwest::Client, addr: std::net::SocketAddr) -> u64 {
    let (_, head) = http_call(client, addr, reqwest::Method::GET, "/api/log/head", None).await;
    head["seq"].as_u64().expect("a head seq")
}

/// Runs one case of [`http_agrees_with_the_model_across_crashes_and_torn_batches`].
async fn http_case(steps: Vec<HttpStep>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_owned(),
        ..Settings::default()
    };
    let fs = Arc::new(MemFs::new());
    let client = reqwest::Client::new();
    let mut server = http_server(&settings, &fs).await;
    let mut model: HashMap<String, SeenMoment> = HashMap::new();
    let mut fresh = 0u32;
    for (n, step) in steps.into_iter().enumerate() {
        let what = format!("step {n} ({step:?})");
        let addr = server.addr;
        match step {
            HttpStep::Create { id, rid, text } => {
                let mut body = serde_json::json!({ "text": format!("t{text}") });
                if let Some(id) = id {
                    body["id"] = ulid(id).to_string().into();
                }
                if let Some(rid) = rid {
                    body["client_request_id"] = format!("rid-{rid}").into();
                }
                let (status, answer) = http_call(
                    &client,
                    addr,
                    reqwest::Method::POST,
                    "/api/moments",
                    Some(body),
                )
                .await;
                prop_assert!(
                    [200, 201, 409].contains(&status),
                    "{}: {} {}",
                    what,
                    status,
                    answer
                );
                if status == 200 || status == 201 {
                    let (id, moment) = seen(&answer["moment"]);
                    prop_assert_eq!(status == 201, answer["created"] == true, "{}", what);
                    match model.get(&id) {
                        // A replay answers the stored moment: no duplicate.
                        Some(known) if status == 200 => prop_assert_eq!(known, &moment, "{}", what),
                        Some(_) => prop_assert!(false, "{}: created twice", what),
                        None => prop_assert_eq!(status, 201, "{}: a replay of nothing", what),
                    }
                    model.insert(id, moment);
                }
            }
            HttpStep::Edit { id, text } => {
                let id = ulid(id).to_string();
                let (status, answer) = http_call(
                    &client,
                    addr,
                    reqwest::Method::PATCH,
                    &format!("/api/moments/{id}"),
                    Some(serde_json::json!({ "text": format!("e{text}") })),
                )
                .await;
                match model.get(&id) {
                    None => prop_assert_eq!(status, 404, "{}", what),
                    Some(m) if m.deleted => prop_assert_eq!(status, 410, "{}", what),
                    Some(_) => {
                        prop_assert_eq!(status, 200, "{}: {}", what, answer);
                        model.insert(id, seen(&answer["moment"]).1);
                    }
                }
            }
            HttpStep::Delete { id } => {
                let id = ulid(id).to_string();
                let (status, answer) = http_call(
                    &client,
                    addr,
                    reqwest::Method::DELETE,
                    &format!("/api/moments/{id}"),
                    None,
                )
                .await;
                match model.get(&id) {
                    None => prop_assert_eq!(status, 404, "{}", what),
                    Some(_) => {
                        prop_assert_eq!(status, 200, "{}: {}", what, answer);
                        model.insert(id, seen(&answer["moment"]).1);
                    }
                }
            }
            HttpStep::Restart => {
                server.shutdown().await;
                server = http_server(&settings, &fs).await;
                check_served(&client, server.addr, &model, &what).await?;
            }
            HttpStep::CrashUnderCreates {
                creates,
                calls,
                seed,
            } => {
                let before = http_head_seq(&client, addr).await;
                fs.crash_after(u64::from(calls));
                let long = "x".repeat(3000);
                let sent: Vec<_> = (0..creates)
                    .map(|_| {
                        fresh += 1;
                        let id = Id::from_parts(1_767_225_800_000, u128::from(fresh)).to_string();
                        let body =
                            serde_json::json!({ "id": id, "text": format!("c{fresh}{long}") });
                        let client = client.clone();
                        tokio::spawn(async move {
                            let answer = http_call(
                                &client,
                                addr,
                                reqwest::Method::POST,
                                "/api/moments",
                                Some(body),
                            )
                            .await;
                            (id, answer)
                        })
                    })
                    .collect();
                let mut unacknowledged = Vec::new();
                for task in sent {
                    let (id, (status, answer)) = task.await.unwrap();
                    if status == 201 {
                        model.insert(id, seen(&answer["moment"]).1);
                    } else {
                        prop_assert!(
                            [0, 503].contains(&status),
                            "{}: {} {}",
                            what,
                            status,
                            answer
                        );
                        unacknowledged.push(id);
                    }
                }
                // The machine stops (if the calls did not run out under the
                // load, now), then the power goes.
                fs.crash_after(0);
                tokio::time::timeout(std::time::Duration::from_secs(30), server.shutdown())
                    .await
                    .expect("a crashed server shuts down");
                fs.power_cut(CutMode::Pages, seed);
                server = http_server(&settings, &fs).await;
                let addr = server.addr;
                // An unacknowledged create comes back whole or not at all.
                let unacknowledged_count = unacknowledged.len();
                let mut back = 0;
                for id in unacknowledged {
                    let (status, body) = http_call(
                        &client,
                        addr,
                        reqwest::Method::GET,
                        &format!("/api/moments/{id}"),
                        None,
                    )
                    .await;
                    prop_assert!([200, 404].contains(&status), "{}: {}", what, status);
                    if status == 200 {
                        let (id, moment) = seen(&body);
                        prop_assert!(
                            moment.text.as_deref().is_some_and(|t| t.ends_with(&long)),
                            "{}: a torn create",
                            what
                        );
                        model.insert(id, moment);
                        back += 1;
                    }
                }
                check_served(&client, addr, &model, &what).await?;
                if std::env::var_os("SPARK_MODEL_VERBOSE").is_some() {
                    eprintln!(
                        "{what}: {} unacknowledged, {back} came back whole",
                        unacknowledged_count
                    );
                }
                let head = http_head_seq(&client, addr).await;
                prop_assert!(head >= before + back, "{}: the head went back", what);
            }
        }
    }
    check_served(&client, server.addr, &model, "at the end").await?;
    server.shutdown().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The HTTP model: creates, replays, edits and deletes
    /// through the real routes, clean restarts, and the machine stopping
    /// under bursts of concurrent creates (several group-committed into one
    /// write) with a power cut that persists the last write's pages in any
    /// order: the server always starts again, every acknowledged answer is
    /// what it then serves, and an unacknowledged create comes back whole
    /// or not at all.
    #[test]
    fn http_agrees_with_the_model_across_crashes_and_torn_batches(
        steps in proptest::collection::vec(http_step(), 1..30)
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(http_case(steps))?;
    }
}
