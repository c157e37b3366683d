//! `spark-replay`: verify, dump, rebuild, audit and count a Spark data
//! directory offline (SPEC section 7).
//!
//! Every subcommand but `generate` and `restore` is read-only, takes `--data DIR`
//! (default `./spark-data`) and works beside a running server: it takes no
//! lock and reads up to the last whole record. `generate` writes a
//! synthetic log into a new data directory, for measurements. Ops are decoded and folded with the
//! engine's own code ([`spark_core::replay::replay_record`]), never a copy.

mod archive;
mod archive_audit;
mod audit;
mod erasure;
mod generate;
mod media;
mod progress;
mod scan;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// The same allocator as the server (mimalloc; see `src/main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit codes, as `--help` lists them.
pub mod exit {
    /// Everything checked out.
    pub const OK: u8 = 0;
    /// The log (or a blob) is damaged, or an audit found a problem.
    pub const DAMAGE: u8 = 1;
    /// Bad usage (clap's own code).
    pub const USAGE: u8 = 2;
    /// The data directory could not be read, or an output file written.
    pub const UNREADABLE: u8 = 3;
}

const EXIT_CODES: &str = "Exit codes:
  0  clean (for verify and audits: nothing wrong found)
  1  damage found: the message names segment, offset and seq
  2  bad usage
  3  the data directory cannot be read (a stray .seg file in the log
     directory included: not damage, but no log is read until it is moved
     out; a segment of a newer format version than this build reads
     included), an output file cannot be written, or the archive's store
     (--from) cannot be reached";

/// Offline tools for a Spark data directory: verify, dump, rebuild, audit,
/// stats. Read-only; safe beside a running server.
#[derive(Parser, Debug)]
#[command(name = "spark-replay", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Options every subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The data directory (the log is in DIR/log).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "./spark-data",
        global = true
    )]
    pub data: PathBuf,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Check every record's checksum, gapless seqs, segment headers, seals,
    /// the hash chain, and that every op decodes and folds. Exit 1 with the
    /// exact segment, offset and seq of the first fault.
    #[command(after_help = EXIT_CODES)]
    Verify {
        #[command(flatten)]
        common: Common,
        /// Verify an archive instead (`s3://BUCKET/PREFIX`): the manifest
        /// history (each manifest extends the one before it, its epoch never
        /// older; a fork names both manifests), then every object the latest
        /// manifest names, its chain from the first op, and every blob; the
        /// first fault names the object.
        #[arg(long = "from", value_name = "URL")]
        from: Option<String>,
        /// The archive store's endpoint (with `--from`); without it (and
        /// without `SPARK_ARCHIVE_ENDPOINT`), `AWS_ENDPOINT_URL_S3` or
        /// `AWS_ENDPOINT_URL`.
        #[arg(long, value_name = "URL", env = "SPARK_ARCHIVE_ENDPOINT")]
        endpoint: Option<String>,
        /// The archive store's region (with `--from`).
        #[arg(long, default_value = "us-east-1", env = "SPARK_ARCHIVE_REGION")]
        region: String,
        /// Then tell whether a head recorded earlier (`audit chain`, `GET
        /// /api/log/head`: its seq, a colon, its chain value in 64 hex
        /// digits) is linked to the log: directly, or through the
        /// compaction record that replaced its chain value; not linked when
        /// a compaction rewrote the segment holding it (its content was
        /// erased) or nothing matches. Exit 1 unless linked; `--json`: the
        /// member `head`. Not with `--from`.
        #[arg(long, value_name = "SEQ:CHAIN", value_parser = scan::parse_head, conflicts_with = "from")]
        head: Option<scan::ExportedHead>,
    },
    /// Build a new data directory (`--data`, which must be empty or absent)
    /// from an archive: every record's checksum and the chain from the
    /// first op are verified, then every blob a kept op names (SHA-256).
    /// Objects are fetched several at once and written as they come; a
    /// failed restore removes what it wrote. Shows a progress bar on a
    /// terminal; `--json` prints the summary. The engine starts on the
    /// result.
    #[command(after_help = EXIT_CODES)]
    Restore {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        from: archive::From,
        /// Restore up to this point: a seq (a whole number; it must be the
        /// last seq of a batch) or a time (RFC 3339): the ops `rebuild --at`
        /// keeps (every op before the first one stamped after TIME), cut at
        /// the last commit mark before that op. The engine stamps a batch's
        /// ops with one time, so this is the last batch whose ops are all at
        /// or before TIME, the same point as `rebuild --at TIME` on the
        /// original (a batch with ops on both sides is left out, with a
        /// note). Exit 2 when the archive holds no op at or before it.
        #[arg(long, value_name = "SEQ|TIME")]
        at: Option<String>,
        /// Fold the whole log instead of starting from the newest archived
        /// checkpoint (every record is read and checked either way).
        #[arg(long)]
        no_checkpoint: bool,
    },
    /// Print ops as JSON lines: seq, ts_ms, kind, request_id, entity_id,
    /// device and the payload. Filters combine with AND.
    #[command(after_help = EXIT_CODES)]
    Dump {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        filter: scan::Filter,
    },
    /// Replay into a mirror with the engine's fold; print its counts and
    /// digest.
    #[command(after_help = EXIT_CODES)]
    Rebuild {
        #[command(flatten)]
        common: Common,
        /// Stop at this point: a seq (a whole number: ops after it are not
        /// applied) or a time (RFC 3339: every op before the first one
        /// stamped after it; the engine stamps a batch's ops with one
        /// time, so this is the last batch at or before the time).
        #[arg(long, value_name = "SEQ|TIME")]
        at: Option<String>,
        /// Write the rebuilt mirror as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        export: Option<PathBuf>,
        /// Start from the newest valid checkpoint in DIR/checkpoint (not
        /// past `--at`) and fold only the ops after it; an invalid one is
        /// named on stderr and skipped. The digest is the same as from the
        /// log alone.
        #[arg(long)]
        from_checkpoint: bool,
    },
    /// Ops per kind, segments, bytes and the time span.
    #[command(after_help = EXIT_CODES)]
    Stats {
        #[command(flatten)]
        common: Common,
    },
    /// Audits: one entity's history, one request's outcome, the chain head,
    /// duplicate content, damage, media, erasure, an archive.
    #[command(subcommand, after_help = EXIT_CODES)]
    Audit(audit::AuditCmd),
    /// Write a synthetic log of moment creates (about 200 bytes each) into a
    /// new data directory, for measuring replay and startup (docs/performance/startup.md). Refuses a directory that already holds a log. With
    /// `restore`, the only subcommands that write, each only into a new data
    /// directory.
    #[command(after_help = EXIT_CODES)]
    Generate {
        #[command(flatten)]
        common: Common,
        /// How many moment creates to write.
        #[arg(long, default_value_t = 10_000_000)]
        ops: u64,
        /// Then this many edits and deletes of those moments (a tenth of
        /// them deletes, at most half the moments): a history that
        /// outgrows the live state, for measuring checkpoints.
        #[arg(long, default_value_t = 0)]
        edits: u64,
    },
}

