//! The four commands of `spark-client`: thin wrappers over the library
//! (`spark_client`), printing for people and exiting with a code scripts
//! can branch on.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use spark_client::{
    image, Capture, Client, DrainOptions, DrainReport, Entry, EntryState, MediaBytes,
    MessageAttempt, MessageRecord, MessageState, Outbox, PhotoBytes, ReqwestTransport,
    SystemClientClock,
};
use spark_core::ids::Id;

/// Exit code when work is left pending (the link or the server is in
/// trouble; drain again later).
const EXIT_PENDING: u8 = 2;
/// Exit code when an entry is parked or a message failed: the person
/// has to look (`spark-client outbox`).
const EXIT_NEEDS_ATTENTION: u8 = 3;

/// Where the outbox lives.
#[derive(Args, Debug)]
pub struct OutboxDir {
    /// The outbox directory (created when missing, except by `outbox`,
    /// which lists an existing one only).
    #[arg(long, env = "SPARK_OUTBOX", default_value = "./spark-outbox")]
    outbox: PathBuf,
}

/// How to reach the server.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The server's base URL.
    #[arg(long, env = "SPARK_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// A bearer token, when the server requires one.
    #[arg(long, env = "SPARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Time limit per request, in seconds.
    #[arg(long, default_value_t = 60)]
    request_timeout_secs: u64,
}

/// `capture PHOTO...`.
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// The photo (JPEG or PNG), stored as is as the original; more than one
    /// (up to 10) makes one moment of several photos, in the order given.
    #[arg(required = true, num_args = 1..)]
    photos: Vec<PathBuf>,
    /// What the sign says, as typed.
    #[arg(long)]
    text: Option<String>,
    /// A caption.
    #[arg(long)]
    caption: Option<String>,
    /// The language of the text (e.g. de).
    #[arg(long)]
    lang: Option<String>,
    #[command(flatten)]
    dir: OutboxDir,
    /// Send it right away: one pass over the outbox, no waiting.
    #[arg(long, env = "SPARK_SERVER")]
    server: Option<String>,
    /// A bearer token, when the server requires one.
    #[arg(long, env = "SPARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// `drain`.
#[derive(Args, Debug)]
pub struct DrainArgs {
    #[command(flatten)]
    dir: OutboxDir,
    #[command(flatten)]
    server: ServerArgs,
    /// Stop rather than wait past this many seconds (entries stay
    /// pending for the next drain).
    #[arg(long, default_value_t = 120)]
    give_up_after_secs: u64,
}

/// `send-message BODY`.
#[derive(Args, Debug)]
pub struct SendMessageArgs {
    /// The moment whose thread it goes to.
    #[arg(long)]
    thread: String,
    /// The text.
    body: String,
    #[command(flatten)]
    dir: OutboxDir,
    #[command(flatten)]
    server: ServerArgs,
}

