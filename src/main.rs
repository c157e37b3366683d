//! `spark-engine`: the server binary. `spark-engine` alone (or
//! `spark-engine serve`) serves on 127.0.0.1:8080 with `./spark-data`.
//! The phone's outbox commands (`capture`, `drain`, `send-message`,
//! `outbox`) are the `spark-client` binary (package `spark-client`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use spark_engine::config::{resolve_listen, Settings, DEFAULT_CONFIG_FILE};
use spark_engine::server;

/// mimalloc instead of the system allocator: startup replay allocates the
/// mirror's strings by the million, and glibc's malloc and free were 40% of
/// its profile (docs/performance/).
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
    /// Serve every read route as a read replica of an archive (SPEC
    /// section 11): the data directory is a cache of the archive, brought
    /// to its latest manifest at start and following it as it grows
    /// (`[replica] poll_interval_ms`); writes answer `421 read_only`.
    Replica(ReplicaArgs),
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
        /// The TOML settings file to add it to: this flag, the same flag
        /// before `token`, or `SPARK_CONFIG` (refused when two of them
        /// name different files); with none, `./spark.toml`, which the
        /// server reads when no `--config` is given.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Where to listen and what to serve. Flags override environment variables,
/// which override the settings file, which overrides the defaults.
#[derive(Args, Debug, Clone, Default)]
struct ServeArgs {
    /// Address to listen on: IP:PORT or HOST:PORT, a host name resolved
    /// once (default 127.0.0.1:8080; port 0 picks a free one).
    #[arg(long, env = "SPARK_LISTEN", value_parser = resolve_listen)]
    listen: Option<SocketAddr>,
    /// Data directory (default ./spark-data).
    #[arg(long, env = "SPARK_DATA")]
    data: Option<PathBuf>,
    /// TOML settings file; every setting has a default (env
    /// `SPARK_CONFIG`, read by [`config_file`], not by clap: a flag before
    /// the subcommand must beat it). Without either, `./spark.toml` is read
    /// when it exists (`token add` writes there).
    #[arg(long)]
    config: Option<PathBuf>,
    /// With `[archive]`: take the archive's prefix over from the engine
    /// that holds it (moving a shard to this machine). This data directory
    /// must hold a prefix of the archive (restore it first with
    /// `spark-replay restore`); the rest is fetched, then the other engine
    /// is fenced: its writes answer `503 fenced`. No environment variable
    /// on purpose: give it once, for the start that moves the shard. With
    /// `[archive] lease_ms` above 0, a start without it does the same by
    /// itself once the other engine's lease expired, and otherwise refuses,
    /// saying when the lease expires.
    #[arg(long)]
    take_over: bool,
}

