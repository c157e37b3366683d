//! The command-line client (`spark-client capture`, `drain`,
//! `send-message`, `outbox`) against a real server (in-process, on an
//! ephemeral port).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use spark_engine::config::Settings;
use spark_engine::server::RunningServer;

const BIN: &str = env!("CARGO_BIN_EXE_spark-client");
const SIGN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/sign.png");

/// A server on its own runtime, and its base URL.
struct Server {
    runtime: tokio::runtime::Runtime,
    running: RunningServer,
    base: String,
}

/// A server over `data` on a free loopback port, with `settings` changed by
/// `adjust`.
fn start_server(data: &Path, adjust: impl FnOnce(&mut Settings)) -> Server {
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    adjust(&mut settings);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let running = runtime
        .block_on(spark_engine::server::start(settings))
        .expect("server starts");
    let base = format!("http://{}", running.addr);
    Server {
        runtime,
        running,
        base,
    }
}

fn stop(server: Server) {
    server.runtime.block_on(server.running.shutdown());
}

/// Runs the client with `args`, without the outbox environment variables.
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("SPARK_SERVER")
        .env_remove("SPARK_OUTBOX")
        .env_remove("SPARK_TOKEN")
        .env("SPARK_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn get(url: &str) -> (u16, Vec<u8>, Option<String>) {
    let response = reqwest::blocking::get(url).unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, response.bytes().unwrap().to_vec(), content_type)
}

