//! The peers of the side-by-side: the same create over
//! the same warp, answered by the glue a careful person would write around
//! SQLite or PostgreSQL, or by nothing at all (the HTTP ceiling).
//!
//! Each runs in its own process: the bench binary re-executes itself as
//! `load --peer NAME --listen ADDR --data DIR [--pg HOST:PORT] [--preallocate BYTES]`, and the
//! peer prints `peer NAME listening on http://ADDR` once it serves, the
//! way the engine announces itself. The HTTP side is the engine's: a
//! multi-threaded tokio runtime with the default worker count, a warp
//! filter turned into a hyper service, hyper's HTTP/1.1 connection with
//! `TCP_NODELAY`, mimalloc. The body is parsed by serde_json into a struct
//! with the create's fields and `captured_at` parsed as RFC 3339; the
//! answer is the engine's shape (`{"created":..,"replayed":null,"moment":{..}}`),
//! `201` for a new moment, `200` with the stored one for a known request
//! id, `409` when the id is taken by another request.
//!
//! - `ceiling`: nothing stored; every create answers `201`.
//! - `floor`: the durable floor (issue 28): request ids (and moment ids)
//!   in in-memory hash maps, and one writer thread that takes every create
//!   queued right now, appends each as a line (its fields as JSON) to a
//!   file pre-allocated with zeros and synced before the peer listens
//!   (`--preallocate BYTES`), with one `pwrite` and one `fdatasync` for
//!   the batch, then answers each. No checksum, no index on disk, no
//!   recovery: the least a server that syncs before it answers must do.
//!   An I/O error ends the process (nothing after it is acknowledged).
//! - `sqlite-group`: rusqlite (bundled), WAL, `synchronous=FULL`; one writer
//!   thread takes every create queued right now, runs them in one
//!   transaction (a savepoint each), commits, then answers each.
//! - `sqlite-txn`: one rusqlite connection behind a mutex, a transaction
//!   per create, on tokio's blocking pool.
//! - `postgres`: tokio-postgres through a deadpool pool of 16 to the
//!   server the bench started (`--pg`), `synchronous_commit=on`, a
//!   transaction per create, in a database of its own made at start.
//!
//! Tables (the same in all three stores): `requests (request_id PRIMARY
//! KEY, moment_id)` and `moments (id PRIMARY KEY, text, caption, lang,
//! captured_at_ms, created_at_ms, version)`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::StatusCode;
use serde::{Deserialize, Serialize};
use warp::Filter;

/// The JSON body limit of the peers: the engine's default (64 KiB).
const BODY_LIMIT: u64 = 64 * 1024;
/// The PostgreSQL pool size.
pub const PG_POOL: usize = 16;

/// The create body: the fields the engine's `POST /api/moments` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    id: Option<String>,
    client_request_id: Option<String>,
    text: Option<String>,
    caption: Option<String>,
    lang: Option<String>,
    captured_at: Option<String>,
}

/// A create after parsing: what a store keeps.
#[derive(Clone)]
struct Create {
    id: String,
    request_id: Option<String>,
    text: Option<String>,
    caption: Option<String>,
    lang: Option<String>,
    captured_at_ms: Option<i64>,
    created_at_ms: i64,
}

/// The moment in an answer, shaped like the engine's.
#[derive(Serialize)]
struct MomentView<'a> {
    id: &'a str,
    text: Option<&'a str>,
    caption: Option<&'a str>,
    lang: Option<&'a str>,
    captured_at: Option<String>,
    created_at: String,
    version: i64,
    deleted: bool,
    media: [u8; 0],
    turns: [u8; 0],
}

#[derive(Serialize)]
struct AnswerBody<'a> {
    created: bool,
    replayed: Option<bool>,
    moment: MomentView<'a>,
}

