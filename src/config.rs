//! Settings: every limit is a named setting with a default and its unit in
//! its name (SPEC section 8). Read from an optional TOML file (`--config`),
//! then environment variables, then flags; unknown keys are an error.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The settings file used when no `--config` (nor `SPARK_CONFIG`) is
/// given: `spark.toml` in the working directory. `token add` writes it by
/// default, and the server reads it when it exists, so a plain restart uses
/// the token just added (docs/operations.md).
pub const DEFAULT_CONFIG_FILE: &str = "spark.toml";

/// Resolves a listen address given as `IP:PORT` (`127.0.0.1:8080`,
/// `[::1]:8080`) or `HOST:PORT` (`localhost:8091`): a host name is resolved
/// once, at start, to its first address. The access rule of SPEC section 9
/// (no token: loopback only) holds for the address it resolves to, which
/// is the one the server binds.
///
/// Errors: the text in words, when it is neither form or resolves to no
/// address.
pub fn resolve_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs;
    let mut addrs = text.to_socket_addrs().map_err(|e| {
        format!(
            "{text:?} is neither IP:PORT nor HOST:PORT (e.g. 127.0.0.1:8080, localhost:8080): {e}"
        )
    })?;
    addrs
        .next()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// Everything the server can be told. `Settings::default()` is what
/// `cargo run --release` serves with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address to listen on. Default `127.0.0.1:8080`; port 0 picks a free
    /// port. Env `SPARK_LISTEN`, flag `--listen`.
    pub listen: SocketAddr,
    /// Data directory: the log lives in `<data_dir>/log/`. Default
    /// `./spark-data`. Env `SPARK_DATA`, flag `--data`.
    pub data_dir: PathBuf,
    /// Request limits.
    pub limits: Limits,
    /// The log and its group commit.
    pub log: LogSettings,
    /// The brains: seats, concurrency, timeouts.
    pub brains: BrainSettings,
    /// Who may call the API (SPEC section 9).
    pub access: AccessSettings,
    /// The media store.
    pub media: MediaSettings,
    /// Forgetting: when a deleted moment's content is erased (SPEC section
    /// 13).
    pub retention: RetentionSettings,
    /// The archive to S3-compatible object storage (SPEC section 11).
    /// Absent (the default): no archive, the engine runs as without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveSettings>,
    /// `spark-engine serve --take-over`: take the archive's prefix over
    /// from the engine that holds it (SPEC section 11, ARCHIVE.md "Epoch";
    /// see [`crate::archive::take_over`]). Only from the flag, never from
    /// the file or the environment: a standing take-over would have two
    /// engines take the prefix from each other at every restart. Needs
    /// `[archive]`.
    #[serde(skip)]
    pub take_over: bool,
    /// `[replica]`: how a replica follows an archive (SPEC section 11;
    /// [`crate::replica`]). Read only by `spark-engine replica`.
    pub replica: ReplicaSettings,
    /// `spark-engine replica --from URL`: the archive this engine follows as
    /// a read replica (`s3://BUCKET/PREFIX`); `None` for a writer. Only
    /// from the flag: whether an engine takes writes is decided by the
    /// command that starts it, never by a file. Excludes `[archive]`.
    #[serde(skip)]
    pub replica_from: Option<String>,
}

/// `[replica]`: a read replica that follows an archive
/// (`spark-engine replica --from URL`, SPEC section 11, docs/scale.md).
/// Every setting has a default; a writer ignores the section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaSettings {
    /// How often the replica asks the store for the next manifest while
    /// it is caught up, in milliseconds (one GET of a predicted key, never
    /// a LIST). Default 500; 10 to 60,000.
    pub poll_interval_ms: u64,
    /// The writer's address, e.g. `https://spark.example.com`, named in
    /// the `421 read_only` answer to a write (member `writer_url`). Empty
    /// (the default): the answer names none.
    pub writer_url: String,
    /// The store's endpoint for stores other than AWS, e.g.
    /// `http://127.0.0.1:8333`. Empty (the default): `AWS_ENDPOINT_URL_S3`
    /// or `AWS_ENDPOINT_URL` when set, else AWS. Credentials come
    /// from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` only.
    pub endpoint: String,
    /// The store's region. Default `us-east-1`.
    pub region: String,
    /// How long a read with `min_seq=N` (or `X-Spark-Min-Seq: N`) waits for
    /// the replica to reach seq N, in milliseconds, before it answers `503
    /// unavailable` with `Retry-After` (the request's own time limit,
    /// `limits.request_timeout_ms`, starts after this wait). Default 2,000;
    /// 0 to 60,000. A writer waits the same way (for a seq it has not
    /// committed yet).
    pub min_seq_wait_ms: u64,
    /// `/readyz` answers `503` once the replica's lag (`lag_ms` of
    /// `/api/log/head`) is above this many milliseconds. Default 10,000.
    pub ready_lag_max_ms: u64,
}

impl Default for ReplicaSettings {
    fn default() -> ReplicaSettings {
        ReplicaSettings {
            poll_interval_ms: 500,
            writer_url: String::new(),
            endpoint: String::new(),
            region: default_archive_region(),
            min_seq_wait_ms: 2_000,
            ready_lag_max_ms: 10_000,
        }
    }
}

/// The media store (DESIGN.md, "Media").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaSettings {
    /// At startup, blobs that no `media.put` names (a crash between a blob
    /// and its op) are removed once their contents are at least this old,
    /// in milliseconds; younger ones are kept until a later start
    /// (`spark-replay audit media` lists them). Default 3,600,000 (1 hour,
    /// the audit's default grace).
    pub orphan_grace_ms: u64,
}

impl Default for MediaSettings {
    fn default() -> MediaSettings {
        MediaSettings {
            orphan_grace_ms: 3_600_000,
        }
    }
}

/// Forgetting (SPEC section 13; DESIGN.md, "Forgetting"): a deleted
/// moment's content is erased from the log, the checkpoints and the media
/// store once `erase_after_ms` has passed since its delete was
/// acknowledged, by a background compactor that looks every
/// `check_interval_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Milliseconds from a delete's acknowledgement to the moment its
    /// content is due for erasure. Default 86,400,000 (a day); `0` erases at
    /// the next check. Env `SPARK_RETENTION_ERASE_AFTER_MS`.
    pub erase_after_ms: u64,
    /// Milliseconds between the compactor's checks for due content. Default
    /// 60,000 (a minute); must be above 0. Env
    /// `SPARK_RETENTION_CHECK_INTERVAL_MS`.
    pub check_interval_ms: u64,
    /// Most bytes per second a compaction writes (its rewritten segments,
    /// then the commit's copies of them), in 64 KiB steps each written
    /// back before the next ([`spark_log_format::WritePace`]): the
    /// compactor runs at low priority (SPEC section 13) and this keeps its
    /// writeback from queueing ahead of the log's syncs. Default
    /// 8,388,608 (8 MiB/s; docs/performance/erasure.md); `0` writes
    /// unpaced. Env `SPARK_RETENTION_COMPACTION_WRITE_BYTES_PER_S`.
    pub compaction_write_bytes_per_s: u64,
}