/// `spark-engine replica --from URL [--data DIR]`.
#[derive(Args, Debug, Clone)]
struct ReplicaArgs {
    /// The archive to follow: `s3://BUCKET/PREFIX` (the writer's
    /// `[archive] url`). Credentials from `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    #[arg(long = "from", value_name = "URL")]
    from: String,
    /// The store's endpoint for stores other than AWS (e.g.
    /// `http://127.0.0.1:8333`); default `[replica] endpoint`.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The writer's address, named in `421 read_only` answers; default
    /// `[replica] writer_url`.
    #[arg(long, value_name = "URL")]
    writer_url: Option<String>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// The environment variable that names the settings file when no
/// `--config` flag does.
const CONFIG_ENV: &str = "SPARK_CONFIG";

impl ServeArgs {
    /// These arguments (the subcommand's, parsed into `matches`), each
    /// missing one taken from `outer` (the same flags given before the
    /// subcommand, parsed into `outer_matches`): `spark-engine --data D
    /// serve` means what `spark-engine serve --data D` does. A flag given
    /// on the command line beats one clap filled from the environment
    /// wherever it stands, and the same flag given twice with different
    /// values is refused, naming it, rather than one of them winning
    /// unseen. `--config` then comes from [`config_file`].
    fn merged(
        self,
        matches: &ArgMatches,
        outer: ServeArgs,
        outer_matches: &ArgMatches,
    ) -> anyhow::Result<ServeArgs> {
        fn pick<T: PartialEq + std::fmt::Debug>(
            flag: &str,
            inner: Option<T>,
            inner_matches: &ArgMatches,
            outer: Option<T>,
            outer_matches: &ArgMatches,
        ) -> anyhow::Result<Option<T>> {
            let typed = |m: &ArgMatches| m.value_source(flag) == Some(ValueSource::CommandLine);
            Ok(match (typed(inner_matches), typed(outer_matches)) {
                (true, true) if inner != outer => anyhow::bail!(
                    "--{} is given twice, as {:?} before the subcommand and {:?} after it: \
                     give it once",
                    flag.replace('_', "-"),
                    outer.as_ref().map(|v| v as &dyn std::fmt::Debug),
                    inner.as_ref().map(|v| v as &dyn std::fmt::Debug),
                ),
                (true, _) => inner,
                (false, true) => outer,
                (false, false) => inner.or(outer),
            })
        }
        Ok(ServeArgs {
            listen: pick("listen", self.listen, matches, outer.listen, outer_matches)?,
            data: pick("data", self.data, matches, outer.data, outer_matches)?,
            config: config_file(self.config, outer.config, false)?,
            take_over: self.take_over || outer.take_over,
        })
    }
}

/// The settings file named by `--config` after the subcommand (`inner`),
/// `--config` before it (`outer`) and `SPARK_CONFIG`, or `None` when none
/// does (then `./spark.toml` is the one meant). Two flags naming different
/// files are refused. A flag beats `SPARK_CONFIG` ("flags beat the
/// environment") unless `strict`: `token add` writes a token where it is
/// then relied on, so there a flag and the variable that disagree are
/// refused too, naming both, rather than the token going to a file the
/// server may not read.
fn config_file(
    inner: Option<PathBuf>,
    outer: Option<PathBuf>,
    strict: bool,
) -> anyhow::Result<Option<PathBuf>> {
    let env = std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let named = [
        (inner, "--config after the subcommand"),
        (outer, "--config before the subcommand"),
        (env.filter(|_| strict), CONFIG_ENV),
    ];
    let mut chosen: Option<(PathBuf, &str)> = None;
    for (path, source) in named {
        let Some(path) = path else { continue };
        match &chosen {
            Some((first, first_source)) if !same_path(first, &path) => anyhow::bail!(
                "{first_source} names {} and {source} names {}: name the settings file once",
                first.display(),
                path.display()
            ),
            Some(_) => {}
            None => chosen = Some((path, source)),
        }
    }
    Ok(chosen.map(|(path, _)| path).or_else(|| {
        std::env::var_os(CONFIG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }))
}

/// True when `a` and `b` name the same file: the same existing file, or
/// the same absolute path when either is missing.
fn same_path(a: &std::path::Path, b: &std::path::Path) -> bool {
    same_file(a, b) || std::path::absolute(a).ok() == std::path::absolute(b).ok()
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // Let mimalloc ask for transparent huge pages (madvise): the mirror of
    // a 10M-op log is about 5 GB, and faulting it in 4 KiB pages was a
    // quarter of the startup profile (docs/performance/).
    // SAFETY: sets a process-wide allocator option; mimalloc reads options
    // at each OS allocation, and no other thread exists yet.
    unsafe {
        libmimalloc_sys::mi_option_set_enabled(libmimalloc_sys::mi_option_large_os_pages, true)
    };
    if let Some(moved) = moved_client_command() {
        return moved;
    }
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (stderr a file on a full disk) is
    // dropped: the subscriber's own report of it would `eprintln!`, which
    // panics when stderr cannot be written, in whichever thread logged
    // (the log's writer, say).
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_env_filter(filter);
    let json_logs = cli.log_format == "json";
    if json_logs {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    let result = run_command(cli, &matches);
    match result {
        Ok(code) => code,
        Err(e) => {
            // Each error's message already names its cause. With JSON logs
            // the fatal error is a JSON log line too, for the machine that
            // reads them.
            if json_logs {
                tracing::error!(error = %e, "spark-engine stopped");
            } else {
                // Not eprintln!, which panics when stderr cannot be written.
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "spark-engine: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs the command `cli` (parsed from `matches`, which say which flags
/// were typed rather than taken from the environment).
fn run_command(cli: Cli, matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    // The matches of the subcommand's own flags (`serve`, `config print`,
    // `replica`, `token add`).
    let leaf = {
        let mut at = matches;
        while let Some((_, sub)) = at.subcommand() {
            at = sub;
        }
        at
    };
    match cli.command {
        Some(Cmd::Config(ConfigCmd::Print(args))) => {
            let args = args.merged(leaf, cli.serve, matches)?;
            let settings = settings_from(&args)?;
            print!("{}", settings.to_toml_redacted());
            Ok(ExitCode::SUCCESS)
        }
        Some(Cmd::Token(TokenCmd::Add { device, config })) => {
            let file = config_file(config, cli.serve.config, true)?
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_FILE));
            token_add(&device, &file)
        }
        Some(Cmd::Serve(args)) => {
            serve(args.merged(leaf, cli.serve, matches)?).map(|()| ExitCode::SUCCESS)
        }
        Some(Cmd::Replica(args)) => {
            let serve_args = args.serve.clone().merged(leaf, cli.serve, matches)?;
            replica(args, serve_args).map(|()| ExitCode::SUCCESS)
        }
        None => {
            let args = cli.serve.clone().merged(matches, cli.serve, matches)?;
            serve(args).map(|()| ExitCode::SUCCESS)
        }
    }
}

/// The outbox commands this binary had until the client became its own
/// package.
const MOVED_CLIENT_COMMANDS: [&str; 4] = ["capture", "drain", "send-message", "outbox"];

/// When the first argument is one of [`MOVED_CLIENT_COMMANDS`], says where
/// it went and returns the usage-error exit code (2), so an old script
/// fails with directions instead of clap's "unrecognized subcommand".
fn moved_client_command() -> Option<ExitCode> {
    let first = std::env::args().nth(1)?;
    let name = MOVED_CLIENT_COMMANDS.iter().find(|c| **c == first)?;
    eprintln!(
        "spark-engine: `{name}` moved to the `spark-client` binary: run `spark-client {name} ...` \
         (from a checkout: `cargo run -p spark-client -- {name} ...`)"
    );
    Some(ExitCode::from(2))
}

/// The effective settings: defaults, the file (`--config`, else
/// `./spark.toml` when it exists), the environment, the flags.
fn settings_from(args: &ServeArgs) -> anyhow::Result<Settings> {
    let default_file = std::path::Path::new(DEFAULT_CONFIG_FILE);
    let mut settings = match &args.config {
        Some(path) => {
            if default_file.is_file() && !same_file(path, default_file) {
                tracing::warn!(
                    "./{DEFAULT_CONFIG_FILE} exists but --config {} is used: the settings and \
                     tokens in ./{DEFAULT_CONFIG_FILE} are NOT read",
                    path.display()
                );
            }
            Settings::from_file(path)?
        }
        None if default_file.is_file() => {
            tracing::info!(
                "reading settings from ./{DEFAULT_CONFIG_FILE} (found in the working \
                 directory; --config FILE reads another)"
            );
            Settings::from_file(default_file)?
        }
        None => Settings::default(),
    };
    // The flag (which clap also fills from SPARK_LISTEN) resolves host
    // names; the generic environment override takes IP:PORT only.
    settings.apply_env(
        std::env::vars().filter(|(k, _)| args.listen.is_none() || k != "SPARK_LISTEN"),
    )?;
    if let Some(listen) = args.listen {
        settings.listen = listen;
    }
    if let Some(data) = &args.data {
        settings.data_dir = data.clone();
    }
    settings.take_over = args.take_over;
    settings.validate()?;
    Ok(settings)
}

/// True when `a` and `b` name the same existing file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// The file `path` names once every symbolic link on its last component
/// is followed (a relative target is read from the link's directory); the
/// file itself may not exist yet. Errors: a loop of more than 40 links.
fn through_links(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let mut path = path.to_owned();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = match path.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
                };
            }
            _ => return Ok(path),
        }
    }
    anyhow::bail!("{}: too many levels of symbolic links", path.display())
}

/// `spark-engine token add DEVICE [--config FILE]`.
fn token_add(device: &str, config: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use spark_log_format::Fs as _;
    // A symbolic link (as configuration managers lay files out) is written
    // through: the file it names gets the token and the link stays.
    let config = &through_links(config)?;
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
    // Durably (Fs::write_file_durably: a temporary file, fsync, rename,
    // directory fsync); the new file keeps the old one's permissions (0600
    // when new).
    let mode = match std::fs::metadata(config) {
        Ok(meta) => {
            use std::os::unix::fs::PermissionsExt;
            meta.permissions().mode() & 0o7777
        }
        Err(_) => 0o600,
    };
    spark_log_format::OsFs
        .write_file_durably_mode(config, text.as_bytes(), Some(mode))
        .with_context(|| format!("cannot replace {}", config.display()))?;
    println!("{token}");
    // The path as the server must be given it, whatever the working
    // directory it is started from.
    let written = config
        .canonicalize()
        .or_else(|_| std::path::absolute(config))
        .unwrap_or_else(|_| config.to_owned());
    let restart = if same_file(config, std::path::Path::new(DEFAULT_CONFIG_FILE)) {
        format!(
            "restart the server from this directory to use it (with no --config it reads \
             ./{DEFAULT_CONFIG_FILE}), or with --config {}",
            written.display()
        )
    } else {
        format!(
            "restart the server with --config {} to use it",
            written.display()
        )
    };
    eprintln!(
        "added a token for device {device:?} to {} (only its SHA-256 is stored; this is the only time the token is shown; {restart})",
        written.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `spark-engine replica`: the settings as for `serve` (`serve_args`,
/// already merged with the flags before the subcommand), with `--from`
/// (and `--endpoint`, `--writer-url`) applied before they are checked.
fn replica(args: ReplicaArgs, serve_args: ServeArgs) -> anyhow::Result<()> {
    if serve_args.take_over {
        anyhow::bail!("--take-over: a replica takes no prefix over (it ships nothing)");
    }
    let mut settings = settings_from(&serve_args)?;
    settings.replica_from = Some(args.from);
    if let Some(endpoint) = args.endpoint {
        settings.replica.endpoint = endpoint;
    }
    if let Some(writer_url) = args.writer_url {
        settings.replica.writer_url = writer_url;
    }
    settings.validate()?;
    run(settings)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    run(settings_from(&args)?)
}

/// Starts the server on `settings` and serves until SIGTERM or SIGINT.
fn run(settings: Settings) -> anyhow::Result<()> {
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
        // Not println!, which panics when stdout cannot be written (a file
        // on a full disk): the server serves whether or not the line is
        // read.
        use std::io::Write;
        let mut stdout = std::io::stdout();
        if let Err(e) = writeln!(stdout, "spark-engine listening on http://{}", running.addr)
            .and_then(|()| stdout.flush())
        {
            tracing::warn!(error = %e, "cannot write the listening line to stdout");
        }
        if !signalled {
            shutdown.await;
        }
        tracing::info!("shutting down: finishing requests and the batch in flight");
        running.shutdown().await;
        Ok(())
    })
}