/// What a store says about one create.
enum Outcome {
    /// Stored now (or, for the ceiling, not at all): `201`.
    Created,
    /// A known request id: `200` with the stored moment.
    Known(Create),
    /// The id belongs to another request: `409`.
    Conflict,
    /// The store failed: `500` with its words.
    Failed(String),
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 in UTC with milliseconds, as the engine writes times.
fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

fn problem(status: StatusCode, code: &str, detail: &str) -> warp::reply::Response {
    let body = serde_json::json!({ "code": code, "detail": detail });
    json_reply(status, serde_json::to_vec(&body).unwrap_or_default())
}

fn json_reply(status: StatusCode, body: Vec<u8>) -> warp::reply::Response {
    let mut response = warp::reply::Response::new(body.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn answer(status: StatusCode, created: bool, c: &Create) -> warp::reply::Response {
    let body = AnswerBody {
        created,
        replayed: None,
        moment: MomentView {
            id: &c.id,
            text: c.text.as_deref(),
            caption: c.caption.as_deref(),
            lang: c.lang.as_deref(),
            captured_at: c.captured_at_ms.map(rfc3339_ms),
            created_at: rfc3339_ms(c.created_at_ms),
            version: 1,
            deleted: false,
            media: [],
            turns: [],
        },
    };
    let mut response = json_reply(status, serde_json::to_vec(&body).unwrap_or_default());
    response.headers_mut().insert(
        hyper::header::ETAG,
        hyper::header::HeaderValue::from_static("\"1\""),
    );
    response
}

/// Parses the body: the create, or the detail of the `400` to answer.
fn parse(body: &[u8]) -> Result<Create, String> {
    let body: CreateBody = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let id = match body.id {
        Some(id) => {
            let parsed: ulid::Ulid = id.parse().map_err(|e| format!("id: {e}"))?;
            parsed.to_string()
        }
        None => ulid::Ulid::new().to_string(),
    };
    let captured_at_ms = body
        .captured_at
        .as_deref()
        .map(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
                .map_err(|e| format!("captured_at: {e}"))
        })
        .transpose()?;
    Ok(Create {
        id,
        request_id: body.client_request_id,
        text: body.text,
        caption: body.caption,
        lang: body.lang,
        captured_at_ms,
        created_at_ms: now_ms(),
    })
}

fn respond(create: &Create, outcome: Outcome) -> warp::reply::Response {
    match outcome {
        Outcome::Created => answer(StatusCode::CREATED, true, create),
        Outcome::Known(stored) => answer(StatusCode::OK, false, &stored),
        Outcome::Conflict => problem(
            StatusCode::CONFLICT,
            "conflict",
            "the id belongs to another request",
        ),
        Outcome::Failed(why) => problem(StatusCode::INTERNAL_SERVER_ERROR, "internal", &why),
    }
}

// ---- SQLite ---------------------------------------------------------------------

const SQLITE_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS requests (request_id TEXT PRIMARY KEY, moment_id TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS moments (
        id TEXT PRIMARY KEY, text TEXT, caption TEXT, lang TEXT,
        captured_at_ms INTEGER, created_at_ms INTEGER NOT NULL, version INTEGER NOT NULL
    ) WITHOUT ROWID;";

fn sqlite_open(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let db = rusqlite::Connection::open(path)?;
    let mode: String = db.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    assert_eq!(mode.to_lowercase(), "wal", "SQLite refused WAL");
    db.execute_batch("PRAGMA synchronous=FULL;")?;
    db.execute_batch(SQLITE_SCHEMA)?;
    Ok(db)
}

/// One create inside the caller's transaction: the request row, then the
/// moment, or the stored moment of a known request id.
fn sqlite_create(db: &rusqlite::Connection, c: &Create) -> rusqlite::Result<Outcome> {
    if let Some(rid) = &c.request_id {
        let fresh = db
            .prepare_cached(
                "INSERT OR IGNORE INTO requests (request_id, moment_id) VALUES (?1, ?2)",
            )?
            .execute(rusqlite::params![rid, c.id])?;
        if fresh == 0 {
            let stored = db
                .prepare_cached(
                    "SELECT m.id, m.text, m.caption, m.lang, m.captured_at_ms, m.created_at_ms
                     FROM requests r JOIN moments m ON m.id = r.moment_id WHERE r.request_id = ?1",
                )?
                .query_row([rid], |r| {
                    Ok(Create {
                        id: r.get(0)?,
                        request_id: Some(rid.clone()),
                        text: r.get(1)?,
                        caption: r.get(2)?,
                        lang: r.get(3)?,
                        captured_at_ms: r.get(4)?,
                        created_at_ms: r.get(5)?,
                    })
                })?;
            return Ok(Outcome::Known(stored));
        }
    }
    let inserted = db
        .prepare_cached(
            "INSERT OR IGNORE INTO moments (id, text, caption, lang, captured_at_ms, created_at_ms, version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1)",
        )?
        .execute(rusqlite::params![
            c.id,
            c.text,
            c.caption,
            c.lang,
            c.captured_at_ms,
            c.created_at_ms
        ])?;
    Ok(if inserted == 1 {
        Outcome::Created
    } else {
        Outcome::Conflict
    })
}

/// A create waiting for the group-commit writer, with where to answer.
type Job = (Create, tokio::sync::oneshot::Sender<warp::reply::Response>);

/// The group-commit writer: blocks for one create, takes every other one
/// queued now, runs them in one transaction (a savepoint each, so one
/// conflict does not undo the others), commits, then answers all. A
/// failed commit answers all of them `500`.
fn sqlite_writer(db: rusqlite::Connection, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while let Ok(more) = jobs.try_recv() {
            batch.push(more);
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        let begun = db.execute_batch("BEGIN");
        for (create, _) in &batch {
            let outcome = match &begun {
                Err(e) => Outcome::Failed(e.to_string()),
                Ok(()) => {
                    let one = db
                        .execute_batch("SAVEPOINT c")
                        .and_then(|()| sqlite_create(&db, create));
                    match one {
                        Ok(Outcome::Conflict) | Err(_) => {
                            let _ = db.execute_batch("ROLLBACK TO c; RELEASE c");
                        }
                        Ok(_) => {
                            let _ = db.execute_batch("RELEASE c");
                        }
                    }
                    one.unwrap_or_else(|e| Outcome::Failed(e.to_string()))
                }
            };
            outcomes.push(outcome);
        }
        let committed = begun.and_then(|()| db.execute_batch("COMMIT"));
        if committed.is_err() {
            let _ = db.execute_batch("ROLLBACK");
        }
        for ((create, reply), outcome) in batch.into_iter().zip(outcomes) {
            let outcome = match &committed {
                Ok(()) => outcome,
                Err(e) => Outcome::Failed(format!("commit: {e}")),
            };
            let _ = reply.send(respond(&create, outcome));
        }
    }
}

/// One create in a transaction of its own on the shared connection.
fn sqlite_txn(db: &Mutex<rusqlite::Connection>, create: &Create) -> Outcome {
    let mut db = db.lock().unwrap_or_else(|p| p.into_inner());
    let tx = match db.transaction() {
        Ok(tx) => tx,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match sqlite_create(&tx, create) {
        Ok(Outcome::Conflict) => Outcome::Conflict, // rolled back on drop
        Ok(outcome) => match tx.commit() {
            Ok(()) => outcome,
            Err(e) => Outcome::Failed(format!("commit: {e}")),
        },
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

// ---- The durable floor ------------------------------------------------------------

/// The line the floor appends for a create: its fields as JSON.
#[derive(Serialize)]
struct FloorLine<'a> {
    id: &'a str,
    request_id: Option<&'a str>,
    text: Option<&'a str>,
    caption: Option<&'a str>,
    lang: Option<&'a str>,
    captured_at_ms: Option<i64>,
    created_at_ms: i64,
}

/// The floor's file, pre-allocated: `bytes` of zeros written and
/// `fsync`ed (and the directory too) before the peer listens, so that
/// each batch's `fdatasync` writes data over allocated blocks, as the
/// engine's pre-allocated segments are.
fn floor_open(path: &Path, bytes: u64) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; 8 << 20];
    let mut left = bytes;
    while left > 0 {
        // Cast: at most the buffer's length.
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(file)
}

/// Keys of the floor's maps: foldhash, as the engine hashes.
type FloorMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// The floor's writer: blocks for one create, takes every other one
/// queued now, decides each against the request ids and moment ids in
/// memory, appends the new ones' lines with one `pwrite` at the file's
/// end of data and one `fdatasync`, then answers all. An I/O error ends
/// the process before anything of that batch is answered. Past
/// `allocated` bytes the file grows (said once on stderr).
fn floor_writer(file: std::fs::File, allocated: u64, jobs: mpsc::Receiver<Job>) {
    let mut requests: FloorMap<Arc<Create>> = FloorMap::default();
    let mut ids: FloorMap<()> = FloorMap::default();
    let mut end: u64 = 0;
    let mut buf: Vec<u8> = Vec::new();
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while let Ok(more) = jobs.try_recv() {
            batch.push(more);
        }
        buf.clear();
        let mut outcomes = Vec::with_capacity(batch.len());
        for (c, _) in &batch {
            if let Some(stored) = c.request_id.as_ref().and_then(|r| requests.get(r)) {
                outcomes.push(Outcome::Known(Create::clone(stored)));
                continue;
            }
            if ids.contains_key(&c.id) {
                outcomes.push(Outcome::Conflict);
                continue;
            }
            let line = FloorLine {
                id: &c.id,
                request_id: c.request_id.as_deref(),
                text: c.text.as_deref(),
                caption: c.caption.as_deref(),
                lang: c.lang.as_deref(),
                captured_at_ms: c.captured_at_ms,
                created_at_ms: c.created_at_ms,
            };
            serde_json::to_writer(&mut buf, &line).expect("a line serializes");
            buf.push(b'\n');
            ids.insert(c.id.clone(), ());
            if let Some(r) = &c.request_id {
                requests.insert(r.clone(), Arc::new(c.clone()));
            }
            outcomes.push(Outcome::Created);
        }
        if !buf.is_empty() {
            let synced = file.write_all_at(&buf, end).and_then(|()| file.sync_data());
            if let Err(e) = synced {
                // Never acknowledge what is not synced: the batch dies
                // with the process, unanswered.
                eprintln!("floor: write or fdatasync failed: {e}");
                std::process::exit(1);
            }
            // Cast: usize is at most 64 bits.
            let after = end + buf.len() as u64;
            if end <= allocated && after > allocated {
                eprintln!("floor: past the {allocated} pre-allocated bytes; appending from here");
            }
            end = after;
        }
        for ((create, reply), outcome) in batch.into_iter().zip(outcomes) {
            let _ = reply.send(respond(&create, outcome));
        }
    }
}

// ---- PostgreSQL -------------------------------------------------------------------

const PG_SCHEMA: &str = "
    CREATE TABLE requests (request_id TEXT PRIMARY KEY, moment_id TEXT NOT NULL);
    CREATE TABLE moments (
        id TEXT PRIMARY KEY, text TEXT, caption TEXT, lang TEXT,
        captured_at_ms BIGINT, created_at_ms BIGINT NOT NULL, version INTEGER NOT NULL
    );";

/// Makes a database of its own (named after the data directory's
/// process) on the server at `pg`, with the tables, and a pool on it.
async fn pg_pool(pg: SocketAddr) -> Result<deadpool_postgres::Pool, String> {
    let name = format!("load_{}", std::process::id());
    let connect = |dbname: &str| {
        let mut config = tokio_postgres::Config::new();
        config
            .host(pg.ip().to_string())
            .port(pg.port())
            .user("postgres")
            .dbname(dbname);
        config
    };
    let (admin, connection) = connect("postgres")
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connecting to {pg}: {e}"))?;
    tokio::spawn(connection);
    // Two statements: CREATE DATABASE refuses to run in the implicit
    // transaction of a multi-statement batch.
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .map_err(|e| format!("{statement}: {}", pg_error(&e)))?;
    }
    drop(admin);
    let manager = deadpool_postgres::Manager::from_config(
        connect(&name),
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(PG_POOL)
        .build()
        .map_err(|e| e.to_string())?;
    let client = pool.get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!("SET synchronous_commit = on; {PG_SCHEMA}"))
        .await
        .map_err(|e| format!("schema: {}", pg_error(&e)))?;
    let on: String = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .map_err(|e| pg_error(&e))?
        .get(0);
    let fsync: String = client
        .query_one("SHOW fsync", &[])
        .await
        .map_err(|e| pg_error(&e))?
        .get(0);
    if on != "on" || fsync != "on" {
        return Err(format!(
            "the server runs with synchronous_commit={on}, fsync={fsync}: both must be on"
        ));
    }
    Ok(pool)
}

/// A tokio-postgres error with the server's message (its `Display` says
/// only "db error").
fn pg_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

async fn pg_create(pool: &deadpool_postgres::Pool, c: &Create) -> Result<Outcome, String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let tx = client.transaction().await.map_err(|e| pg_error(&e))?;
    if let Some(rid) = &c.request_id {
        let insert = tx
            .prepare_cached(
                "INSERT INTO requests (request_id, moment_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .await
            .map_err(|e| pg_error(&e))?;
        let fresh = tx
            .execute(&insert, &[rid, &c.id])
            .await
            .map_err(|e| pg_error(&e))?;
        if fresh == 0 {
            let select = tx
                .prepare_cached(
                    "SELECT m.id, m.text, m.caption, m.lang, m.captured_at_ms, m.created_at_ms
                     FROM requests r JOIN moments m ON m.id = r.moment_id WHERE r.request_id = $1",
                )
                .await
                .map_err(|e| pg_error(&e))?;
            let row = tx
                .query_one(&select, &[rid])
                .await
                .map_err(|e| pg_error(&e))?;
            tx.commit().await.map_err(|e| pg_error(&e))?;
            return Ok(Outcome::Known(Create {
                id: row.get(0),
                request_id: Some(rid.clone()),
                text: row.get(1),
                caption: row.get(2),
                lang: row.get(3),
                captured_at_ms: row.get(4),
                created_at_ms: row.get(5),
            }));
        }
    }
    let insert = tx
        .prepare_cached(
            "INSERT INTO moments (id, text, caption, lang, captured_at_ms, created_at_ms, version)
             VALUES ($1, $2, $3, $4, $5, $6, 1) ON CONFLICT DO NOTHING",
        )
        .await
        .map_err(|e| pg_error(&e))?;
    let inserted = tx
        .execute(
            &insert,
            &[
                &c.id,
                &c.text,
                &c.caption,
                &c.lang,
                &c.captured_at_ms,
                &c.created_at_ms,
            ],
        )
        .await
        .map_err(|e| pg_error(&e))?;
    if inserted == 0 {
        // Dropping the transaction rolls it back.
        return Ok(Outcome::Conflict);
    }
    tx.commit().await.map_err(|e| pg_error(&e))?;
    Ok(Outcome::Created)
}

// ---- The server -------------------------------------------------------------------

/// Where a peer keeps its creates.
#[derive(Clone)]
enum Store {
    Ceiling,
    /// The durable floor's writer thread, fed like `sqlite-group`'s.
    Floor(mpsc::Sender<Job>),
    SqliteGroup(mpsc::Sender<Job>),
    SqliteTxn(Arc<Mutex<rusqlite::Connection>>),
    Postgres(deadpool_postgres::Pool),
}

async fn handle(store: Store, body: Bytes) -> Result<warp::reply::Response, Infallible> {
    let create = match parse(&body) {
        Ok(create) => create,
        Err(detail) => return Ok(problem(StatusCode::BAD_REQUEST, "invalid_request", &detail)),
    };
    Ok(match store {
        Store::Ceiling => respond(&create, Outcome::Created),
        Store::SqliteGroup(jobs) | Store::Floor(jobs) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if jobs.send((create, tx)).is_err() {
                return Ok(problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the writer thread is gone",
                ));
            }
            rx.await.unwrap_or_else(|_| {
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the writer thread is gone",
                )
            })
        }
        Store::SqliteTxn(db) => {
            let answered = tokio::task::spawn_blocking(move || {
                let outcome = sqlite_txn(&db, &create);
                respond(&create, outcome)
            })
            .await;
            answered.unwrap_or_else(|e| {
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    &e.to_string(),
                )
            })
        }
        Store::Postgres(pool) => {
            let outcome = pg_create(&pool, &create)
                .await
                .unwrap_or_else(Outcome::Failed);
            respond(&create, outcome)
        }
    })
}