/// The default `[retention] compaction_write_bytes_per_s`: 8 MiB/s.
pub const COMPACTION_WRITE_BYTES_PER_S_DEFAULT: u64 = 8 << 20;

impl Default for RetentionSettings {
    fn default() -> RetentionSettings {
        RetentionSettings {
            erase_after_ms: spark_core::op::ERASE_AFTER_MS_DEFAULT,
            check_interval_ms: 60_000,
            compaction_write_bytes_per_s: COMPACTION_WRITE_BYTES_PER_S_DEFAULT,
        }
    }
}

pub use spark_archive::ArchiveUrl;

/// When a write is acknowledged with an archive (SPEC section 11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArchiveMode {
    /// A write is acknowledged after the local fdatasync, as without an
    /// archive, and shipped within `ship_interval_ms` (at most one chunk per
    /// interval). RPO: the writes acknowledged in about the last ship
    /// interval (plus any store outage) are lost with the machine.
    #[default]
    Async,
    /// A write is acknowledged only once a manifest naming a chunk or
    /// segment that holds its op is stored in the archive (the manifest put
    /// is the commit point, `archive/ARCHIVE.md` "Sync mode"); the
    /// shipper ships as soon as a write waits and no ship is in flight
    /// (group commit; `ship_interval_ms` does not pace it). RPO: zero
    /// acknowledged writes lost with the machine. The mirror (every read)
    /// shows an op at its local fdatasync, before it is acknowledged. While
    /// the store is unreachable writes wait (a request answers `503
    /// timeout` after `limits.request_timeout_ms`, and its write is still
    /// acknowledged to a retry once archived) and `/readyz` answers `503`,
    /// as it does once a write has waited more than 3 ship intervals (a
    /// store that hangs).
    Sync,
}

/// `[archive]`: where and how the log is shipped (SPEC section 11,
/// `archive/ARCHIVE.md`). Credentials come only from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSettings {
    /// `s3://BUCKET/PREFIX` (the prefix may be empty).
    pub url: String,
    /// The store's endpoint for stores other than AWS, e.g.
    /// `http://127.0.0.1:8333`; absent: `AWS_ENDPOINT_URL_S3` or
    /// `AWS_ENDPOINT_URL` when set ([`spark_archive::endpoint_from_env`]),
    /// else AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The region; default `us-east-1`.
    #[serde(default = "default_archive_region")]
    pub region: String,
    /// At most one tail chunk per this many ms. Default 1000.
    #[serde(default = "default_ship_interval_ms")]
    pub ship_interval_ms: u64,
    /// `async` (default) or `sync`.
    #[serde(default)]
    pub mode: ArchiveMode,
    /// The writer's lease on the prefix, in ms (`archive/ARCHIVE.md`
    /// "Lease"). `0` (the default): leases off, exactly as without the
    /// setting: a second engine on the prefix refuses to start unless told
    /// `--take-over`, and an idle writer makes no request. Above 0 (at
    /// least 3 x `ship_interval_ms`, at most 86400000 = a day): the writer
    /// stores a manifest at least every `lease_ms / 3` ms, idle or not (a
    /// renewal when nothing else needs one: one PUT of a few hundred bytes
    /// to a few KiB), and a second engine with leases on takes the prefix
    /// over by itself, as `--take-over` does, once the holder's last
    /// manifest is older than the longer of its lease and this one by the
    /// second engine's clock. Safety never rests on the clocks (fencing by
    /// create-only puts does): a wrong clock only makes a take-over come
    /// early (the old writer is fenced) or late. Env
    /// `SPARK_ARCHIVE_LEASE_MS`.
    #[serde(default)]
    pub lease_ms: u64,
    /// How long the archive keeps what a compaction superseded, in ms
    /// (`archive/ARCHIVE.md` "Retention", SPEC section 13): objects that
    /// hold erased content (superseded segments, chunks, checkpoints, the
    /// blobs of erased moments) and manifests are deleted by the writer
    /// once older than this, and `spark-replay restore --at` refuses a
    /// point before it. Default 604800000 (a week of point-in-time
    /// restore); must be above 0. Env `SPARK_ARCHIVE_RETENTION_MS`.
    #[serde(default = "default_archive_retention_ms")]
    pub retention_ms: u64,
}

/// The default `[archive] retention_ms`: a week.
pub const ARCHIVE_RETENTION_MS_DEFAULT: u64 = spark_archive::RETENTION_MS_DEFAULT;

fn default_archive_retention_ms() -> u64 {
    ARCHIVE_RETENTION_MS_DEFAULT
}

/// The largest `[archive] lease_ms`: a day.
pub const LEASE_MS_MAX: u64 = 86_400_000;

fn default_archive_region() -> String {
    "us-east-1".to_owned()
}

fn default_ship_interval_ms() -> u64 {
    1000
}

/// Access (SPEC section 9): bearer tokens, each naming a device, stored as
/// SHA-256 hashes. With no token, only a loopback listener may start, and
/// no request needs one; with any token, every route but `/healthz` and
/// `/readyz` needs a valid one (`401 unauthorized` otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSettings {
    /// How long a browser session made by `POST /api/session` lasts, in
    /// milliseconds (SPEC section 12); past it the cookie is `401` and the
    /// page asks for the token again. Default 12 hours; at least 1.
    pub session_ttl_ms: u64,
    /// The tokens (`spark-engine token add DEVICE` makes one). Left out
    /// of `config print` when empty, so that its output stays a file that
    /// `token add` can append `[[access.tokens]]` to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenEntry>,
    /// With no token: the host names (or addresses) besides loopback ones
    /// that a request may name in `Host` (e.g. the name a proxy in front
    /// is reached by); any other `Host` is `403 host_not_allowed`, which is
    /// what stops DNS rebinding (`api::host`). Each entry is a name or an
    /// address without scheme or port (the port of `Host` is not compared),
    /// case aside. Default empty; unused once a token exists. File only.
    pub allowed_hosts: Vec<String>,
}

