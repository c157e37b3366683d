//! The Spark archive (SPEC section 11, `archive/ARCHIVE.md`), as
//! `spark-log-format` is the log: its objects' bytes and the store they
//! live in. Used by the engine's shipper and replicas and by
//! `spark-replay restore` / `verify` / `audit archive`.
//!
//! # Layout
//!
//! - [`layout`]: the objects (keys, the tail chunk frame, the manifest,
//!   epoch and missing-blob frames), the acknowledged-bytes walk and the
//!   history rule [`layout::extends`]; no I/O.
//! - [`verify`]: the checks of a sealed segment's or a tail chunk's bytes
//!   against its manifest entry and the chain before it, one place for
//!   take-over, restore and `audit archive`.
//! - [`catch_up`](mod@catch_up): bringing a local log directory up to a
//!   manifest (fetch what it lacks, check, write durably; refuse a local
//!   log that is not a prefix), the one catch-up of restore, take-over and
//!   replicas; [`catch_up()`] at the root.
//! - [`checkpoint`]: taking an archived checkpoint into a data directory.
//! - This module: an [`ArchiveStore`] is a bucket and a prefix behind
//!   `object_store`, with create-only puts that settle "already exists" by
//!   comparing bytes, checked reads of manifests and epochs, and discovery
//!   of the latest numbered object (a LIST that finds any gap, planned by
//!   a probe on long histories: ARCHIVE.md "Gaps").

#![warn(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use spark_log_format::format::chain_hex;

use crate::layout::{epoch_key, extends, manifest_key, EpochDoc, Manifest, ObjectError};

pub use catch_up::{catch_up, CatchUpError, CaughtUp, Divergence, Keep, Options};
pub use object_store;

pub mod catch_up;
pub mod checkpoint;
pub mod layout;
pub mod verify;

/// Why a store operation failed, by kind (the `kind` label of
/// `spark_archive_failures_total`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or answered with an error.
    #[error("store unreachable or failing at {key}: {message}")]
    Unreachable {
        /// The object key.
        key: String,
        /// What the client said.
        message: String,
    },
    /// A create-only put found other bytes under the key.
    #[error("conflict at {key}: another object with other bytes is stored there")]
    Conflict {
        /// The object key.
        key: String,
    },
    /// An object failed its check when read.
    #[error("object {key} is damaged: {source}")]
    Damaged {
        /// The object key.
        key: String,
        /// What the check found.
        #[source]
        source: ObjectError,
    },
    /// An object a manifest names is missing.
    #[error("object {key} is missing")]
    Missing {
        /// The object key.
        key: String,
    },
    /// A numbered object (a manifest, an epoch) is missing while a later
    /// one exists or names it: numbers are created one after another, so
    /// this is damage (ARCHIVE.md "Gaps"), never an older state to read.
    #[error(
        "object {key} is missing, yet {later}: a gap in the archive's numbered objects \
         (deleted, or lost by the store); the archive is damaged there and is not read past it. \
         Put the object back (a bucket with versioning keeps it) or ship to a new prefix"
    )]
    Gap {
        /// The first missing key.
        key: String,
        /// What shows it is missing: a later key that exists, or the
        /// manifest that names its epoch.
        later: String,
    },
}

impl StoreError {
    /// The failure kind as a metric label: `unreachable`, `conflict`,
    /// `damaged`, `missing` (a gap too).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unreachable { .. } => "unreachable",
            StoreError::Conflict { .. } => "conflict",
            StoreError::Damaged { .. } => "damaged",
            StoreError::Missing { .. } | StoreError::Gap { .. } => "missing",
        }
    }
}

/// Why a store's settings were refused before any request: the URL, the
/// endpoint, the credentials, or the client's own check (SPEC section 11).
/// Each names what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The archive URL does not start with `s3://`.
    #[error("{url:?} does not start with s3://")]
    Scheme {
        /// The URL.
        url: String,
    },
    /// The bucket is not 3 to 63 of `a-z`, `0-9`, `-` or `.`.
    #[error("bucket {bucket:?} is not 3 to 63 lower-case letters, digits, '-' or '.'")]
    Bucket {
        /// The bucket.
        bucket: String,
    },
    /// The prefix has an empty path part (`a//b`, a leading `/`).
    #[error("prefix {prefix:?} has an empty path part")]
    Prefix {
        /// The prefix.
        prefix: String,
    },
    /// The endpoint's scheme is not `http://` or `https://`.
    #[error("must start with http:// or https://")]
    EndpointScheme,
    /// The endpoint's IPv6 host has no closing `]`.
    #[error("an IPv6 host needs its closing ]")]
    Ipv6Host,
    /// The endpoint names no host (or has user info).
    #[error("must name a host after the scheme (e.g. http://127.0.0.1:8333)")]
    Host,
    /// The endpoint's port is not 1 to 65535.
    #[error("port {port:?} is not 1 to 65535")]
    Port {
        /// The port as written.
        port: String,
    },
    /// The endpoint of a store config, refused by [`check_endpoint`].
    #[error("endpoint {endpoint:?}: {source}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why it is refused.
        source: Box<ConfigError>,
    },
    /// The key id or the secret is unset or empty.
    #[error(
        "no credentials: {} not set; set AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary \
         credentials) in the environment (the archive reads no other source)",
        .unset.join(" and ")
    )]
    Credentials {
        /// The variables unset or empty.
        unset: Vec<&'static str>,
    },
    /// The S3 client refused the settings.
    #[error("{source}")]
    Client {
        /// What the client said.
        source: object_store::Error,
    },
}

