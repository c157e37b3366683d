//! `spark-engine`: the server binary. `spark-engine` alone (or
//! `spark-engine serve`) serves on 127.0.0.1:8080 with `./spark-data`.
//! `capture`, `drain`, `send-message` and `outbox` are the phone's outbox
//! as a command-line client (`spark_engine::client`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spark_engine::config::Settings;
use spark_engine::server;

/// mimalloc instead of the system allocator: startup replay allocates the
/// mirror's strings by the million, and glibc's malloc and free were 40% of
/// its profile (issue 7; README "Performance").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Spark engine: an event-sourced store on an append-only log, with an
/// HTTP API. Serves when no subcommand is given.
#[derive(Parser, Debug)]
#[command(name = "spark-engine", version, about, long_about = None)]
struct Cli {
    /// Log lines on stderr: `text` for people, `json` for machines.
    #[arg(long, global = true, env = "SPARK_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the HTTP API (the default).
    Serve(ServeArgs),
    /// Put a photo in the outbox (a small JPEG copy, at most 1024 px, and
    /// the original as is) and print its moment id; with a server, send it.
    Capture(client_cli::CaptureArgs),
    /// Send everything pending in the outbox, waiting out passing trouble.
    Drain(client_cli::DrainArgs),
    /// Send a message to a moment's thread (ADR-036 retry rules).
    SendMessage(client_cli::SendMessageArgs),
    /// List the outbox: entries, their state and parked reasons; messages.
    Outbox(client_cli::OutboxArgs),
    /// The effective configuration.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Access tokens (SPEC section 9).
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// Print the effective configuration (defaults, then the file, then the
    /// environment, then flags) as TOML, token hashes hidden.
    Print(ServeArgs),
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Make a new random token for DEVICE, add its SHA-256 to the settings
    /// file (created if missing), and print the token once: it is not stored
    /// anywhere, so keep it. Restart the server to use it.
    Add {
        /// The device the token names (recorded on every op it causes).
        device: String,
        /// The TOML settings file to add it to.
        #[arg(long, env = "SPARK_CONFIG")]
        config: PathBuf,
    },
}

/// Where to listen and what to serve. Flags override environment variables,
/// which override the settings file, which overrides the defaults.
#[derive(Args, Debug, Clone, Default)]
struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8080; port 0 picks a free one).
    #[arg(long, env = "SPARK_LISTEN")]
    listen: Option<SocketAddr>,
    /// Data directory (default ./spark-data).
    #[arg(long, env = "SPARK_DATA")]
    data: Option<PathBuf>,
    /// TOML settings file; every setting has a default.
    #[arg(long, env = "SPARK_CONFIG")]
    config: Option<PathBuf>,
}

impl ServeArgs {
    /// These arguments, each missing one taken from `outer` (the same
    /// flags given before the subcommand: `spark-engine --data D serve`
    /// means what `spark-engine serve --data D` does).
    fn or(self, outer: ServeArgs) -> ServeArgs {
        ServeArgs {
            listen: self.listen.or(outer.listen),
            data: self.data.or(outer.data),
            config: self.config.or(outer.config),
        }
    }
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // Let mimalloc ask for transparent huge pages (madvise): the mirror of
    // a 10M-op log is about 5 GB, and faulting it in 4 KiB pages was a
    // quarter of the startup profile (issue 7; README "Performance").
    // SAFETY: sets a process-wide allocator option; mimalloc reads options
    // at each OS allocation, and no other thread exists yet.
    unsafe {
        libmimalloc_sys::mi_option_set_enabled(libmimalloc_sys::mi_option_large_os_pages, true)
    };
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    let json_logs = cli.log_format == "json";
    if json_logs {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    let result = match cli.command {
        Some(Cmd::Config(ConfigCmd::Print(args))) => settings_from(&args.or(cli.serve)).map(|s| {
            print!("{}", s.to_toml_redacted());
            ExitCode::SUCCESS
        }),
        Some(Cmd::Token(TokenCmd::Add { device, config })) => token_add(&device, &config),
        Some(Cmd::Serve(args)) => serve(args.or(cli.serve)).map(|()| ExitCode::SUCCESS),
        None => serve(cli.serve).map(|()| ExitCode::SUCCESS),
        Some(Cmd::Capture(args)) => client_cli::capture(args),
        Some(Cmd::Drain(args)) => client_cli::drain(args),
        Some(Cmd::SendMessage(args)) => client_cli::send_message(args),
        Some(Cmd::Outbox(args)) => client_cli::outbox(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // Each error's message already names its cause. With JSON logs
            // the fatal error is a JSON log line too, for the machine that
            // reads them.
            if json_logs {
                tracing::error!(error = %e, "spark-engine stopped");
            } else {
                eprintln!("spark-engine: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The effective settings: defaults, the file, the environment, the flags.
fn settings_from(args: &ServeArgs) -> anyhow::Result<Settings> {
    let mut settings = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    settings.apply_env(std::env::vars())?;
    if let Some(listen) = args.listen {
        settings.listen = listen;
    }
    if let Some(data) = &args.data {
        settings.data_dir = data.clone();
    }
    settings.validate()?;
    Ok(settings)
}

/// `spark-engine token add DEVICE --config FILE`.
fn token_add(device: &str, config: &std::path::Path) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let existing = match std::fs::read_to_string(config) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => anyhow::bail!("cannot read {}: {e}", config.display()),
    };
    let token = format!("spk_{}", hex::encode(rand::random::<[u8; 32]>()));
    let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "\n[[access.tokens]]\ndevice = {}\nsha256 = \"{sha256}\"\n",
        toml::Value::String(device.to_owned())
    ));
    // The result must still be valid settings, device rules included.
    let parsed: Settings = toml::from_str(&text)?;
    parsed.validate()?;
    // Durably: a temporary file, fsync, rename, directory fsync.
    let dir = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let temp = dir.join(format!(
        ".{}.tmp",
        config
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("spark")
    ));
    {
        let mut file = std::fs::File::create(&temp)?;
        // The new file keeps the old one's permissions (0600 when new).
        let permissions = match std::fs::metadata(config) {
            Ok(meta) => meta.permissions(),
            Err(_) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::Permissions::from_mode(0o600)
            }
        };
        file.set_permissions(permissions)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&temp, config)?;
    std::fs::File::open(dir)?.sync_all()?;
    println!("{token}");
    eprintln!(
        "added a token for device {device:?} to {} (only its SHA-256 is stored; this is the only time the token is shown; restart the server to use it)",
        config.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let settings = settings_from(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = server::start(settings).await?;
        // Catch SIGTERM and SIGINT before saying we are ready: one polled
        // step installs the handlers, so a signal sent as soon as the line
        // is read is a clean stop rather than the default action (death by
        // signal, the race a restart test caught under load).
        let mut shutdown = Box::pin(server::shutdown_signal());
        let signalled = futures_util::FutureExt::now_or_never(&mut shutdown).is_some();
        // The one line scripts wait for: the address, once ready.
        println!("spark-engine listening on http://{}", running.addr);
        use std::io::Write;
        std::io::stdout().flush()?;
        if !signalled {
            shutdown.await;
        }
        tracing::info!("shutting down: finishing requests and the batch in flight");
        running.shutdown().await;
        Ok(())
    })
}

/// The outbox commands: thin wrappers over `spark_engine::client`.
mod client_cli {
    use std::path::PathBuf;
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::Context;
    use clap::Args;
    use spark_engine::client::{
        image, Capture, Client, DrainOptions, DrainReport, EntryState, MediaBytes, MessageAttempt,
        MessageState, Outbox, ReqwestTransport, SystemClientClock,
    };
    use spark_engine::ids::Id;