impl Default for AccessSettings {
    fn default() -> AccessSettings {
        AccessSettings {
            session_ttl_ms: 12 * 60 * 60 * 1000,
            tokens: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// One bearer token: the device it names, and the SHA-256 of the token
/// (64 lower-case hex characters); the token itself is never stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The device the token names; recorded on every op it causes.
    pub device: String,
    /// SHA-256 of the token, hex.
    pub sha256: String,
}

/// The brains (SPEC section 4, DESIGN.md "Brains").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrainSettings {
    /// Named brain configurations, in order: a practical turn asks the first
    /// (unless the request names another); a high-quality job asks each,
    /// turn `i` with request id `<job id>:<i>`. Default: one seat `pippa`
    /// on the offline `local` adapter.
    pub seats: Vec<crate::brain::SeatConfig>,
    /// Most brain calls at once; more turns wait their turn. Default 4.
    pub concurrency_max: usize,
    /// Longest one brain call may take before the turn fails, in
    /// milliseconds. Default 60,000.
    pub timeout_ms: u64,
    /// Longest `GET /api/turns/{id}?wait=` holds a request, in seconds;
    /// larger values are clamped. Default 60.
    pub turn_wait_max_s: u64,
    /// Most kept phrases in one quick-recall session (most recent first).
    /// Default 20.
    pub recall_phrases_max: usize,
    /// Most bytes of photo copies one turn hands its brain, in bytes (a
    /// moment holds up to 10 photos, issue 27). The first photo's copy is
    /// always read, as before several photos; each later one only while
    /// the copies read so far and it stay within this, else it is left out
    /// (log line `a copy past brains.copies_max_bytes`), so that a turn
    /// holds at most this or one copy in memory. Default 8 MiB.
    pub copies_max_bytes: u64,
}

impl Default for BrainSettings {
    fn default() -> BrainSettings {
        BrainSettings {
            seats: crate::brain::SeatConfig::default_seats(),
            concurrency_max: 4,
            timeout_ms: crate::brain::DEFAULT_BRAIN_TIMEOUT_MS,
            turn_wait_max_s: 60,
            recall_phrases_max: 20,
            copies_max_bytes: 8 * 1024 * 1024,
        }
    }
}

/// Limits on what one request may carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest JSON request body, in bytes; larger is `413 too_large`
    /// before any parsing. Default 64 KiB (SPEC section 8).
    pub json_body_limit_bytes: u64,
    /// Largest media upload, in bytes; larger is `413 too_large` (by
    /// `Content-Length` before reading, or as soon as the stream passes it).
    /// Default 32 MiB (SPEC section 8).
    pub media_limit_bytes: u64,
    /// Longest message body, in characters; longer is `413 too_large`.
    /// Default 4,000 (SPEC section 8).
    pub message_body_limit_chars: usize,
    /// Page size of list routes when `limit` is not given. Default 100.
    pub list_limit_default: usize,
    /// Largest page size; larger `limit` values are clamped. Default 1,000.
    pub list_limit_max: usize,
    /// Most open client connections; the listener stops accepting while
    /// this many are open and resumes as they close (further clients wait
    /// in the kernel's backlog). Default 1,024.
    pub connections_max: usize,
    /// Most `/api/events` streams open at once; one more is answered `503
    /// unavailable` with `Retry-After`, so streams never hold every
    /// connection (the health routes and other requests keep theirs). Takes
    /// effect up to `connections_max - 1` ([`Limits::event_streams_cap`]).
    /// Default 256.
    pub event_streams_max: usize,
    /// Longest wait for a request's head (line and headers), in
    /// milliseconds, on a new connection and between requests on a
    /// kept-alive one; past it the connection is closed. Default 10,000.
    pub header_read_timeout_ms: u64,
    /// Longest time from a request's head to the head of its answer, in
    /// milliseconds, body upload included (so a 32 MiB original needs
    /// about 0.9 Mbit/s at the default). Past it the answer is `408
    /// request_timeout` if the body was still arriving, else `503 timeout`;
    /// a write already handed to the engine still commits, and a retry
    /// with the same identity gets it. Streams (`/api/events`) are timed
    /// to their head only. Must exceed `brains.turn_wait_max_s`. The
    /// timeout is answered at the limit or at most 10 ms after it
    /// (`crate::api::deadline`). Default 300,000 (5 minutes).
    pub request_timeout_ms: u64,
}

/// The log: segment roll and group commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// A segment is sealed and a new one started once it would grow past
    /// this many bytes. Default 64 MiB (SPEC section 8).
    pub segment_size_bytes: u64,
    /// Largest record, in bytes; a larger one in a file is damage. Default 4 MiB.
    pub max_record_bytes: u32,
    /// Zero fill ahead of the last batch of the active segment, in bytes:
    /// a batch that would end past the zero-filled part writes zeros up to
    /// the next multiple of this in the same write, so most fdatasyncs find
    /// the file's size and blocks unchanged (a growing file costs more per
    /// sync). 0 turns it off. Default 1 MiB (on).
    ///
    /// On since log format version 2: a batch written in place
    /// over zeros may persist any subset of its pages before its fdatasync
    /// returns, and the hole a power cut can leave lies after the last valid
    /// commit mark, so recovery cuts it as an unacknowledged tail instead of
    /// refusing the log (`log-format/FORMAT.md`). It cut the write+fdatasync
    /// of a batch by about a third here (docs/performance/).
    pub preallocate_bytes: u64,
    /// Most ops written with one write call and one fdatasync (the
    /// group-commit batch): a batch takes no more commands once it holds
    /// this many ops, and a command's ops are never split, so a batch ends
    /// at most one command's ops past it (a recall writes 3, a job 1 + one
    /// per seat). Default 1,024. A lone command is never held back.
    pub group_commit_max_ops: usize,
    /// Most commands waiting for the sequencer; more make callers wait.
    /// Default 8,192.
    pub queue_depth_commands: usize,
    /// Committed batches of change notices kept for `/api/events`
    /// subscribers; one that falls further behind is told where to resume
    /// and disconnected. Default 1,024.
    pub change_buffer_batches: usize,
    /// Free bytes the data directory's file system must keep: a write that
    /// would grow the log or the media store below this is refused with
    /// `507 insufficient_storage` and `Retry-After` before the disk is
    /// actually full (an upload counts its declared `Content-Length`);
    /// reads, `/api/events` and `/healthz` keep working, `/readyz` answers
    /// `507` and says why, and writes resume by themselves once space is
    /// back above it (SPEC section 10). 0 turns the reserve off;
    /// otherwise at least `log.preallocate_bytes` (one batch's zero fill
    /// may take that much at once). Default 256 MiB: room for a restart's
    /// recovery copies, the next segment's pre-allocation, and an operator
    /// to act.
    pub disk_reserve_bytes: u64,
    /// How long a measure of free space (`statvfs`) is trusted while it is
    /// above the reserve, in ms: between two measures the engine subtracts
    /// what it writes itself, so only another program's writes go unseen
    /// that long. Below the reserve every write measures again, so writes
    /// resume as soon as space is back. 1 to 60,000; default 100.
    pub disk_check_interval_ms: u64,
    /// A checkpoint of the mirror and the request index is written in the
    /// background once this many ops were committed after the newest one
    /// (`<data>/checkpoint/`; `log-format/CHECKPOINT.md`), and
    /// startup loads the newest valid one and replays only the ops after
    /// it. 0 turns checkpoints off (none written, none loaded). Default
    /// 1,000,000.
    pub checkpoint_interval_ops: u64,
    /// Checkpoint files kept (the newest ones); older ones are removed
    /// after each write. 1 to 100; default 2.
    pub checkpoints_kept: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("./spark-data"),
            limits: Limits::default(),
            log: LogSettings::default(),
            brains: BrainSettings::default(),
            access: AccessSettings::default(),
            media: MediaSettings::default(),
            retention: RetentionSettings::default(),
            archive: None,
            take_over: false,
            replica: ReplicaSettings::default(),
            replica_from: None,
        }
    }
}

