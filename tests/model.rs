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
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command, CreateMoment, DeleteMoment, EditMoment, PutMedia};
use spark_engine::op::{MediaRole, OpKind};
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
        2 => (0..5u8, 0..6u8, any::<bool>(), 0..2u8)
            .prop_map(|(media, moment, original, bytes)| Step::Media { media, moment, original, bytes }),
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
    /// media id -> (moment, role, first byte of the digest)
    media: HashMap<Id, (Id, MediaRole, u8)>,
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
        Err(EngineError::NotFound(_)) => Err("not_found"),
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
                Step::Media { media, moment, original, bytes } => {
                    let (id, moment_id) = (media_ulid(media), ulid(moment));
                    let role = if original { MediaRole::Original } else { MediaRole::Copy };
                    let digest = [bytes; 32];
                    let expect = match model.media.get(&id) {
                        Some((_, _, b)) if *b != bytes => Err("conflict"),
                        Some((m, r, _)) if *m != moment_id || *r != role => Err("conflict"),
                        Some(_) => Ok((false, id, u32::from(bytes), false)),
                        None => match model.moments.get(&moment_id) {
                            None => Err("not_found"),
                            Some(m) if m.deleted => Err("deleted"),
                            Some(_) if model.media.values().any(|(m, r, _)| *m == moment_id && *r == role) => {
                                Err("conflict")
                            }
                            Some(_) => Ok((true, id, u32::from(bytes), false)),
                        },
                    };
                    let command = Command::PutMedia(PutMedia {
                        id, moment_id, role, sha256: digest, size_bytes: 10,
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
                        model.media.insert(id, (c.moment_id, c.role, c.sha256[0]));
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
        runtime.block_on(engine.shutdown());
    }
}

/// Media under the power-cut model (issue 19): the blob path (temporary
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