/// What a create-only put found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The object was created.
    Created,
    /// The same bytes were already stored under the key (an earlier try
    /// landed).
    AlreadyThere,
}

/// `s3://BUCKET/PREFIX` taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveUrl {
    /// The bucket.
    pub bucket: String,
    /// The key prefix, without leading or trailing `/` (may be empty).
    pub prefix: String,
}

impl ArchiveUrl {
    /// Parses `s3://BUCKET[/PREFIX]`; the error says what is wrong.
    pub fn parse(url: &str) -> Result<ArchiveUrl, ConfigError> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| ConfigError::Scheme {
                url: url.to_owned(),
            })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(ConfigError::Bucket {
                bucket: bucket.to_owned(),
            });
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() && prefix.split('/').any(str::is_empty) {
            return Err(ConfigError::Prefix {
                prefix: prefix.to_owned(),
            });
        }
        Ok(ArchiveUrl {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

/// Where the archive is: the URL, the endpoint for stores other than AWS,
/// and the region. Credentials come from `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` only.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `s3://BUCKET/PREFIX`.
    pub url: String,
    /// e.g. `http://127.0.0.1:8333`; `None`: AWS.
    pub endpoint: Option<String>,
    /// e.g. `us-east-1`.
    pub region: String,
}

/// The default `[archive] retention_ms` (SPEC section 13, ARCHIVE.md
/// "Retention"): a week of point-in-time restore, in milliseconds. The one
/// value the engine's setting and `spark-replay audit erasure` share.
pub const RETENTION_MS_DEFAULT: u64 = 604_800_000;

/// Numbers per LIST request when [`ArchiveStore::latest`] checks a
/// family for gaps (one S3 LIST page holds 1000 keys).
pub const LIST_RANGE: u64 = 1000;
/// LIST requests in flight at once while a family is checked for gaps.
pub const LISTS_AT_ONCE: usize = 8;

/// The endpoint the environment names for S3, the AWS CLI's and SDKs'
/// convention: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`, each only
/// when set and not empty (`var` reads a variable). `None`: AWS. What
/// [`ArchiveStore::connect`] uses when its settings name no endpoint.
pub fn endpoint_from_env(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
        .into_iter()
        .find_map(|name| var(name).filter(|v| !v.is_empty()))
}

/// Checks a store endpoint: `http://` or `https://`, then a host, an
/// optional `:PORT` and an optional path (`http://127.0.0.1:8333`,
/// `https://s3.example.com`). The one rule for the engine's
/// `archive.endpoint` and the tools' `--endpoint`; the error says what is
/// wrong (the S3 client would panic on some of these).
pub fn check_endpoint(endpoint: &str) -> Result<(), ConfigError> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or(ConfigError::EndpointScheme)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or(ConfigError::Ipv6Host)?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    if !host_ok || authority.contains('@') {
        return Err(ConfigError::Host);
    }
    if let Some(port) = port {
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(ConfigError::Port {
                port: port.to_owned(),
            });
        }
    }
    Ok(())
}

/// The store's credentials: only from `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and (for temporary credentials)
/// `AWS_SESSION_TOKEN`, never from a file or the EC2 instance
/// metadata service.
#[derive(Clone)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`, when set.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The credentials from the variables `var` gives (`std::env::var` in
    /// use). Errors when the key id or the secret is unset or empty, naming
    /// the variables.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Credentials, ConfigError> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let id = get("AWS_ACCESS_KEY_ID");
        let secret = get("AWS_SECRET_ACCESS_KEY");
        match (id, secret) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(Credentials {
                access_key_id,
                secret_access_key,
                session_token: get("AWS_SESSION_TOKEN"),
            }),
            (id, secret) => {
                let unset: Vec<&'static str> = [
                    (id.is_none(), "AWS_ACCESS_KEY_ID"),
                    (secret.is_none(), "AWS_SECRET_ACCESS_KEY"),
                ]
                .into_iter()
                .filter_map(|(unset, name)| unset.then_some(name))
                .collect();
                Err(ConfigError::Credentials { unset })
            }
        }
    }
}

/// The number of `location` when it is a numbered key of `key_of`'s
/// family (20 digits that `key_of` gives back), else `None`.
fn numbered(key_of: &impl Fn(u64) -> String, location: &str) -> Option<u64> {
    location
        .rsplit('/')
        .next()
        .and_then(|name| name.parse::<u64>().ok())
        .filter(|&n| key_of(n) == location)
}

