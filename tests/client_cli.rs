//! The command-line client (`spark-engine capture`, `drain`,
//! `send-message`, `outbox`) against the real server binary.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_spark-engine");
const SIGN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sign.png");

/// The server binary with extra arguments, and its base URL.
fn start_server(data: &Path, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.split("http://").nth(1).unwrap().trim().to_owned();
    (child, format!("http://{addr}"))
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
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
    let (server, base) = start_server(data.path(), &[]);

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
    let config = data.path().join("spark.toml");
    std::fs::write(&config, "[limits]\nmedia_limit_bytes = 1000\n").unwrap();
    let store = data.path().join("data");
    let (server, base) = start_server(&store, &["--config", config.to_str().unwrap()]);
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