fn main() -> ExitCode {
    // Output piped into a reader that stops early (`verify | head`) ends
    // this process quietly, as it does any other command-line tool: Rust
    // ignores SIGPIPE by default, and a print to a closed pipe then panics.
    // SAFETY: called before any other thread exists; it only restores the
    // signal's default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Verify {
            common,
            from: None,
            head,
            ..
        } => scan::verify(&common, head.as_ref()),
        Cmd::Verify {
            common,
            from: Some(url),
            endpoint,
            region,
            ..
        } => archive::verify(
            &common,
            &archive::From {
                url,
                endpoint,
                region,
            },
        ),
        Cmd::Restore {
            common,
            from,
            at,
            no_checkpoint,
        } => archive::restore(&common, &from, at.as_deref(), !no_checkpoint),
        Cmd::Dump { common, filter } => scan::dump(&common, &filter),
        Cmd::Rebuild {
            common,
            at,
            export,
            from_checkpoint,
        } => scan::rebuild(&common, at.as_deref(), export.as_deref(), from_checkpoint),
        Cmd::Stats { common } => scan::stats(&common),
        Cmd::Audit(cmd) => audit::run(cmd),
        Cmd::Generate { common, ops, edits } => generate::run(&common, ops, edits),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("spark-replay: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// A run that could not finish: the message and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, naming the place.
    pub message: String,
    /// One of [`exit`].
    pub code: u8,
}

impl Failure {
    /// Damage in the log (exit 1).
    pub fn damage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: exit::DAMAGE,
        }
    }

    /// The directory cannot be read, or the arguments do not fit (exit 3).
    pub fn unreadable(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: exit::UNREADABLE,
        }
    }
}

/// What a subcommand returns: its exit code, or a failure (printed, with
/// its own exit code). Not the engine's `Outcome` of a command.
pub type ToolExit = Result<u8, Failure>;