impl Limits {
    /// The number of `/api/events` streams open at once that takes effect:
    /// `event_streams_max`, but at most `connections_max - 1`, so at least
    /// one connection is always left to other requests.
    pub fn event_streams_cap(&self) -> usize {
        self.event_streams_max
            .min(self.connections_max.saturating_sub(1))
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            json_body_limit_bytes: 64 * 1024,
            media_limit_bytes: 32 * 1024 * 1024,
            message_body_limit_chars: 4000,
            list_limit_default: 100,
            list_limit_max: 1000,
            connections_max: 1024,
            event_streams_max: 256,
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 300_000,
        }
    }
}

impl Default for LogSettings {
    fn default() -> LogSettings {
        LogSettings {
            segment_size_bytes: 64 * 1024 * 1024,
            max_record_bytes: spark_log_format::DEFAULT_MAX_RECORD_BYTES,
            preallocate_bytes: 1024 * 1024,
            group_commit_max_ops: 1024,
            queue_depth_commands: 8192,
            change_buffer_batches: 1024,
            disk_reserve_bytes: 256 * 1024 * 1024,
            disk_check_interval_ms: 100,
            checkpoint_interval_ops: 1_000_000,
            checkpoints_kept: 2,
        }
    }
}

/// A settings file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read.
    #[error("cannot read settings file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`Settings`] (an unknown key is named).
    #[error("settings file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, naming the key.
        message: String,
    },
    /// An environment override does not parse, or names no setting.
    #[error("environment variable {name}: {message}")]
    Env {
        /// The variable, e.g. `SPARK_LIMITS_CONNECTIONS_MAX`.
        name: String,
        /// Why.
        message: String,
    },
    /// A value is out of its bounds.
    #[error("setting {key}: {message}")]
    Invalid {
        /// The setting's dotted name.
        key: &'static str,
        /// Why.
        message: String,
    },
}

