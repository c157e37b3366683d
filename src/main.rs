//! `spark-engine`: the server binary. `spark-engine` alone (or
//! `spark-engine serve`) serves on 127.0.0.1:8080 with `./spark-data`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spark_engine::config::Settings;
use spark_engine::server;

/// The Spark engine: an event-sourced store on an append-only log, with an
/// HTTP API. Serves when no subcommand is given.
#[derive(Parser, Debug)]
#[command(name = "spark-engine", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the HTTP API (the default).
    Serve(ServeArgs),
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

fn main() -> ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SPARK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Cmd::Serve(args)) => args,
        None => cli.serve,
    };
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each error's message already names its cause.
            eprintln!("spark-engine: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    if let Some(listen) = args.listen {
        settings.listen = listen;
    }
    if let Some(data) = args.data {
        settings.data_dir = data;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = server::start(settings).await?;
        // The one line scripts wait for: the address, once ready.
        println!("spark-engine listening on http://{}", running.addr);
        use std::io::Write;
        std::io::stdout().flush()?;
        server::shutdown_signal().await;
        tracing::info!("shutting down: finishing requests and the batch in flight");
        running.shutdown().await;
        Ok(())
    })
}