fn get_json(url: &str) -> Value {
    let (status, body, _) = get(url);
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn capture_drain_send_message_and_list_from_the_command_line() {
    let data = tempfile::tempdir().unwrap();
    let outbox = tempfile::tempdir().unwrap();
    let outbox_dir = outbox.path().to_str().unwrap();
    let server = start_server(data.path(), |_| {});
    let base = server.base.clone();

    // Capture and send in one go.
    let out = run(&[
        "capture",
        SIGN,
        "--text",
        "NOTAUSGANG",
        "--lang",
        "de",
        "--outbox",
        outbox_dir,
        "--server",
        &base,
    ]);
    assert!(out.status.success(), "{out:?}");
    let moment_id = stdout(&out);
    assert_eq!(moment_id.len(), 26, "{moment_id:?}");
    let moment = get_json(&format!("{base}/api/moments/{moment_id}"));
    assert_eq!(moment["text"], "NOTAUSGANG");
    let media = moment["media"].as_array().unwrap();
    assert_eq!(media.len(), 2, "{moment}");
    assert_eq!(moment["turns"].as_array().unwrap().len(), 1);
    for item in media {
        let (status, bytes, content_type) = get(&format!(
            "{base}/api/media/{}",
            item["id"].as_str().unwrap()
        ));
        assert_eq!(status, 200);
        if item["role"] == "copy" {
            assert_eq!(content_type.as_deref(), Some("image/jpeg"));
            let copy = image::load_from_memory(&bytes).unwrap();
            assert!(copy.width().max(copy.height()) <= 1024);
            assert_eq!((copy.width(), copy.height()), (640, 260));
        } else {
            assert_eq!(item["role"], "original");
            assert_eq!(content_type.as_deref(), Some("image/png"));
            assert_eq!(
                bytes,
                std::fs::read(SIGN).unwrap(),
                "the original is the file as is"
            );
        }
    }

    // Capture offline (no server), then drain.
    let out = run(&[
        "capture",
        SIGN,
        "--text",
        "KEIN ZUTRITT",
        "--outbox",
        outbox_dir,
    ]);
    assert!(out.status.success(), "{out:?}");
    let second = stdout(&out);
    let listing = stdout(&run(&["outbox", "--outbox", outbox_dir]));
    assert!(
        listing.contains(&format!("moment {second}  pending (next: create)")),
        "{listing}"
    );
    let out = run(&["drain", "--outbox", outbox_dir, "--server", &base]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        get_json(&format!("{base}/api/moments/{second}"))["text"],
        "KEIN ZUTRITT"
    );
    let listing = stdout(&run(&["outbox", "--outbox", outbox_dir]));
    assert_eq!(
        listing
            .matches("  done  sent: create,copy,turn,original")
            .count(),
        2,
        "{listing}"
    );

    // A message in the first moment's thread.
    let out = run(&[
        "send-message",
        "--outbox",
        outbox_dir,
        "--server",
        &base,
        "--thread",
        &moment_id,
        "Bin gleich da",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let message_id = stdout(&out);
    let thread = get_json(&format!("{base}/api/messages?thread={moment_id}"));
    assert_eq!(thread["messages"][0]["id"], message_id.as_str());
    let listing = stdout(&run(&["outbox", "--outbox", outbox_dir, "--json"]));
    let listing: Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(listing["entries"].as_array().unwrap().len(), 2);
    assert_eq!(listing["messages"][0]["state"], "sent");
    stop(server);
}

#[test]
fn a_dead_server_leaves_entries_pending_and_a_refusal_parks_them_visibly() {
    let outbox = tempfile::tempdir().unwrap();
    let outbox_dir = outbox.path().to_str().unwrap();
    let out = run(&["capture", SIGN, "--outbox", outbox_dir]);
    assert!(out.status.success(), "{out:?}");
    let moment_id = stdout(&out);

    // Nothing listens there: wait, give up, keep the entry.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let out = run(&[
        "drain",
        "--outbox",
        outbox_dir,
        "--server",
        &dead,
        "--give-up-after-secs",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let listing = stdout(&run(&["outbox", "--outbox", outbox_dir]));
    assert!(listing.contains("pending (next: create)"), "{listing}");
    assert!(
        listing.contains("last trouble: step create: network error"),
        "{listing}"
    );

    // A server that takes uploads of at most 1000 bytes: the copy is
    // refused with 413, and the entry is parked with that reason.
    let data = tempfile::tempdir().unwrap();
    let server = start_server(data.path(), |s| s.limits.media_limit_bytes = 1000);
    let base = server.base.clone();
    let out = run(&["drain", "--outbox", outbox_dir, "--server", &base]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let listing = stdout(&run(&["outbox", "--outbox", outbox_dir]));
    assert!(
        listing.contains(&format!(
            "moment {moment_id}  parked  sent: create  reason: step copy: 413 too_large"
        )),
        "{listing}"
    );
    stop(server);
}

#[test]
fn drain_says_why_it_waits_and_a_signal_ends_it_with_the_summary() {
    use std::io::{BufRead, BufReader};
    let outbox = tempfile::tempdir().unwrap();
    let outbox_dir = outbox.path().to_str().unwrap();
    let out = run(&["capture", SIGN, "--outbox", outbox_dir]);
    assert!(out.status.success(), "{out:?}");
    // A server that wants a token the client does not send: 401, passing
    // trouble that the drain waits out.
    let data = tempfile::tempdir().unwrap();
    let server = start_server(data.path(), |s| {
        s.access.tokens.push(spark_engine::config::TokenEntry {
            device: "phone-1".into(),
            sha256: "ab".repeat(32),
        })
    });
    for (signal, name) in [("-INT", "SIGINT"), ("-TERM", "SIGTERM")] {
        let mut child = Command::new(BIN)
            .args(["drain", "--outbox", outbox_dir, "--server", &server.base])
            .env_remove("SPARK_TOKEN")
            .env("SPARK_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        // While it waits it says so at once, with the server's reason.
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("drain: waiting") && line.contains("HTTP 401 unauthorized"),
            "{line}"
        );
        Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
        // The same summary and exit code as a normal end: 2, pending.
        assert_eq!(status.code(), Some(2), "{name}: {rest}");
        assert!(rest.contains(&format!("stopped by {name}")), "{rest}");
        assert!(
            rest.contains("drain: 0 steps sent") && rest.contains("1 pending"),
            "{name}: {rest}"
        );
    }
    stop(server);
}

#[test]
fn listing_an_outbox_that_does_not_exist_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo");
    let out = run(&["outbox", "--outbox", typo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no outbox at") && err.contains("typo"),
        "{err}"
    );
    assert!(!typo.exists(), "listing created the directory");
}
