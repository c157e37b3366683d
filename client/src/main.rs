//! `spark-client`: the phone's outbox from the command line (`capture`,
//! `drain`, `send-message`, `outbox`), over the `spark_client` library.
//! Exit codes: `0` nothing left, `2` something still pending, `3`
//! something parked or failed, `1` the outbox itself failed.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The phone's outbox for a Spark engine: capture photos durably, send them
/// and messages with the retry rules of SPEC section 6.
#[derive(Parser, Debug)]
#[command(name = "spark-client", version, about, long_about = None)]
struct Cli {
    /// Log lines on stderr: `text` for people, `json` for machines.
    #[arg(long, global = true, env = "SPARK_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Put a photo in the outbox (a small JPEG copy, at most 1024 px, and
    /// the original as is) and print its moment id; with a server, send it.
    Capture(commands::CaptureArgs),
    /// Send everything pending in the outbox, waiting out passing trouble.
    Drain(commands::DrainArgs),
    /// Send a message to a moment's thread (ADR-036 retry rules).
    SendMessage(commands::SendMessageArgs),
    /// List the outbox: entries, their state and parked reasons; messages.
    Outbox(commands::OutboxArgs),
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    let cli = Cli::parse();
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
    let result = match cli.command {
        Cmd::Capture(args) => commands::capture(args),
        Cmd::Drain(args) => commands::drain(args),
        Cmd::SendMessage(args) => commands::send_message(args),
        Cmd::Outbox(args) => commands::outbox(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // With JSON logs the fatal error is a JSON log line too, for
            // the machine that reads them.
            if json_logs {
                tracing::error!(error = %e, "spark-client stopped");
            } else {
                eprintln!("spark-client: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