    /// Exit code when work is left pending (the link or the server is in
    /// trouble; drain again later).
    const EXIT_PENDING: u8 = 2;
    /// Exit code when an entry is parked or a message failed: the person
    /// has to look (`spark-engine outbox`).
    const EXIT_NEEDS_ATTENTION: u8 = 3;

    /// Where the outbox lives.
    #[derive(Args, Debug)]
    pub struct OutboxDir {
        /// The outbox directory (created when missing).
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

    /// `capture PHOTO`.
    #[derive(Args, Debug)]
    pub struct CaptureArgs {
        /// The photo (JPEG or PNG); stored as is as the original.
        photo: PathBuf,
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
        Ok(
            Client::new(outbox, Arc::new(transport), Arc::new(SystemClientClock))
                .with_options(options),
        )
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

    pub fn capture(args: CaptureArgs) -> anyhow::Result<ExitCode> {
        let photo = std::fs::read(&args.photo)
            .with_context(|| format!("cannot read {}", args.photo.display()))?;
        let copy = image::make_copy(&photo).with_context(|| {
            format!("{} is not a photo this client reads", args.photo.display())
        })?;
        let outbox = Outbox::open(&args.dir.outbox)?;
        let original = MediaBytes {
            content_type: image::content_type_of(&photo),
            bytes: photo,
        };
        let entry = outbox.capture(
            &SystemClientClock,
            Capture {
                copy,
                original,
                text: args.text,
                caption: args.caption,
                lang: args.lang,
                captured_at_ms: None,
            },
        )?;
        // The moment is safe now; its id is final.
        println!("{}", entry.moment_id);
        eprintln!(
            "captured: entry {} (copy {} bytes, original {} bytes) in {}",
            entry.id,
            entry.copy.size,
            entry.original.size,
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
        )?;
        let report = runtime()?.block_on(client.drain())?;
        Ok(summarize(&report))
    }

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
                eprintln!("pending ({cause}); `spark-engine drain` sends it later");
                Ok(ExitCode::from(EXIT_PENDING))
            }
        }
    }

    pub fn outbox(args: OutboxArgs) -> anyhow::Result<ExitCode> {
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
            let sent: Vec<&str> = entry.done.iter().map(|s| s.name()).collect();
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
            } else if let (Some(error), EntryState::Pending(_)) = (&entry.last_error, entry.state())
            {
                line.push_str(&format!("  last trouble: {error}"));
            }
            println!("{line}");
        }
        for (path, why) in &scan.unreadable {
            println!("unreadable {}: {why}", path.display());
        }
        println!("messages: {}", messages.len());
        for message in &messages {
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
            println!("{line}");
        }
        Ok(ExitCode::SUCCESS)
    }
}