/// Per request: give up after this long (the shipper retries with backoff).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Per connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A bucket and prefix: the archive's objects.
#[derive(Clone, Debug)]
pub struct ArchiveStore {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

impl ArchiveStore {
    /// An S3-compatible store from `config` and the `AWS_*` credentials in
    /// the environment, with create-only puts (`If-None-Match: *`). The
    /// client retries a failed request at most twice; the caller retries
    /// beyond that.
    ///
    /// Errors ([`ConfigError`], before any request): a bad URL, an endpoint
    /// [`check_endpoint`] refuses, or no credentials ([`Credentials::from_env`];
    /// the client never falls back to the EC2 instance metadata service).
    ///
    /// A `config` with no endpoint takes the one of the environment
    /// ([`endpoint_from_env`]), so an endpoint in the settings or on the
    /// command line wins over it.
    pub fn connect(config: &StoreConfig) -> Result<ArchiveStore, ConfigError> {
        let credentials = Credentials::from_env(|name| std::env::var(name).ok())?;
        let endpoint = config
            .endpoint
            .clone()
            .or_else(|| endpoint_from_env(|name| std::env::var(name).ok()));
        ArchiveStore::connect_with(
            &StoreConfig {
                endpoint,
                ..config.clone()
            },
            credentials,
        )
    }

    /// [`ArchiveStore::connect`] with the credentials given.
    pub fn connect_with(
        config: &StoreConfig,
        credentials: Credentials,
    ) -> Result<ArchiveStore, ConfigError> {
        let url = ArchiveUrl::parse(&config.url)?;
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&url.bucket)
            .with_region(&config.region)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(object_store::RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(10),
                ..Default::default()
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            .with_access_key_id(credentials.access_key_id)
            .with_secret_access_key(credentials.secret_access_key);
        if let Some(token) = credentials.session_token {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = &config.endpoint {
            check_endpoint(endpoint).map_err(|e| ConfigError::Endpoint {
                endpoint: endpoint.clone(),
                source: Box::new(e),
            })?;
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder
            .build()
            .map_err(|source| ConfigError::Client { source })?;
        Ok(ArchiveStore::new(Arc::new(store), url.prefix))
    }

    /// An archive over any store (tests use `object_store::memory::InMemory`).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: String) -> ArchiveStore {
        ArchiveStore { store, prefix }
    }

    /// The key prefix (no trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn unreachable(key: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Unreachable {
            key: key.to_owned(),
            message: e.to_string(),
        }
    }