/// `outbox`.
#[derive(Args, Debug)]
pub struct OutboxArgs {
    #[command(flatten)]
    dir: OutboxDir,
    /// Print JSON (entries and messages as stored) instead of lines.
    #[arg(long)]
    json: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn client(
    outbox: Outbox,
    server: &str,
    token: Option<String>,
    timeout: Duration,
    options: DrainOptions,
) -> anyhow::Result<Client> {
    let transport = ReqwestTransport::with_timeout(server, timeout)?.with_token(token);
    Ok(Client::new(outbox, Arc::new(transport), Arc::new(SystemClientClock)).with_options(options))
}

fn summarize(report: &DrainReport) -> ExitCode {
    eprintln!(
        "drain: {} steps sent (passes: {}); entries: {} finished, {} pending, {} parked; \
         messages: {} sent, {} failed, {} pending",
        report.steps_done,
        report.passes,
        report.entries_done.len(),
        report.pending_entries,
        report.parked_entries,
        report.messages_sent.len(),
        report.messages_failed.len(),
        report.pending_messages,
    );
    for (id, parked) in &report.parked {
        eprintln!("parked {id}: {parked}");
    }
    for (path, why) in &report.unreadable {
        eprintln!("unreadable {}: {why}", path.display());
    }
    if let Some(last) = report.waits.last() {
        if report.gave_up {
            eprintln!("gave up waiting; last trouble: {}", last.cause);
        }
    }
    if report.parked_entries > 0 || !report.messages_failed.is_empty() {
        ExitCode::from(EXIT_NEEDS_ATTENTION)
    } else if report.pending_entries > 0 || report.pending_messages > 0 {
        ExitCode::from(EXIT_PENDING)
    } else {
        ExitCode::SUCCESS
    }
}

/// `spark-client capture PHOTO...`: stores the capture (one moment, its
/// photos in the order given), prints its moment id, and with `--server`
/// makes one pass over the outbox.
pub fn capture(args: CaptureArgs) -> anyhow::Result<ExitCode> {
    let max = usize::from(spark_core::wire::PHOTOS_PER_MOMENT);
    if args.photos.len() > max {
        anyhow::bail!("{} photos: a moment holds at most {max}", args.photos.len());
    }
    let mut photos = Vec::with_capacity(args.photos.len());
    for path in &args.photos {
        let photo =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let copy = image::make_copy(&photo)
            .with_context(|| format!("{} is not a photo this client reads", path.display()))?;
        let original = MediaBytes {
            content_type: image::content_type_of(&photo),
            bytes: photo,
        };
        photos.push(PhotoBytes { copy, original });
    }
    let outbox = Outbox::open(&args.dir.outbox)?;
    let mut photos = photos.into_iter();
    let first = photos.next().context("no photo given")?;
    let entry = outbox.capture(
        &SystemClientClock,
        Capture {
            copy: first.copy,
            original: first.original,
            more_photos: photos.collect(),
            text: args.text,
            caption: args.caption,
            lang: args.lang,
            captured_at_ms: None,
        },
    )?;
    // The moment is safe now; its id is final.
    println!("{}", entry.moment_id);
    eprintln!(
        "captured: entry {} ({} photo(s); copies {} bytes, originals {} bytes) in {}",
        entry.id,
        1 + entry.more_photos.len(),
        entry.copy.size + entry.more_photos.iter().map(|p| p.copy.size).sum::<u64>(),
        entry.original.size
            + entry
                .more_photos
                .iter()
                .map(|p| p.original.size)
                .sum::<u64>(),
        args.dir.outbox.display()
    );
    let Some(server) = args.server else {
        return Ok(ExitCode::SUCCESS);
    };
    let options = DrainOptions {
        max_passes: Some(1),
        ..DrainOptions::default()
    };
    let client = client(
        outbox,
        &server,
        args.token,
        Duration::from_secs(60),
        options,
    )?;
    let report = runtime()?.block_on(client.drain())?;
    Ok(summarize(&report))
}

/// `spark-client drain`: sends everything pending, waiting out passing
/// trouble up to `--give-up-after-secs` and saying on stderr, at each wait,
/// why (with the server's reason) and for how long. Ctrl-C (SIGINT) or
/// SIGTERM stops it with the same summary and exit code as a normal end.
pub fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let outbox = Outbox::open(&args.dir.outbox)?;
    let options = DrainOptions {
        give_up_after: Some(Duration::from_secs(args.give_up_after_secs)),
        ..DrainOptions::default()
    };
    let client = client(
        outbox,
        &args.server.server,
        args.server.token,
        Duration::from_secs(args.server.request_timeout_secs),
        options,
    )?
    .on_wait(|wait| {
        eprintln!(
            "drain: waiting {:.1}s: {}",
            wait.delay.as_secs_f64(),
            wait.cause
        );
    });
    let report = runtime()?.block_on(async {
        // Installed before the first request: a signal from then on stops
        // the drain rather than killing the process.
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let stop = async {
            let which = futures_util::future::select(
                Box::pin(interrupt.recv()),
                Box::pin(terminate.recv()),
            )
            .await;
            let name = match which {
                futures_util::future::Either::Left(_) => "SIGINT",
                futures_util::future::Either::Right(_) => "SIGTERM",
            };
            eprintln!("drain: stopped by {name}");
        };
        anyhow::Ok(client.drain_until(stop).await?)
    })?;
    Ok(summarize(&report))
}