impl Settings {
    /// Reads a TOML settings file; missing keys take their defaults.
    /// Unknown keys are an error naming them; bounds are checked by
    /// [`Settings::validate`] once environment and flags are applied.
    pub fn from_file(path: &Path) -> Result<Settings, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_owned(),
            source,
        })?;
        let settings: Settings = toml::from_str(&text).map_err(|e| SettingsError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(settings)
    }

    /// Applies environment overrides: every scalar setting can be set by
    /// `SPARK_<SECTION>_<KEY>` in upper case (`SPARK_LIMITS_JSON_BODY_LIMIT_BYTES`,
    /// `SPARK_LOG_SEGMENT_SIZE_BYTES`, `SPARK_LISTEN`, `SPARK_DATA_DIR`, ...),
    /// parsed as the setting's type. Lists (seats, tokens) come from the file
    /// only. Errors name the variable.
    pub fn apply_env(
        &mut self,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<(), SettingsError> {
        let vars: std::collections::HashMap<String, String> = vars.collect();
        self.archive_from_env(&vars)?;
        let mut tree = toml::Value::try_from(&*self).map_err(|e| SettingsError::Invalid {
            key: "environment",
            message: e.to_string(),
        })?;
        // `endpoint` is left out of the tree when unset: give the walk a
        // place for `SPARK_ARCHIVE_ENDPOINT`.
        if let Some(archive) = tree.get_mut("archive").and_then(toml::Value::as_table_mut) {
            if vars.contains_key("SPARK_ARCHIVE_ENDPOINT") && !archive.contains_key("endpoint") {
                archive.insert("endpoint".into(), toml::Value::String(String::new()));
            }
        }
        fn walk(
            value: &mut toml::Value,
            prefix: &str,
            vars: &std::collections::HashMap<String, String>,
        ) -> Result<(), SettingsError> {
            let Some(table) = value.as_table_mut() else {
                return Ok(());
            };
            for (key, leaf) in table.iter_mut() {
                let name = format!("{prefix}_{}", key.to_ascii_uppercase());
                if leaf.is_table() {
                    walk(leaf, &name, vars)?;
                    continue;
                }
                let Some(text) = vars.get(&name) else {
                    continue;
                };
                let bad = |what: &str| SettingsError::Env {
                    name: name.clone(),
                    message: format!("{text:?} is not {what}"),
                };
                *leaf = match leaf {
                    // Every number setting is unsigned; TOML's integers
                    // are i64.
                    toml::Value::Integer(_) => match text.parse::<u64>() {
                        Ok(n) => toml::Value::Integer(i64::try_from(n).map_err(|_| {
                            bad(&format!("a whole number of at most {}", i64::MAX))
                        })?),
                        Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                            return Err(bad(&format!("a whole number of at most {}", i64::MAX)))
                        }
                        Err(_) => return Err(bad("a whole number of 0 or more")),
                    },
                    toml::Value::Boolean(_) => {
                        toml::Value::Boolean(text.parse().map_err(|_| bad("true or false"))?)
                    }
                    toml::Value::String(_) => toml::Value::String(text.clone()),
                    _ => continue,
                };
            }
            Ok(())
        }
        // A variable in a settings section that names no setting is a typo:
        // refuse it, as an unknown key in the file is refused.
        let mut known = std::collections::HashSet::new();
        fn names(value: &toml::Value, prefix: &str, out: &mut std::collections::HashSet<String>) {
            if let Some(table) = value.as_table() {
                for (key, leaf) in table {
                    let name = format!("{prefix}_{}", key.to_ascii_uppercase());
                    names(leaf, &name, out);
                    out.insert(name);
                }
            }
        }
        names(&tree, "SPARK", &mut known);
        const SECTIONS: &[&str] = &[
            "SPARK_LIMITS_",
            "SPARK_LOG_",
            "SPARK_BRAINS_",
            "SPARK_ACCESS_",
            "SPARK_MEDIA_",
            "SPARK_RETENTION_",
            "SPARK_ARCHIVE_",
            "SPARK_REPLICA_",
        ];
        // Not settings: the log filter and `--log-format`'s variable.
        const OTHERS: &[&str] = &["SPARK_LOG_FORMAT"];
        let mut unknown: Vec<&String> = vars
            .keys()
            .filter(|name| SECTIONS.iter().any(|s| name.starts_with(s)))
            .filter(|name| !known.contains(name.as_str()) && !OTHERS.contains(&name.as_str()))
            .collect();
        unknown.sort();
        if let Some(name) = unknown.first() {
            return Err(SettingsError::Env {
                name: (*name).clone(),
                message: "no such setting (see `spark-engine config print`)".to_owned(),
            });
        }
        let untouched = tree.clone();
        walk(&mut tree, "SPARK", &vars)?;
        *self = tree.try_into().map_err(|e: toml::de::Error| {
            // Name the variable: the first whose value alone does not fit
            // its setting (a number too large for it, say).
            let mut set: Vec<&String> = vars.keys().filter(|n| known.contains(*n)).collect();
            set.sort();
            let culprit = set.into_iter().find(|name| {
                let mut one = untouched.clone();
                let only = std::iter::once(((*name).clone(), vars[*name].clone())).collect();
                walk(&mut one, "SPARK", &only).is_err() || one.try_into::<Settings>().is_err()
            });
            SettingsError::Env {
                name: culprit.cloned().unwrap_or_else(|| "SPARK_*".to_owned()),
                message: e.message().trim().to_owned(),
            }
        })?;
        Ok(())
    }

    /// `[archive]` from the environment, as every other section: with
    /// `SPARK_ARCHIVE_URL` set and no `[archive]` in the file, the section
    /// is made (its other keys take their defaults or their own
    /// variables). Another `SPARK_ARCHIVE_*` variable with no section and
    /// no `SPARK_ARCHIVE_URL` is refused, naming it: it would configure
    /// nothing (newcomer findings 9).
    fn archive_from_env(
        &mut self,
        vars: &std::collections::HashMap<String, String>,
    ) -> Result<(), SettingsError> {
        if self.archive.is_some() {
            return Ok(());
        }
        if let Some(url) = vars.get("SPARK_ARCHIVE_URL") {
            self.archive = Some(ArchiveSettings {
                url: url.clone(),
                endpoint: None,
                region: default_archive_region(),
                ship_interval_ms: default_ship_interval_ms(),
                mode: ArchiveMode::default(),
                lease_ms: 0,
                retention_ms: ARCHIVE_RETENTION_MS_DEFAULT,
            });
            return Ok(());
        }
        let mut stray: Vec<&String> = vars
            .keys()
            .filter(|name| name.starts_with("SPARK_ARCHIVE_"))
            .collect();
        stray.sort();
        match stray.first() {
            Some(name) => Err(SettingsError::Env {
                name: (*name).clone(),
                message: "no archive is configured (no [archive] section in the settings file \
                          and no SPARK_ARCHIVE_URL): set SPARK_ARCHIVE_URL or [archive] url, or \
                          unset it"
                    .to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// The settings as TOML, with every token hash replaced by `"<hidden>"`:
    /// what `spark-engine config print` shows.
    pub fn to_toml_redacted(&self) -> String {
        let mut shown = self.clone();
        for token in &mut shown.access.tokens {
            token.sha256 = "<hidden>".into();
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot print: {e}"))
    }

    /// `[replica]` and `--from` (SPEC section 11): bounds, the URL and the
    /// endpoint; a replica ships nothing, so `[archive]` and `--take-over`
    /// are refused with it.
    fn validate_replica(&self) -> Result<(), SettingsError> {
        let invalid = |key, message: String| Err(SettingsError::Invalid { key, message });
        let replica = &self.replica;
        if !(10..=60_000).contains(&replica.poll_interval_ms) {
            return invalid("replica.poll_interval_ms", "must be 10 to 60000".into());
        }
        if replica.min_seq_wait_ms > 60_000 {
            return invalid("replica.min_seq_wait_ms", "must be 0 to 60000".into());
        }
        if replica.ready_lag_max_ms == 0 {
            return invalid("replica.ready_lag_max_ms", "must be above 0".into());
        }
        if replica.region.is_empty() {
            return invalid("replica.region", "must not be empty".into());
        }
        if !replica.endpoint.is_empty() {
            if let Err(message) = spark_archive::check_endpoint(&replica.endpoint) {
                return invalid("replica.endpoint", message.to_string());
            }
        }
        let Some(from) = &self.replica_from else {
            return Ok(());
        };
        if let Err(message) = ArchiveUrl::parse(from) {
            return invalid("--from", message.to_string());
        }
        if self.archive.is_some() || self.take_over {
            return invalid(
                "--from",
                "a replica ships nothing and takes no prefix: start it without [archive] \
                 (and without --take-over)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks bounds that the types cannot express.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let invalid = |key, message: &str| {
            Err(SettingsError::Invalid {
                key,
                message: message.to_owned(),
            })
        };
        if self.limits.json_body_limit_bytes == 0 {
            return invalid("limits.json_body_limit_bytes", "must be above 0");
        }
        if self.retention.check_interval_ms == 0 {
            return invalid("retention.check_interval_ms", "must be above 0");
        }
        if self.limits.media_limit_bytes == 0 {
            return invalid("limits.media_limit_bytes", "must be above 0");
        }
        if self.limits.list_limit_max == 0 || self.limits.list_limit_default == 0 {
            return invalid("limits.list_limit_*", "must be above 0");
        }
        if self.limits.list_limit_default > self.limits.list_limit_max {
            return invalid(
                "limits.list_limit_default",
                "must not be above limits.list_limit_max",
            );
        }
        if self.limits.message_body_limit_chars == 0 {
            return invalid("limits.message_body_limit_chars", "must be above 0");
        }
        if self.limits.connections_max == 0 {
            return invalid("limits.connections_max", "must be above 0");
        }
        if self.limits.event_streams_max == 0 {
            return invalid("limits.event_streams_max", "must be above 0");
        }
        if self.limits.header_read_timeout_ms == 0 {
            return invalid("limits.header_read_timeout_ms", "must be above 0");
        }
        if self.limits.request_timeout_ms <= self.brains.turn_wait_max_s.saturating_mul(1000) {
            return invalid(
                "limits.request_timeout_ms",
                "must be above brains.turn_wait_max_s (a long poll must end before it)",
            );
        }
        if self.log.segment_size_bytes < 4096 {
            return invalid("log.segment_size_bytes", "must be at least 4096");
        }
        if !(1..=100).contains(&self.log.checkpoints_kept) {
            return invalid("log.checkpoints_kept", "must be 1 to 100");
        }
        if self.log.group_commit_max_ops == 0 {
            return invalid("log.group_commit_max_ops", "must be above 0");
        }
        if self.log.change_buffer_batches == 0 {
            return invalid("log.change_buffer_batches", "must be above 0");
        }
        if self.log.queue_depth_commands == 0 {
            return invalid("log.queue_depth_commands", "must be above 0");
        }
        for host in &self.access.allowed_hosts {
            let plain = host.trim_start_matches('[').trim_end_matches(']');
            let name_or_ip = !plain.is_empty()
                && (plain.parse::<std::net::IpAddr>().is_ok()
                    || plain
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
            if !name_or_ip {
                return Err(SettingsError::Invalid {
                    key: "access.allowed_hosts",
                    message: format!(
                        "{host:?} is not a host name or address (give it without scheme, \
                         port or path, e.g. \"spark.example.com\")"
                    ),
                });
            }
        }
        if self.take_over && self.archive.is_none() {
            return invalid(
                "--take-over",
                "takes an archive's prefix over, and no [archive] is configured",
            );
        }
        self.validate_replica()?;
        if let Some(archive) = &self.archive {
            if let Err(message) = ArchiveUrl::parse(&archive.url) {
                return invalid("archive.url", &message.to_string());
            }
            if let Some(endpoint) = &archive.endpoint {
                if let Err(message) = spark_archive::check_endpoint(endpoint) {
                    return invalid("archive.endpoint", &message.to_string());
                }
            }
            if archive.region.is_empty() {
                return invalid("archive.region", "must not be empty");
            }
            if !(10..=3_600_000).contains(&archive.ship_interval_ms) {
                return invalid("archive.ship_interval_ms", "must be 10 to 3600000");
            }
            if archive.lease_ms != 0
                && (archive.lease_ms < archive.ship_interval_ms.saturating_mul(3)
                    || archive.lease_ms > LEASE_MS_MAX)
            {
                return invalid(
                    "archive.lease_ms",
                    "must be 0 (leases off) or from 3 x archive.ship_interval_ms to 86400000",
                );
            }
            if archive.retention_ms == 0 {
                return invalid("archive.retention_ms", "must be above 0");
            }
        }
        if self.log.disk_reserve_bytes != 0
            && self.log.disk_reserve_bytes < self.log.preallocate_bytes
        {
            return invalid(
                "log.disk_reserve_bytes",
                "must be 0 (off) or at least log.preallocate_bytes",
            );
        }
        if !(1..=60_000).contains(&self.log.disk_check_interval_ms) {
            return invalid("log.disk_check_interval_ms", "must be 1 to 60000");
        }
        if self.brains.seats.is_empty() {
            return invalid("brains.seats", "at least one seat is needed");
        }
        let mut names = std::collections::HashSet::new();
        for seat in &self.brains.seats {
            if seat.name.is_empty() || seat.name.len() > 64 {
                return invalid("brains.seats.name", "a seat name is 1 to 64 bytes");
            }
            if !names.insert(&seat.name) {
                return invalid("brains.seats.name", "seat names must be unique");
            }
        }
        if self.brains.concurrency_max == 0 || self.brains.timeout_ms == 0 {
            return invalid("brains.concurrency_max / timeout_ms", "must be above 0");
        }
        if self.brains.recall_phrases_max == 0 {
            return invalid("brains.recall_phrases_max", "must be above 0");
        }
        if self.access.session_ttl_ms == 0 {
            return invalid("access.session_ttl_ms", "must be above 0");
        }
        for token in &self.access.tokens {
            let device_ok = !token.device.is_empty()
                && token.device.len() <= 64
                && token.device.bytes().all(|b| (0x21..=0x7E).contains(&b));
            if !device_ok {
                return invalid(
                    "access.tokens.device",
                    "a device is 1 to 64 printable ASCII characters without spaces",
                );
            }
            if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return invalid(
                    "access.tokens.sha256",
                    "must be 64 hex characters (a SHA-256)",
                );
            }
        }
        if u64::from(self.log.max_record_bytes) < self.limits.json_body_limit_bytes + 1024 {
            return invalid(
                "log.max_record_bytes",
                "must exceed limits.json_body_limit_bytes by at least 1 KiB",
            );
        }
        Ok(())
    }

    /// The log's configuration from these settings.
    pub fn log_config(&self) -> spark_log_format::LogConfig {
        spark_log_format::LogConfig {
            segment_size_bytes: self.log.segment_size_bytes,
            max_record_bytes: self.log.max_record_bytes,
            preallocate_bytes: self.log.preallocate_bytes,
            compaction_pace: spark_log_format::WritePace::per_second(
                self.retention.compaction_write_bytes_per_s,
            ),
            ..Default::default()
        }
    }

    /// The log directory inside the data directory.
    pub fn log_dir(&self) -> PathBuf {
        log_dir(&self.data_dir)
    }
}

pub use spark_core::layout::log_dir;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_settings_are_checked_and_exclude_an_archive() {
        let key = |settings: Settings| match settings.validate() {
            Err(SettingsError::Invalid { key, .. }) => key,
            other => panic!("accepted: {other:?}"),
        };
        let replica = |from: &str| Settings {
            replica_from: Some(from.to_owned()),
            ..Settings::default()
        };
        replica("s3://spark/shard-a").validate().unwrap();
        assert_eq!(key(replica("http://spark/shard-a")), "--from");
        let mut with_archive = replica("s3://spark/shard-a");
        with_archive.archive = Some(ArchiveSettings {
            url: "s3://spark/shard-a".into(),
            endpoint: None,
            region: "us-east-1".into(),
            ship_interval_ms: 1000,
            mode: ArchiveMode::Async,
            lease_ms: 0,
            retention_ms: ARCHIVE_RETENTION_MS_DEFAULT,
        });
        assert_eq!(key(with_archive), "--from");
        let mut fast = Settings::default();
        fast.replica.poll_interval_ms = 5;
        assert_eq!(key(fast), "replica.poll_interval_ms");
        let mut endpoint = Settings::default();
        endpoint.replica.endpoint = "127.0.0.1:8333".into();
        assert_eq!(key(endpoint), "replica.endpoint");
        let mut wait = Settings::default();
        wait.replica.min_seq_wait_ms = 60_001;
        assert_eq!(key(wait), "replica.min_seq_wait_ms");
        // A writer's settings are valid as before, whatever [replica] says,
        // and the section comes from the environment like any other.
        let mut env = Settings::default();
        env.apply_env(
            [(
                "SPARK_REPLICA_POLL_INTERVAL_MS".to_owned(),
                "250".to_owned(),
            )]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(env.replica.poll_interval_ms, 250);
        env.validate().unwrap();
    }

    /// The ```toml blocks of docs/configuration.md, then of
    /// docs/archive.md, in order.
    fn docs_toml_blocks() -> Vec<String> {
        let docs = [
            include_str!("../docs/configuration.md"),
            include_str!("../docs/archive.md"),
        ]
        .concat();
        docs.split("```toml")
            .skip(1)
            .filter_map(|rest| rest.split("```").next().map(str::to_owned))
            .collect()
    }

    #[test]
    fn the_documented_settings_file_parses_to_the_defaults() {
        let blocks = docs_toml_blocks();
        let parsed: Settings = toml::from_str(&blocks[0]).unwrap();
        assert_eq!(
            parsed,
            Settings::default(),
            "docs/configuration.md's defaults drifted from the code"
        );
        let seats: Settings = toml::from_str(&blocks[1]).unwrap();
        assert_eq!(seats.brains.seats.len(), 2);
        seats.validate().unwrap();
    }

    #[test]
    fn the_documented_archive_block_parses_to_the_archive_defaults() {
        let block = docs_toml_blocks()
            .into_iter()
            .find(|b| b.contains("[archive]"))
            .expect("docs/archive.md shows an [archive] block");
        let parsed: Settings = toml::from_str(&block).unwrap();
        parsed.validate().unwrap();
        let archive = parsed.archive.unwrap();
        assert_eq!(
            (
                archive.region.as_str(),
                archive.ship_interval_ms,
                archive.mode,
                archive.lease_ms
            ),
            ("us-east-1", 1000, ArchiveMode::Async, 0),
            "docs/archive.md's archive defaults drifted from the code"
        );
        assert_eq!(archive.retention_ms, ARCHIVE_RETENTION_MS_DEFAULT);
    }

    #[test]
    fn environment_overrides_every_scalar_setting() {
        let mut s = Settings::default();
        let vars = [
            ("SPARK_LIMITS_JSON_BODY_LIMIT_BYTES", "1234"),
            ("SPARK_LOG_SEGMENT_SIZE_BYTES", "8192"),
            ("SPARK_LISTEN", "127.0.0.1:9999"),
            ("SPARK_BRAINS_TIMEOUT_MS", "500"),
            ("UNRELATED", "x"),
        ];
        s.apply_env(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap();
        assert_eq!(s.limits.json_body_limit_bytes, 1234);
        assert_eq!(s.log.segment_size_bytes, 8192);
        assert_eq!(s.listen.port(), 9999);
        assert_eq!(s.brains.timeout_ms, 500);
        let bad = s.apply_env(std::iter::once((
            "SPARK_LOG_SEGMENT_SIZE_BYTES".into(),
            "big".into(),
        )));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("SPARK_LOG_SEGMENT_SIZE_BYTES"));
    }

    #[test]
    fn a_number_variable_out_of_range_is_refused_naming_the_variable() {
        let cases = [
            ("SPARK_RETENTION_CHECK_INTERVAL_MS", "-1", "of 0 or more"),
            (
                "SPARK_RETENTION_ERASE_AFTER_MS",
                "99999999999999999999",
                "at most 9223372036854775807",
            ),
            ("SPARK_LOG_MAX_RECORD_BYTES", "99999999999", "u32"),
        ];
        for (name, value, says) in cases {
            let mut s = Settings::default();
            let error = s
                .apply_env(std::iter::once((name.to_owned(), value.to_owned())))
                .unwrap_err()
                .to_string();
            assert!(error.contains(name) && error.contains(says), "{error}");
        }
    }

    #[test]
    fn the_disk_reserve_is_set_by_env_and_validated() {
        let mut s = Settings::default();
        assert_eq!(s.log.disk_reserve_bytes, 256 * 1024 * 1024);
        s.apply_env(
            [
                ("SPARK_LOG_DISK_RESERVE_BYTES", "4194304"),
                ("SPARK_LOG_DISK_CHECK_INTERVAL_MS", "250"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        assert_eq!(s.log.disk_reserve_bytes, 4 * 1024 * 1024);
        assert_eq!(s.log.disk_check_interval_ms, 250);
        assert!(s.validate().is_ok());
        s.log.disk_reserve_bytes = 0;
        assert!(s.validate().is_ok(), "0 turns the reserve off");
        s.log.disk_reserve_bytes = s.log.preallocate_bytes - 1;
        let refused = s.validate().unwrap_err().to_string();
        assert!(refused.contains("log.disk_reserve_bytes"), "{refused}");
        s.log.disk_reserve_bytes = s.log.preallocate_bytes;
        s.log.disk_check_interval_ms = 0;
        let refused = s.validate().unwrap_err().to_string();
        assert!(refused.contains("log.disk_check_interval_ms"), "{refused}");
    }

    #[test]
    fn checkpoint_settings_come_from_env_and_are_checked() {
        let mut s = Settings::default();
        assert_eq!(s.log.checkpoint_interval_ops, 1_000_000);
        s.apply_env(env(&[
            ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "5000"),
            ("SPARK_LOG_CHECKPOINTS_KEPT", "3"),
        ]))
        .unwrap();
        assert_eq!(s.log.checkpoint_interval_ops, 5000);
        assert_eq!(s.log.checkpoints_kept, 3);
        s.validate().unwrap();
        assert!(s
            .to_toml_redacted()
            .contains("checkpoint_interval_ops = 5000"));
        s.log.checkpoints_kept = 0;
        let refused = s.validate().unwrap_err().to_string();
        assert!(refused.contains("log.checkpoints_kept"), "{refused}");
    }

    #[test]
    fn printed_settings_hide_token_hashes() {
        let mut s = Settings::default();
        s.access.tokens.push(TokenEntry {
            device: "phone".into(),
            sha256: "ab".repeat(32),
        });
        let text = s.to_toml_redacted();
        assert!(
            text.contains("<hidden>") && !text.contains(&"ab".repeat(32)),
            "{text}"
        );
    }

    #[test]
    fn listen_takes_host_names_resolved_to_what_is_bound() {
        assert_eq!(
            resolve_listen("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse::<SocketAddr>().unwrap()
        );
        let local = resolve_listen("localhost:8091").unwrap();
        assert!(local.ip().is_loopback(), "{local}");
        assert_eq!(local.port(), 8091);
        let error = resolve_listen("localhost").unwrap_err();
        assert!(error.contains("HOST:PORT"), "{error}");
        assert!(resolve_listen("no-such-host.invalid:8080").is_err());
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let error = toml::from_str::<Settings>("[limits]\njson_body_limit = 5\n").unwrap_err();
        assert!(error.to_string().contains("json_body_limit"), "{error}");
    }

    #[test]
    fn take_over_needs_an_archive_and_never_comes_from_the_file() {
        let refused = Settings {
            take_over: true,
            ..Settings::default()
        };
        assert!(matches!(
            refused.validate(),
            Err(SettingsError::Invalid {
                key: "--take-over",
                ..
            })
        ));
        let parsed = toml::from_str::<Settings>("take_over = true\n");
        assert!(parsed.is_err(), "take_over is not a setting");
        let mut with_archive: Settings =
            toml::from_str("[archive]\nurl = \"s3://spark-bucket/shard-1\"\n").unwrap();
        with_archive.take_over = true;
        with_archive.validate().unwrap();
        assert!(!with_archive.to_toml_redacted().contains("take_over"));
    }

    #[test]
    fn archive_settings_parse_with_defaults_and_are_checked() {
        let parsed: Settings = toml::from_str(
            "[archive]\nurl = \"s3://spark-bucket/shard-1\"\nendpoint = \"http://127.0.0.1:8333\"\n",
        )
        .unwrap();
        let archive = parsed.archive.clone().unwrap();
        assert_eq!(archive.ship_interval_ms, 1000);
        assert_eq!(archive.region, "us-east-1");
        assert_eq!(archive.mode, ArchiveMode::Async);
        assert_eq!(archive.lease_ms, 0, "leases are off by default");
        parsed.validate().unwrap();
        assert!(!Settings::default().to_toml_redacted().contains("archive"));
        let refused = |archive: ArchiveSettings| {
            let settings = Settings {
                archive: Some(archive),
                ..Settings::default()
            };
            match settings.validate() {
                Err(SettingsError::Invalid { key, .. }) => key,
                other => panic!("accepted: {other:?}"),
            }
        };
        assert_eq!(
            refused(ArchiveSettings {
                url: "http://bucket/x".into(),
                ..archive.clone()
            }),
            "archive.url"
        );
        assert_eq!(
            refused(ArchiveSettings {
                url: "s3://Bad_Bucket".into(),
                ..archive.clone()
            }),
            "archive.url"
        );
        assert_eq!(
            refused(ArchiveSettings {
                ship_interval_ms: 0,
                ..archive.clone()
            }),
            "archive.ship_interval_ms"
        );
        // A lease: 0, or at least three ship intervals (a renewal every
        // lease_ms / 3 needs a tick in between), at most a day.
        for lease_ms in [1, 2999, LEASE_MS_MAX + 1] {
            assert_eq!(
                refused(ArchiveSettings {
                    ship_interval_ms: 1000,
                    lease_ms,
                    ..archive.clone()
                }),
                "archive.lease_ms",
                "{lease_ms}"
            );
        }
        for lease_ms in [0, 3000, 30_000, LEASE_MS_MAX] {
            Settings {
                archive: Some(ArchiveSettings {
                    ship_interval_ms: 1000,
                    lease_ms,
                    ..archive.clone()
                }),
                ..Settings::default()
            }
            .validate()
            .unwrap();
        }
        let leased: Settings = toml::from_str(
            "[archive]\nurl = \"s3://abc/p\"\nship_interval_ms = 200\nlease_ms = 600\n",
        )
        .unwrap();
        leased.validate().unwrap();
        assert_eq!(leased.archive.unwrap().lease_ms, 600);
        assert_eq!(
            refused(ArchiveSettings {
                retention_ms: 0,
                ..archive.clone()
            }),
            "archive.retention_ms"
        );
        let retained: Settings = toml::from_str("[archive]\nurl = \"s3://abc/p\"\n").unwrap();
        assert_eq!(
            retained.archive.unwrap().retention_ms,
            ARCHIVE_RETENTION_MS_DEFAULT,
            "a week by default"
        );
        assert_eq!(
            refused(ArchiveSettings {
                endpoint: Some("127.0.0.1:8333".into()),
                ..archive.clone()
            }),
            "archive.endpoint"
        );
        assert_eq!(
            refused(ArchiveSettings {
                endpoint: Some("http://:8333".into()),
                ..archive
            }),
            "archive.endpoint"
        );
        let sync: Settings =
            toml::from_str("[archive]\nurl = \"s3://abc/p\"\nmode = \"sync\"\n").unwrap();
        sync.validate().unwrap();
        assert_eq!(sync.archive.unwrap().mode, ArchiveMode::Sync);
        let unknown = toml::from_str::<Settings>("[archive]\nurl = \"s3://abc\"\nsecret = \"x\"\n");
        assert!(unknown.unwrap_err().to_string().contains("secret"));
    }

    fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn archive_variables_are_checked_like_the_others() {
        // A typo is refused by name.
        let mut s: Settings = toml::from_str("[archive]\nurl = \"s3://spark/a\"\n").unwrap();
        let error = s
            .apply_env(env(&[("SPARK_ARCHIVE_SHIP_INTERVAL", "500")]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("SPARK_ARCHIVE_SHIP_INTERVAL"), "{error}");
        assert!(error.contains("no such setting"), "{error}");
        // Every key, the unset endpoint included.
        s.apply_env(env(&[
            ("SPARK_ARCHIVE_URL", "s3://spark/b"),
            ("SPARK_ARCHIVE_ENDPOINT", "http://127.0.0.1:9000"),
            ("SPARK_ARCHIVE_REGION", "eu-west-1"),
            ("SPARK_ARCHIVE_SHIP_INTERVAL_MS", "500"),
            ("SPARK_ARCHIVE_MODE", "async"),
            ("SPARK_ARCHIVE_LEASE_MS", "1500"),
        ]))
        .unwrap();
        let archive = s.archive.clone().unwrap();
        assert_eq!(archive.url, "s3://spark/b");
        assert_eq!(archive.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(archive.region, "eu-west-1");
        assert_eq!(archive.ship_interval_ms, 500);
        assert_eq!(archive.lease_ms, 1500);
        s.validate().unwrap();
        // Checked like the file's: below 3 ship intervals is refused.
        s.apply_env(env(&[("SPARK_ARCHIVE_LEASE_MS", "1499")]))
            .unwrap();
        assert!(matches!(
            s.validate(),
            Err(SettingsError::Invalid {
                key: "archive.lease_ms",
                ..
            })
        ));
        let not_a_number = s.apply_env(env(&[("SPARK_ARCHIVE_LEASE_MS", "3s")]));
        assert!(not_a_number.is_err());
        s.apply_env(env(&[("SPARK_ARCHIVE_LEASE_MS", "0")]))
            .unwrap();
        let bad_mode = s.apply_env(env(&[("SPARK_ARCHIVE_MODE", "later")]));
        assert!(bad_mode.is_err());
    }

    #[test]
    fn archive_url_in_the_environment_makes_the_section() {
        let mut s = Settings::default();
        s.apply_env(env(&[
            ("SPARK_ARCHIVE_URL", "s3://spark/shard-env"),
            ("SPARK_ARCHIVE_ENDPOINT", "http://127.0.0.1:8333"),
        ]))
        .unwrap();
        let archive = s.archive.clone().expect("the section is made");
        assert_eq!(archive.url, "s3://spark/shard-env");
        assert_eq!(archive.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(archive.ship_interval_ms, 1000);
        s.validate().unwrap();
        // Without the URL, an archive variable configures nothing: refused.
        let mut plain = Settings::default();
        let error = plain
            .apply_env(env(&[("SPARK_ARCHIVE_MODE", "sync")]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("SPARK_ARCHIVE_MODE") && error.contains("no archive is configured"),
            "{error}"
        );
        assert_eq!(plain.archive, None);
    }
}