    /// Puts `bytes` under `key` only if nothing is there. If something is,
    /// reads it: the same bytes are [`Put::AlreadyThere`], other bytes a
    /// [`StoreError::Conflict`].
    pub async fn put_create(&self, key: &str, bytes: Bytes) -> Result<Put, StoreError> {
        let path = StorePath::from(key);
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes.clone()), options)
            .await
        {
            Ok(_) => Ok(Put::Created),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get(key).await? {
                Some(stored) if stored == bytes => Ok(Put::AlreadyThere),
                Some(_) => Err(StoreError::Conflict {
                    key: key.to_owned(),
                }),
                None => Err(Self::unreachable(
                    key,
                    "the store said the object exists, then that it does not",
                )),
            },
            Err(e) => Err(Self::unreachable(key, e)),
        }
    }

    /// The bytes under `key`, `None` when there is no such object.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, StoreError> {
        let path = StorePath::from(key);
        match self.store.get(&path).await {
            Ok(result) => result
                .bytes()
                .await
                .map(Some)
                .map_err(|e| Self::unreachable(key, e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::unreachable(key, e)),
        }
    }

    /// The bytes under `key`; a missing object is [`StoreError::Missing`].
    pub async fn get_required(&self, key: &str) -> Result<Bytes, StoreError> {
        self.get(key).await?.ok_or_else(|| StoreError::Missing {
            key: key.to_owned(),
        })
    }

    /// Whether an object is stored under `key` (one HEAD request).
    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.store.head(&StorePath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Self::unreachable(key, e)),
        }
    }

    /// The highest `n >= 1` whose `key_of(n)` exists, 0 when none does,
    /// once every number `1..=n` was found to exist (ARCHIVE.md "Gaps"):
    /// numbers are created one after another, so a number missing below
    /// one that exists is damage (a deleted object, or one the store
    /// lost), a [`StoreError::Gap`] naming the first missing key.
    ///
    /// `key_of` must sort as its numbers do (the archive's keys: 20
    /// digits, zero-padded) and put every number under one directory.
    ///
    /// Cost: one LIST page when the family holds fewer than
    /// [`LIST_RANGE`] numbers (most archives; an epoch family always).
    /// Past that, a probe (`HEAD` of 2000, 4000, 8000, … then a binary
    /// search: about 2·log2(n) requests) plans one LIST page per
    /// [`LIST_RANGE`] numbers, [`LISTS_AT_ONCE`] at a time (a million
    /// manifests: 1000 pages), the last one reaching past what the probe
    /// found so that nothing after it can hide behind a gap.
    pub async fn latest(&self, key_of: impl Fn(u64) -> String) -> Result<u64, StoreError> {
        let key_of = &key_of;
        let first = self.list_run(key_of, 0, Some(LIST_RANGE)).await?;
        if first < LIST_RANGE {
            // The listing ended there: nothing after it.
            return Ok(first);
        }
        let probed = self.probe_from(key_of, first).await?;
        let bounded = probed / LIST_RANGE;
        let later = || format!("{} exists", key_of(probed));
        let ranges = (1..=bounded).map(|i| {
            let upto = (i < bounded).then_some((i + 1) * LIST_RANGE);
            (i * LIST_RANGE, upto)
        });
        let mut runs = std::pin::pin!(futures_util::stream::iter(ranges)
            .map(|(after, upto)| async move { (upto, self.list_run(key_of, after, upto).await) })
            .buffered(LISTS_AT_ONCE));
        let mut latest = first;
        while let Some((upto, run)) = runs.next().await {
            latest = run?;
            if latest < upto.unwrap_or(probed) {
                // The range stopped short of what the probe found.
                return Err(StoreError::Gap {
                    key: key_of(latest + 1),
                    later: later(),
                });
            }
        }
        Ok(latest)
    }

    /// Whether nothing is stored after number `number` of `key_of`'s
    /// family (one LIST page; the replica's check when `number + 1` was
    /// not found): `Ok(true)` when nothing is, `Ok(false)` when `number +
    /// 1` is there (created since), a [`StoreError::Gap`] when a later
    /// number is there but not `number + 1`.
    pub async fn nothing_after(
        &self,
        key_of: impl Fn(u64) -> String,
        number: u64,
    ) -> Result<bool, StoreError> {
        let run = self.list_run(&key_of, number, Some(number + 1)).await?;
        Ok(run == number)
    }

    /// Lists `key_of`'s family after number `after` (up to `upto`, when
    /// given): the listed numbers must be `after + 1, after + 2, …`; the
    /// first one skipped is a [`StoreError::Gap`]. Returns the last number
    /// of the run (`after` when none is listed). Keys of the family's
    /// directory that are not numbered keys of it are ignored.
    async fn list_run(
        &self,
        key_of: &impl Fn(u64) -> String,
        after: u64,
        upto: Option<u64>,
    ) -> Result<u64, StoreError> {
        let first = key_of(1);
        let dir = first.rsplit_once('/').map(|(dir, _)| StorePath::from(dir));
        let mut listed = self
            .store
            .list_with_offset(dir.as_ref(), &StorePath::from(key_of(after)));
        let mut last = after;
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| Self::unreachable(&first, e))?;
            let location = meta.location.as_ref();
            let Some(number) = location
                .rsplit('/')
                .next()
                .and_then(|name| name.parse::<u64>().ok())
                .filter(|&n| key_of(n) == location)
            else {
                continue;
            };
            if number != last + 1 {
                return Err(StoreError::Gap {
                    key: key_of(last + 1),
                    later: format!("{location} exists"),
                });
            }
            last = number;
            if upto == Some(number) {
                break;
            }
        }
        Ok(last)
    }

    /// The highest `n` a probe from `low` (which exists) finds: `HEAD` of
    /// `low + 1000`, then steps doubling (from 1000: 2000, 4000, 8000, …)
    /// until one is missing, then a binary search. The latest when no number is missing, else
    /// somewhere below a gap it stepped on (the LIST after it finds that).
    async fn probe_from(
        &self,
        key_of: &impl Fn(u64) -> String,
        mut low: u64,
    ) -> Result<u64, StoreError> {
        let mut step = LIST_RANGE;
        let mut high = low.saturating_add(step);
        while self.exists(&key_of(high)).await? {
            low = high;
            step = step.saturating_mul(2);
            high = low.saturating_add(step);
        }
        // low exists, high does not.
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if self.exists(&key_of(mid)).await? {
                low = mid;
            } else {
                high = mid;
            }
        }
        Ok(low)
    }

    /// The last run of `key_of`'s family: `(low, latest)`, every number
    /// `low..=latest` existing, `(1, 0)` when the family is empty. Unlike
    /// [`ArchiveStore::latest`] a hole is no error here: numbers below it
    /// are left out (`low` is the number after the last hole), and the
    /// caller decides whether the hole is damage (the manifest family: only
    /// at or above the latest manifest's `retained_from`, ARCHIVE.md
    /// "Gaps").
    ///
    /// Cost: as [`ArchiveStore::latest`], counted from the lowest number
    /// there (numbers a retention pass deleted cost nothing): one LIST
    /// page for fewer than [`LIST_RANGE`] numbers; past that the probe
    /// from the first page's last number plans one LIST page per
    /// [`LIST_RANGE`] numbers, [`LISTS_AT_ONCE`] at a time, the last one
    /// reaching past what the probe found.
    pub async fn latest_run(
        &self,
        key_of: impl Fn(u64) -> String,
    ) -> Result<(u64, u64), StoreError> {
        let key_of = &key_of;
        let (mut low, mut latest, listed) = self
            .list_run_lenient(key_of, 0, None, Some(LIST_RANGE))
            .await?;
        if listed < LIST_RANGE {
            // The listing ended there: nothing after it.
            return Ok((low, latest));
        }
        let base = latest;
        let probed = self.probe_from(key_of, latest).await?;
        let bounded = (probed - base) / LIST_RANGE;
        let ranges = (0..=bounded).map(|i| {
            let upto = (i < bounded).then_some(base + (i + 1) * LIST_RANGE);
            (base + i * LIST_RANGE, upto)
        });
        let mut runs = std::pin::pin!(futures_util::stream::iter(ranges)
            .map(|(after, upto)| async move {
                (
                    after,
                    self.list_run_lenient(key_of, after, upto, None).await,
                )
            })
            .buffered(LISTS_AT_ONCE));
        while let Some((after, run)) = runs.next().await {
            let (start, end, _) = run?;
            if end == after {
                continue;
            }
            if !(latest == after && start == after + 1) {
                low = start;
            }
            latest = end;
        }
        Ok((low, latest))
    }

    /// The numbers of `key_of`'s family below `below` that exist, lowest
    /// first, with each object's key and size: LIST pages from the lowest
    /// number up to `below` only (what the retention pass deletes).
    pub async fn numbered_below(
        &self,
        key_of: impl Fn(u64) -> String,
        below: u64,
    ) -> Result<Vec<(u64, String, u64)>, StoreError> {
        let first = key_of(1);
        let dir = first.rsplit_once('/').map(|(dir, _)| StorePath::from(dir));
        let mut listed = self
            .store
            .list_with_offset(dir.as_ref(), &StorePath::from(key_of(0)));
        let mut out = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| Self::unreachable(&first, e))?;
            let Some(number) = numbered(&key_of, meta.location.as_ref()) else {
                continue;
            };
            if number >= below {
                break;
            }
            out.push((number, meta.location.to_string(), meta.size));
        }
        Ok(out)
    }

    /// [`ArchiveStore::list_run`] that takes a hole as the start of a new
    /// run: returns the first and last number of the last run listed
    /// (`(after + 1, after)` when none is) and how many numbers it listed,
    /// stopping at `upto` or after `max_keys` numbers, when given.
    async fn list_run_lenient(
        &self,
        key_of: &impl Fn(u64) -> String,
        after: u64,
        upto: Option<u64>,
        max_keys: Option<u64>,
    ) -> Result<(u64, u64, u64), StoreError> {
        let first = key_of(1);
        let dir = first.rsplit_once('/').map(|(dir, _)| StorePath::from(dir));
        let mut listed = self
            .store
            .list_with_offset(dir.as_ref(), &StorePath::from(key_of(after)));
        let (mut start, mut last, mut count) = (after + 1, after, 0);
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| Self::unreachable(&first, e))?;
            let Some(number) = numbered(key_of, meta.location.as_ref()) else {
                continue;
            };
            if number != last + 1 {
                start = number;
            }
            last = number;
            count += 1;
            if upto.is_some_and(|upto| number >= upto) || max_keys == Some(count) {
                break;
            }
        }
        Ok((start, last, count))
    }

    /// The latest manifest, checked, or `None` for an empty archive: the
    /// manifest family has no gap from the latest manifest's
    /// `retained_from` to it ([`ArchiveStore::latest_run`]; numbers below
    /// that floor may have been deleted by retention, ARCHIVE.md "Gaps"),
    /// the latest and the one before it decode, the latest extends it
    /// ([`extends`], ARCHIVE.md "Manifest history"), and the epoch that
    /// wrote it is on record ([`ArchiveStore::latest_epoch`] decodes and
    /// is at least its epoch). The rule every reader and the writer start
    /// from; older manifests are read by `verify --from` only (a restore's
    /// result does not depend on them).
    pub async fn latest_manifest(&self) -> Result<Option<Manifest>, StoreError> {
        Ok(self.latest_manifest_and_low().await?.map(|(m, _)| m))
    }

    /// [`ArchiveStore::latest_manifest`] and the lowest manifest number
    /// still stored in the run that ends at it (at most its
    /// `retained_from`; below-floor manifests a retention pass has not
    /// deleted yet may be there).
    pub async fn latest_manifest_and_low(&self) -> Result<Option<(Manifest, u64)>, StoreError> {
        let (low, number) = self.latest_run(|n| manifest_key(&self.prefix, n)).await?;
        if number == 0 {
            return Ok(None);
        }
        let (latest, prev) = futures_util::future::try_join(self.manifest(number), async {
            if number > low {
                self.manifest(number - 1).await.map(Some)
            } else {
                Ok(None)
            }
        })
        .await?;
        if low > latest.retained_from {
            return Err(StoreError::Gap {
                key: manifest_key(&self.prefix, low - 1),
                later: format!(
                    "{} exists and manifest {number} retains the history from manifest {}",
                    manifest_key(&self.prefix, low),
                    latest.retained_from
                ),
            });
        }
        if let Some(prev) = prev {
            extends(&prev, &latest).map_err(|fork| StoreError::Damaged {
                key: manifest_key(&self.prefix, number),
                source: ObjectError::Mismatch(format!(
                    "it does not extend manifest {} ({}): {fork}; the archive's history forks there",
                    prev.number,
                    manifest_key(&self.prefix, prev.number)
                ),),
            })?;
        }
        let epochs = self.latest_epoch().await?.map_or(0, |doc| doc.epoch);
        if epochs < latest.epoch {
            return Err(StoreError::Gap {
                key: epoch_key(&self.prefix, epochs + 1),
                later: format!(
                    "manifest {number} ({}) was written by epoch {}",
                    manifest_key(&self.prefix, number),
                    latest.epoch
                ),
            });
        }
        Ok(Some((latest, low)))
    }

    /// Deletes the object under `key`; one that is not there is success
    /// (every deletion of the retention pass is idempotent, ARCHIVE.md
    /// "Retention").
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.store.delete(&StorePath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::unreachable(key, e)),
        }
    }

    /// Every object under `PREFIX/<family>/` (e.g. `segment`, `chunk`),
    /// with its size in bytes, in key order.
    pub async fn list_family(&self, family: &str) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(self
            .list_family_dated(family)
            .await?
            .into_iter()
            .map(|(key, bytes, _)| (key, bytes))
            .collect())
    }

    /// [`ArchiveStore::list_family`] with each object's last-modified
    /// time as the store tells it (Unix ms).
    pub async fn list_family_dated(
        &self,
        family: &str,
    ) -> Result<Vec<(String, u64, u64)>, StoreError> {
        let dir = if self.prefix.is_empty() {
            family.to_owned()
        } else {
            format!("{}/{family}", self.prefix)
        };
        let path = StorePath::from(dir.as_str());
        let mut listed = self.store.list(Some(&path));
        let mut out = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| Self::unreachable(&dir, e))?;
            let modified_ms = meta.last_modified.timestamp_millis().max(0) as u64;
            out.push((meta.location.to_string(), meta.size, modified_ms));
        }
        out.sort();
        Ok(out)
    }

    /// Manifest `number`, checked.
    pub async fn manifest(&self, number: u64) -> Result<Manifest, StoreError> {
        let key = manifest_key(&self.prefix, number);
        let bytes = self.get_required(&key).await?;
        Manifest::decode(&bytes, number).map_err(|source| StoreError::Damaged { key, source })
    }

    /// The latest epoch object, checked, or `None` when no writer took the
    /// prefix yet; the epoch family has no gap ([`ArchiveStore::latest`]).
    pub async fn latest_epoch(&self) -> Result<Option<EpochDoc>, StoreError> {
        let epoch = self.latest(|n| epoch_key(&self.prefix, n)).await?;
        if epoch == 0 {
            return Ok(None);
        }
        let key = epoch_key(&self.prefix, epoch);
        let bytes = self.get_required(&key).await?;
        EpochDoc::decode(&bytes, epoch)
            .map(Some)
            .map_err(|source| StoreError::Damaged { key, source })
    }

    /// Fetches an object a manifest names and checks its length (`bytes`)
    /// and BLAKE3 digest (`blake3`) against the entry.
    pub async fn get_listed(
        &self,
        key: &str,
        bytes: u64,
        blake3: &[u8; 32],
    ) -> Result<Bytes, StoreError> {
        let data = self.get_required(key).await?;
        let damaged = |message: String| StoreError::Damaged {
            key: key.to_owned(),
            source: ObjectError::Mismatch(message),
        };
        if data.len() as u64 != bytes {
            return Err(damaged(format!(
                "{} bytes, the manifest says {bytes}",
                data.len()
            )));
        }
        let hash = blake3::hash(&data);
        if hash.as_bytes() != blake3 {
            return Err(damaged(format!(
                "BLAKE3 {}, the manifest says {}",
                hash.to_hex(),
                chain_hex(blake3)
            )));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn put_create_settles_existing_objects_by_their_bytes() {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        let a = Bytes::from_static(b"a");
        assert_eq!(
            store.put_create("p/x", a.clone()).await.unwrap(),
            Put::Created
        );
        assert_eq!(store.put_create("p/x", a).await.unwrap(), Put::AlreadyThere);
        let err = store
            .put_create("p/x", Bytes::from_static(b"b"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "conflict");
    }

    #[test]
    fn the_environment_names_the_endpoint_by_the_aws_convention() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(endpoint_from_env(vars(&[])), None);
        assert_eq!(
            endpoint_from_env(vars(&[("AWS_ENDPOINT_URL", "http://a:1")])).as_deref(),
            Some("http://a:1")
        );
        assert_eq!(
            endpoint_from_env(vars(&[
                ("AWS_ENDPOINT_URL", "http://a:1"),
                ("AWS_ENDPOINT_URL_S3", "http://s3:2")
            ]))
            .as_deref(),
            Some("http://s3:2")
        );
        assert_eq!(
            endpoint_from_env(vars(&[
                ("AWS_ENDPOINT_URL_S3", ""),
                ("AWS_ENDPOINT_URL", "")
            ])),
            None
        );
    }

    #[test]
    fn endpoints_are_checked_before_the_client_sees_them() {
        for good in [
            "http://127.0.0.1:8333",
            "https://s3.example.com",
            "http://localhost:9000/",
            "http://[::1]:8333",
        ] {
            check_endpoint(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, says) in [
            ("127.0.0.1:8333", "http://"),
            ("ftp://host", "http://"),
            ("http://", "host"),
            ("http://:8333", "host"),
            ("http://host:port", "port"),
            ("http://host:0", "port"),
            ("http://user@host", "host"),
        ] {
            let error = check_endpoint(bad).unwrap_err();
            assert!(error.to_string().contains(says), "{bad}: {error}");
        }
        let config = StoreConfig {
            url: "s3://spark/p".into(),
            endpoint: Some("127.0.0.1:8333".into()),
            region: "us-east-1".into(),
        };
        let credentials = Credentials::from_env(|_| Some("x".into())).unwrap();
        let error = ArchiveStore::connect_with(&config, credentials).unwrap_err();
        assert!(error.to_string().contains("127.0.0.1:8333"), "{error}");
    }

    #[test]
    fn credentials_come_only_from_the_aws_variables() {
        let none = Credentials::from_env(|_| None).unwrap_err();
        assert!(
            none.to_string()
                .contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set"),
            "{none}"
        );
        let no_secret =
            Credentials::from_env(|name| (name == "AWS_ACCESS_KEY_ID").then(|| "id".to_owned()))
                .unwrap_err();
        assert!(no_secret
            .to_string()
            .starts_with("no credentials: AWS_SECRET_ACCESS_KEY not set"));
        let all = Credentials::from_env(|name| Some(format!("{name}-value"))).unwrap();
        assert_eq!(all.access_key_id, "AWS_ACCESS_KEY_ID-value");
        assert_eq!(
            all.session_token.as_deref(),
            Some("AWS_SESSION_TOKEN-value")
        );
        assert!(!format!("{all:?}").contains("SECRET"));
    }

    fn key(n: u64) -> String {
        manifest_key("p", n)
    }

    async fn put_numbers(store: &ArchiveStore, numbers: impl IntoIterator<Item = u64>) {
        for n in numbers {
            store
                .put_create(&key(n), Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn latest_finds_the_last_of_a_gapless_run() {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        assert_eq!(store.latest(key).await.unwrap(), 0);
        for n in 1..=37u64 {
            put_numbers(&store, [n]).await;
            assert_eq!(store.latest(key).await.unwrap(), n);
        }
        // Across LIST ranges, ending on a range's last number and after it.
        put_numbers(&store, 38..=2 * LIST_RANGE).await;
        assert_eq!(store.latest(key).await.unwrap(), 2 * LIST_RANGE);
        put_numbers(&store, [2 * LIST_RANGE + 1]).await;
        assert_eq!(store.latest(key).await.unwrap(), 2 * LIST_RANGE + 1);
        // Another family and stray keys in the directory are not numbers.
        store
            .put_create("p/manifest/notes.txt", Bytes::from_static(b"x"))
            .await
            .unwrap();
        store
            .put_create(&epoch_key("p", 5), Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(store.latest(key).await.unwrap(), 2 * LIST_RANGE + 1);
    }

    /// A missing number anywhere below the latest is a gap
    /// naming it, wherever the probe and the LIST ranges fall; before,
    /// the probe stopped at the gap and the archive rolled back silently.
    #[tokio::test]
    async fn a_missing_number_anywhere_is_a_gap_naming_it() {
        let last = 2 * LIST_RANGE + 100;
        for missing in [
            1,
            2,
            3,
            63,
            64,
            65,
            999,
            1000,
            1001,
            1024,
            2000,
            2001,
            last - 1,
        ] {
            let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
            put_numbers(&store, (1..=last).filter(|&n| n != missing)).await;
            let error = store.latest(key).await.unwrap_err();
            assert!(
                matches!(&error, StoreError::Gap { key: k, .. } if *k == key(missing)),
                "{missing}: {error}"
            );
            assert_eq!(error.kind(), "missing");
            assert!(error.to_string().contains(&key(missing)), "{error}");
        }
        // The latest gone leaves no gap: the one before it is the latest.
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        put_numbers(&store, 1..last).await;
        assert_eq!(store.latest(key).await.unwrap(), last - 1);
    }

    #[tokio::test]
    async fn nothing_after_tells_a_new_number_from_a_gap() {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        assert!(store.nothing_after(key, 0).await.unwrap());
        put_numbers(&store, 1..=3).await;
        assert!(store.nothing_after(key, 3).await.unwrap());
        assert!(!store.nothing_after(key, 2).await.unwrap());
        put_numbers(&store, [5]).await;
        let error = store.nothing_after(key, 3).await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Gap { key: k, later } if *k == key(4) && later.contains(&key(5))),
            "{error}"
        );
    }

    fn manifest(number: u64, epoch: u64) -> Manifest {
        Manifest {
            number,
            epoch,
            written_ms: 1,
            ..Manifest::empty()
        }
    }

    async fn put_manifest(store: &ArchiveStore, m: &Manifest) {
        store
            .put_create(&key(m.number), Bytes::from(m.encode()))
            .await
            .unwrap();
    }

    async fn put_epoch(store: &ArchiveStore, epoch: u64) {
        let doc = EpochDoc {
            epoch,
            writer: "w".into(),
            taken_ms: 1,
            lease_ms: 0,
        };
        store
            .put_create(&epoch_key("p", epoch), Bytes::from(doc.encode()))
            .await
            .unwrap();
    }

    /// The latest manifest is read with the one before it and
    /// must extend it, and the epoch that wrote it must be on record.
    #[tokio::test]
    async fn the_latest_manifest_extends_its_predecessor_and_its_epoch_exists() {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        assert_eq!(store.latest_manifest().await.unwrap(), None);
        put_manifest(&store, &manifest(1, 1)).await;
        // No epoch object: epoch 1 is missing.
        let error = store.latest_manifest().await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Gap { key: k, .. } if *k == epoch_key("p", 1)),
            "{error}"
        );
        put_epoch(&store, 1).await;
        put_manifest(&store, &manifest(2, 1)).await;
        assert_eq!(store.latest_manifest().await.unwrap().unwrap().number, 2);
        // A manifest of epoch 2 with no epoch/2.
        put_manifest(&store, &manifest(3, 2)).await;
        let error = store.latest_manifest().await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Gap { key: k, later } if *k == epoch_key("p", 2) && later.contains("manifest 3")),
            "{error}"
        );
        put_epoch(&store, 2).await;
        assert_eq!(store.latest_manifest().await.unwrap().unwrap().number, 3);
        // A well-formed manifest that does not extend the one before it.
        let mut forged = manifest(4, 2);
        forged.shipped_seq = 7;
        put_manifest(&store, &forged).await;
        let error = store.latest_manifest().await.unwrap_err();
        let text = error.to_string();
        assert_eq!(error.kind(), "damaged", "{text}");
        assert!(
            text.contains(&key(4)) && text.contains(&key(3)) && text.contains("does not extend"),
            "{text}"
        );
    }

    /// Numbers below the latest manifest's `retained_from` may be gone
    /// (deleted by retention, wholly or in part); a hole at or above it
    /// is still a gap naming the key. The run's paging starts at the
    /// lowest number there, on long histories too.
    #[tokio::test]
    async fn manifests_below_the_retention_floor_may_be_gone() {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        put_epoch(&store, 1).await;
        for n in 1..=9 {
            put_manifest(&store, &manifest(n, 1)).await;
        }
        let floor = Manifest {
            retained_from: 6,
            ..manifest(10, 1)
        };
        put_manifest(&store, &floor).await;
        let latest = |store: ArchiveStore| async move {
            store
                .latest_manifest_and_low()
                .await
                .map(|m| m.map(|(m, low)| (m.number, low)))
        };
        assert_eq!(latest(store.clone()).await.unwrap(), Some((10, 1)));
        // A deletion under way (ascending), and a stray one left below a hole.
        for n in [1, 2] {
            store.delete(&key(n)).await.unwrap();
        }
        store.delete(&key(1)).await.unwrap();
        assert_eq!(latest(store.clone()).await.unwrap(), Some((10, 3)));
        put_manifest(&store, &manifest(1, 1)).await;
        assert_eq!(latest(store.clone()).await.unwrap(), Some((10, 3)));
        for n in 1..=5 {
            store.delete(&key(n)).await.unwrap();
        }
        assert_eq!(latest(store.clone()).await.unwrap(), Some((10, 6)));
        // A hole at or above the floor is damage.
        store.delete(&key(7)).await.unwrap();
        let error = store.latest_manifest().await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Gap { key: k, .. } if *k == key(7)),
            "{error}"
        );
        put_manifest(&store, &manifest(7, 1)).await;
        store.delete(&key(6)).await.unwrap();
        let error = store.latest_manifest().await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Gap { key: k, .. } if *k == key(6)),
            "{error}"
        );

        // A long history whose first numbers are gone: paged from the
        // lowest one there, holes below it ignored.
        let long = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        put_numbers(&long, [3]).await;
        put_numbers(&long, 2500..=4100).await;
        assert_eq!(long.latest_run(key).await.unwrap(), (2500, 4100));
        long.delete(&key(3000)).await.unwrap();
        assert_eq!(long.latest_run(key).await.unwrap(), (3001, 4100));
        let empty = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        assert_eq!(empty.latest_run(key).await.unwrap(), (1, 0));
        // A long gapless history, and one that ends on a page's last number.
        let whole = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        put_numbers(&whole, 1..=2 * LIST_RANGE).await;
        assert_eq!(whole.latest_run(key).await.unwrap(), (1, 2 * LIST_RANGE));
        put_numbers(&whole, [2 * LIST_RANGE + 1]).await;
        assert_eq!(
            whole.latest_run(key).await.unwrap(),
            (1, 2 * LIST_RANGE + 1)
        );
        let page = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        put_numbers(&page, 1..=LIST_RANGE).await;
        assert_eq!(page.latest_run(key).await.unwrap(), (1, LIST_RANGE));
    }
}