/// `spark-client send-message --thread ID BODY`: sends a message now (or
/// leaves it pending for the next drain) and prints its id.
pub fn send_message(args: SendMessageArgs) -> anyhow::Result<ExitCode> {
    let thread = Id::parse(&args.thread)
        .map_err(|e| anyhow::anyhow!("--thread {:?} is not a ULID: {e}", args.thread))?;
    let outbox = Outbox::open(&args.dir.outbox)?;
    let client = client(
        outbox,
        &args.server.server,
        args.server.token,
        Duration::from_secs(args.server.request_timeout_secs),
        DrainOptions::default(),
    )?;
    let outcome = runtime()?.block_on(client.send_message(thread, &args.body))?;
    let record = &outcome.record;
    println!("{}", record.id);
    match &outcome.result {
        MessageAttempt::Sent => {
            eprintln!("sent: {} at {}", record.id, record.ts);
            Ok(ExitCode::SUCCESS)
        }
        MessageAttempt::Failed => {
            let why = record
                .error
                .as_ref()
                .map_or_else(|| "refused".to_owned(), ToString::to_string);
            eprintln!("failed: {why}");
            Ok(ExitCode::from(EXIT_NEEDS_ATTENTION))
        }
        MessageAttempt::Wait(cause) => {
            eprintln!("pending ({cause}); `spark-client drain` sends it later");
            Ok(ExitCode::from(EXIT_PENDING))
        }
    }
}

/// `spark-client outbox`: the entries and messages as lines, or as JSON.
/// Listing never creates the outbox: a directory that does not exist (a
/// typo in `--outbox`) is an error naming it (exit 1).
pub fn outbox(args: OutboxArgs) -> anyhow::Result<ExitCode> {
    if !args.dir.outbox.is_dir() {
        anyhow::bail!(
            "no outbox at {}: the directory does not exist (check --outbox or SPARK_OUTBOX; \
             `capture` creates it)",
            args.dir.outbox.display()
        );
    }
    let outbox = Outbox::open(&args.dir.outbox)?;
    let scan = outbox.scan()?;
    let messages = outbox.messages()?;
    if args.json {
        let unreadable: Vec<_> = scan
            .unreadable
            .iter()
            .map(|(path, why)| serde_json::json!({"path": path, "error": why}))
            .collect();
        let all = serde_json::json!({
            "entries": scan.entries,
            "messages": messages,
            "unreadable": unreadable,
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("entries: {}", scan.entries.len());
    for entry in &scan.entries {
        println!("{}", entry_line(entry));
    }
    for (path, why) in &scan.unreadable {
        println!("unreadable {}: {why}", path.display());
    }
    println!("messages: {}", messages.len());
    for message in &messages {
        println!("{}", message_line(message));
    }
    Ok(ExitCode::SUCCESS)
}

/// One entry of the listing: id, moment, state, the steps sent, and the
/// parked reason or the last passing trouble.
fn entry_line(entry: &Entry) -> String {
    let sent: Vec<String> = entry.done.iter().map(|s| s.name()).collect();
    let mut line = format!(
        "{}  moment {}  {}  sent: {}",
        entry.id,
        entry.moment_id,
        entry.state(),
        if sent.is_empty() {
            "-".to_owned()
        } else {
            sent.join(",")
        }
    );
    if let (Some(parked), EntryState::Parked) = (&entry.parked, entry.state()) {
        line.push_str(&format!("  reason: {parked}"));
    } else if let (Some(error), EntryState::Pending(_)) = (&entry.last_error, entry.state()) {
        line.push_str(&format!("  last trouble: {error}"));
    }
    line
}

/// One message of the listing: order, id, thread, state, display time (and
/// whose clock it is), body, and the error of a failed one.
fn message_line(message: &MessageRecord) -> String {
    let mut line = format!(
        "#{}  {}  thread {}  {}  ts {}{}  {:?}",
        message.order,
        message.id,
        message.thread_id,
        message.state,
        message.ts,
        if message.ts_from_server {
            ""
        } else {
            " (device)"
        },
        message.body
    );
    if let (MessageState::Failed, Some(error)) = (message.state, &message.error) {
        line.push_str(&format!("  error: {error}"));
    }
    line
}
