//! Settings: every limit is a named setting with a default and its unit in
//! its name (SPEC section 8). Read from an optional TOML file (`--config`),
//! then environment variables, then flags; unknown keys are an error.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
}

/// Access (SPEC section 9): bearer tokens, each naming a device, stored as
/// SHA-256 hashes. With no token, only a loopback listener may start, and
/// no request needs one; with any token, every route but `/healthz` and
/// `/readyz` needs a valid one (`401 unauthorized` otherwise).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSettings {
    /// The tokens (`spark-engine token add DEVICE` makes one). Left out
    /// of `config print` when empty, so that its output stays a file that
    /// `token add` can append `[[access.tokens]]` to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenEntry>,
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
}

impl Default for BrainSettings {
    fn default() -> BrainSettings {
        BrainSettings {
            seats: crate::brain::SeatConfig::default_seats(),
            concurrency_max: 4,
            timeout_ms: crate::brain::DEFAULT_BRAIN_TIMEOUT_MS,
            turn_wait_max_s: 60,
            recall_phrases_max: 20,
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
    /// to their head only. Must exceed `brains.turn_wait_max_s`.
    /// Default 300,000 (5 minutes).
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
    /// Zero fill ahead of the last record of the active segment, in bytes:
    /// a batch that would end past the zero-filled part writes zeros up to
    /// the next multiple of this in the same write, so most fdatasyncs find
    /// the file's size and blocks unchanged (a growing file costs more per
    /// sync). 0 turns it off. Default 0 (off).
    ///
    /// Off by default because it changes what a power cut can leave: a
    /// batch written in place over zeros may persist any subset of its
    /// pages before its fdatasync returns, so a cut can leave a zero hole
    /// with valid (never acknowledged) records after it, which recovery
    /// cannot tell from damage and refuses until repaired by hand. No
    /// acknowledged write is lost either way; availability after a power
    /// cut is. It raised 64-connection throughput by about 14% here
    /// (README "Performance").
    pub preallocate_bytes: u64,
    /// Most ops written with one write call and one fdatasync (the
    /// group-commit batch). Default 1,024. A lone op is never held back.
    pub group_commit_max_ops: usize,
    /// Most commands waiting for the sequencer; more make callers wait.
    /// Default 8,192.
    pub queue_depth_commands: usize,
    /// Committed batches of change notices kept for `/api/events`
    /// subscribers; one that falls further behind is told where to resume
    /// and disconnected. Default 1,024.
    pub change_buffer_batches: usize,
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
        }
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
            preallocate_bytes: 0,
            group_commit_max_ops: 1024,
            queue_depth_commands: 8192,
            change_buffer_batches: 1024,
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
        let mut tree = toml::Value::try_from(&*self).map_err(|e| SettingsError::Invalid {
            key: "environment",
            message: e.to_string(),
        })?;
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
                    toml::Value::Integer(_) => {
                        toml::Value::Integer(text.parse().map_err(|_| bad("a whole number"))?)
                    }
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
        walk(&mut tree, "SPARK", &vars)?;
        *self = tree
            .try_into()
            .map_err(|e: toml::de::Error| SettingsError::Env {
                name: "SPARK_*".to_owned(),
                message: e.to_string(),
            })?;
        Ok(())
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
        if self.log.group_commit_max_ops == 0 {
            return invalid("log.group_commit_max_ops", "must be above 0");
        }
        if self.log.change_buffer_batches == 0 {
            return invalid("log.change_buffer_batches", "must be above 0");
        }
        if self.log.queue_depth_commands == 0 {
            return invalid("log.queue_depth_commands", "must be above 0");
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
            ..Default::default()
        }
    }

    /// The log directory inside the data directory.
    pub fn log_dir(&self) -> PathBuf {
        log_dir(&self.data_dir)
    }
}

/// `<data_dir>/log`, where the segments live.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ```toml blocks of README.md, in order.
    fn readme_toml_blocks() -> Vec<String> {
        let readme = include_str!("../README.md");
        readme
            .split("```toml")
            .skip(1)
            .filter_map(|rest| rest.split("```").next().map(str::to_owned))
            .collect()
    }

    #[test]
    fn the_readme_settings_file_parses_to_the_defaults() {
        let blocks = readme_toml_blocks();
        let parsed: Settings = toml::from_str(&blocks[0]).unwrap();
        assert_eq!(
            parsed,
            Settings::default(),
            "README's defaults drifted from the code"
        );
        let seats: Settings = toml::from_str(&blocks[1]).unwrap();
        assert_eq!(seats.brains.seats.len(), 2);
        seats.validate().unwrap();
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
    fn unknown_keys_are_refused_by_name() {
        let error = toml::from_str::<Settings>("[limits]\njson_body_limit = 5\n").unwrap_err();
        assert!(error.to_string().contains("json_body_limit"), "{error}");
    }
}