/// The arguments of `--peer`.
pub struct PeerArgs {
    pub name: String,
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub pg: Option<SocketAddr>,
    /// The floor's file size, in bytes (`--preallocate`).
    pub preallocate_bytes: u64,
}

impl PeerArgs {
    /// `Some` when the process was started as a peer (`--peer NAME ...`).
    pub fn from_args() -> Option<PeerArgs> {
        let args: Vec<String> = std::env::args().collect();
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1).cloned())
        };
        let name = value("--peer")?;
        Some(PeerArgs {
            name,
            listen: value("--listen")
                .unwrap_or_else(|| "127.0.0.1:0".into())
                .parse()
                .expect("--listen ADDR"),
            data: PathBuf::from(value("--data").expect("--data DIR")),
            pg: value("--pg").map(|a| a.parse().expect("--pg HOST:PORT")),
            preallocate_bytes: value("--preallocate")
                .map(|b| b.parse().expect("--preallocate BYTES"))
                .unwrap_or(64 << 20),
        })
    }
}

/// Runs a peer until killed. Panics (exit code 101, with the reason on
/// stderr) when its store cannot be opened.
pub fn run(args: PeerArgs) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        std::fs::create_dir_all(&args.data).expect("peer data dir");
        let store = match args.name.as_str() {
            "ceiling" => Store::Ceiling,
            "floor" => {
                let allocated = args.preallocate_bytes;
                let file = floor_open(&args.data.join("floor.log"), allocated)
                    .expect("the floor's file is pre-allocated");
                let (jobs, queue) = mpsc::channel();
                std::thread::Builder::new()
                    .name("floor-writer".into())
                    .spawn(move || floor_writer(file, allocated, queue))
                    .expect("writer thread");
                Store::Floor(jobs)
            }
            "sqlite-group" => {
                let db = sqlite_open(&args.data.join("peer.db")).expect("SQLite opens");
                let (jobs, queue) = mpsc::channel();
                std::thread::Builder::new()
                    .name("sqlite-writer".into())
                    .spawn(move || sqlite_writer(db, queue))
                    .expect("writer thread");
                Store::SqliteGroup(jobs)
            }
            "sqlite-txn" => {
                let db = sqlite_open(&args.data.join("peer.db")).expect("SQLite opens");
                Store::SqliteTxn(Arc::new(Mutex::new(db)))
            }
            "postgres" => {
                let pg = args.pg.expect("postgres peer needs --pg HOST:PORT");
                Store::Postgres(pg_pool(pg).await.unwrap_or_else(|e| panic!("{e}")))
            }
            other => panic!("unknown peer {other:?}"),
        };
        let routes = warp::post()
            .and(warp::path!("api" / "moments"))
            .and(warp::body::content_length_limit(BODY_LIMIT))
            .and(warp::body::bytes())
            .and_then(move |body: Bytes| handle(store.clone(), body));
        let service = hyper_util::service::TowerToHyperService::new(warp::service(routes));
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .expect("peer binds");
        let addr = listener.local_addr().expect("bound address");
        println!("peer {} listening on http://{addr}", args.name);
        use std::io::Write;
        std::io::stdout().flush().expect("stdout");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
