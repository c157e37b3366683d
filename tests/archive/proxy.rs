//! Many engines behind one address (docs/scale.md):
//! Debian's nginx runs `deploy/nginx.conf` as committed (only its loopback
//! addresses replaced by this test's ports) in front of two shards, each a
//! writer shipping to its own archive prefix on a `weed mini` of the test's
//! own and a replica following that prefix.
//!
//! [`nginx_routes_each_shard_to_its_own_engines_and_fails_reads_over`]
//! checks that every request lands on an engine of the shard it names (the
//! `X-Spark-Upstream` header nginx adds, and what each writer holds when
//! asked directly), that a request naming no shard or an unknown one is
//! refused by nginx (`421 unknown_shard`), that reads fail over to the
//! shard's replica once its writer is gone (answering exactly as the
//! writer did), and that writes never do (they answer `503 unavailable`
//! from nginx, and nothing lands on the other shard).
//!
//! Skipped (`skipped: ...`) without nginx (`SPARK_NGINX`, else `nginx` on
//! `PATH` or `/usr/sbin/nginx`), unless `SPARK_REQUIRE_NGINX=1` (set by
//! `.ci/run`), and without `weed` as the archive tests are.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::s3_common::{engine_or_skip, set_credentials, unique_prefix, EngineProcess};
use crate::weed::Weed;

/// The nginx binary, or `None` (after printing why, or failing under
/// `SPARK_REQUIRE_NGINX=1`).
fn nginx_or_skip(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("SPARK_NGINX")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("nginx"))
                .find(|p| p.is_file())
        })
        .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()));
    if found.is_none() {
        let why = "no nginx binary (apt-get install nginx, or set SPARK_NGINX)";
        if std::env::var("SPARK_REQUIRE_NGINX").as_deref() == Ok("1") {
            panic!("{test}: {why}, and SPARK_REQUIRE_NGINX=1 makes this test mandatory");
        }
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {test}: {why} (set SPARK_REQUIRE_NGINX=1 to make it mandatory)"
        );
    }
    found
}

/// An nginx of the test's own, killed on drop.
struct Nginx {
    child: Child,
    prefix: PathBuf,
}

impl Drop for Nginx {
    /// SIGTERM (nginx's fast shutdown: the master stops its workers), then
    /// SIGKILL if it has not exited within 5 s.
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts nginx on `deploy/nginx.conf` with each `(from, to)` address
/// replaced, in a prefix directory under `work`; waits until it answers.
fn start_nginx(binary: &Path, work: &Path, replace: &[(&str, String)], listen: &str) -> Nginx {
    let conf_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx.conf");
    let mut conf = std::fs::read_to_string(&conf_path).unwrap();
    for (from, to) in replace {
        assert!(conf.contains(from), "deploy/nginx.conf names {from}");
        conf = conf.replace(from, to);
    }
    let prefix = work.join("nginx");
    for dir in ["logs", "tmp"] {
        std::fs::create_dir_all(prefix.join(dir)).unwrap();
    }
    // The workers run as an unprivileged user: let them write temp files.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(prefix.join("tmp"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let conf_file = prefix.join("nginx.conf");
    std::fs::write(&conf_file, conf).unwrap();
    let child = Command::new(binary)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf_file)
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(prefix.join("stderr.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let nginx = Nginx { child, prefix };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(listen).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not listen on {listen}: {}{}",
            std::fs::read_to_string(nginx.prefix.join("stderr.log")).unwrap_or_default(),
            std::fs::read_to_string(nginx.prefix.join("logs/error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nginx
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `http://127.0.0.1:PORT` → `127.0.0.1:PORT`.
fn addr(base: &str) -> String {
    base.strip_prefix("http://").unwrap().to_owned()
}

/// A ULID for now, `salt` making it unique.
fn ulid_now(salt: u128) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    spark_engine::Id::from_parts(ms, salt * 104_729 + 7).to_string()
}

/// One answer through the proxy: status, the engine that answered
/// (`X-Spark-Upstream`), the body.
fn send(request: reqwest::blocking::RequestBuilder) -> (u16, String, Value) {
    let r = request.send().unwrap();
    let status = r.status().as_u16();
    let upstream = r
        .headers()
        .get("x-spark-upstream")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = r.text().unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, upstream, body)
}

/// Waits until the writer's archive holds its head and the replica serves it.
fn caught_up(client: &reqwest::blocking::Client, writer: &str, replica: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let w: Value = client
            .get(format!("{writer}/api/log/head"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let r: Value = client
            .get(format!("{replica}/api/log/head"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if w["seq"] == w["archived_seq"] && r["seq"] == w["seq"] {
            return;
        }
        assert!(Instant::now() < deadline, "not caught up: {w} {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nginx_routes_each_shard_to_its_own_engines_and_fails_reads_over() {
    let test = "nginx_routes_each_shard_to_its_own_engines_and_fails_reads_over";
    let Some(nginx_bin) = nginx_or_skip(test) else {
        return;
    };
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let work = tempfile::tempdir().unwrap();
    let replica_toml = work.path().join("replica.toml");
    std::fs::write(&replica_toml, "[replica]\npoll_interval_ms = 100\n").unwrap();
    // Two shards: a writer on its own prefix and a replica of it each.
    let mut shards = Vec::new();
    for name in ["a", "b"] {
        let url = unique_prefix(&format!("shard-{name}"));
        let toml = work.path().join(format!("writer-{name}.toml"));
        crate::s3_common::write_archive_config(&toml, 1 << 20, &url, &endpoint, 100, "async");
        let writer = EngineProcess::start(&engine, &work.path().join(format!("w-{name}")), &toml);
        let replica = EngineProcess::start_args(
            &engine,
            &["replica", "--from", &url, "--endpoint", &endpoint],
            &work.path().join(format!("r-{name}")),
            &replica_toml,
        );
        shards.push((writer, replica));
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let replace = [
        ("127.0.0.1:8101", addr(&shards[0].0.base)),
        ("127.0.0.1:8102", addr(&shards[0].1.base)),
        ("127.0.0.1:8201", addr(&shards[1].0.base)),
        ("127.0.0.1:8202", addr(&shards[1].1.base)),
        ("127.0.0.1:8080", listen.clone()),
    ];
    let _nginx = start_nginx(&nginx_bin, work.path(), &replace, &listen);
    let proxy = format!("http://{listen}");
    let client = http();

    // Writes and reads land on the shard they name, and only there.
    let mut moments: Vec<(usize, String)> = Vec::new();
    for i in 0..16u128 {
        let shard = (i % 2) as usize;
        let name = ["a", "b"][shard];
        let id = ulid_now(i);
        let (status, upstream, body) = send(
            client
                .post(format!("{proxy}/api/moments"))
                .header("X-Spark-Shard", name)
                .json(&json!({"id": id, "text": format!("shard {name} moment {i}")})),
        );
        assert_eq!(status, 201, "{body}");
        assert_eq!(
            upstream,
            addr(&shards[shard].0.base),
            "a write to shard {name}"
        );
        let (status, upstream, body) = send(
            client
                .get(format!("{proxy}/api/moments/{id}"))
                .header("X-Spark-Shard", name),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            upstream,
            addr(&shards[shard].0.base),
            "a read of shard {name}"
        );
        moments.push((shard, id));
    }
    // The engine sees the Host the client sent, port included: a write
    // from the page's own origin (through the proxy) passes the Origin
    // check. With `$host` (no port) it was 403 forbidden.
    let page_write = ulid_now(500);
    let (status, _, body) = send(
        client
            .post(format!("{proxy}/api/moments"))
            .header("X-Spark-Shard", "a")
            .header("Origin", &proxy)
            .json(&json!({"id": page_write, "text": "from the page"})),
    );
    assert_eq!(status, 201, "a same-origin write through the proxy: {body}");
    moments.push((0, page_write));
    // Each writer holds exactly its shard's moments.
    for (shard, (writer, _)) in shards.iter().enumerate() {
        let list: Value = client
            .get(format!("{}/api/moments?limit=1000", writer.base))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let mut held: Vec<String> = list["moments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect();
        held.sort();
        let mut expected: Vec<String> = moments
            .iter()
            .filter(|(s, _)| *s == shard)
            .map(|(_, id)| id.clone())
            .collect();
        expected.sort();
        assert_eq!(held, expected, "shard {shard} holds its own moments only");
    }
    // A moment of shard b asked of shard a is not there (shard a's engines
    // answer for shard a only).
    let (status, upstream, _) = send(
        client
            .get(format!("{proxy}/api/moments/{}", moments[1].1))
            .header("X-Spark-Shard", "a"),
    );
    assert_eq!((status, upstream), (404, addr(&shards[0].0.base)));
    // No shard, or an unknown one: refused by nginx, no engine asked.
    for shard in [None, Some("c")] {
        let mut request = client.post(format!("{proxy}/api/moments")).json(&json!({}));
        if let Some(shard) = shard {
            request = request.header("X-Spark-Shard", shard);
        }
        let (status, upstream, body) = send(request);
        assert_eq!(status, 421, "{body}");
        assert_eq!(body["code"], "unknown_shard", "{body}");
        assert_eq!(upstream, "", "no engine was asked");
    }

    // Shard a's writer is lost: reads fail over to its replica, with the
    // same answers; writes do not (503 from nginx), and shard b is
    // untouched.
    for (writer, replica) in &shards {
        caught_up(&client, &writer.base, &replica.base);
    }
    let before: Vec<(u16, Value)> = moments
        .iter()
        .filter(|(s, _)| *s == 0)
        .map(|(_, id)| {
            let (status, _, body) = send(
                client
                    .get(format!("{proxy}/api/moments/{id}"))
                    .header("X-Spark-Shard", "a"),
            );
            (status, body)
        })
        .collect();
    shards[0].0.kill();
    let after: Vec<(u16, Value)> = moments
        .iter()
        .filter(|(s, _)| *s == 0)
        .map(|(_, id)| {
            let (status, upstream, body) = send(
                client
                    .get(format!("{proxy}/api/moments/{id}"))
                    .header("X-Spark-Shard", "a"),
            );
            assert!(
                upstream.ends_with(&addr(&shards[0].1.base)),
                "a read of shard a after its writer is gone went to {upstream}"
            );
            (status, body)
        })
        .collect();
    assert_eq!(before, after, "the replica answers as the writer did");
    let (status, upstream, body) = send(
        client
            .post(format!("{proxy}/api/moments"))
            .header("X-Spark-Shard", "a")
            .json(&json!({"id": ulid_now(999), "text": "shard a is down"})),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(
        !upstream.contains(&addr(&shards[1].0.base))
            && !upstream.contains(&addr(&shards[1].1.base)),
        "a write of shard a reached shard b: {upstream}"
    );
    let (status, upstream, body) = send(
        client
            .post(format!("{proxy}/api/moments"))
            .header("X-Spark-Shard", "b")
            .json(&json!({"id": ulid_now(1000), "text": "shard b goes on"})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(upstream, addr(&shards[1].0.base));
    // The event stream through the proxy, from a replica.
    let r = client
        .get(format!("{proxy}/api/events?after=0"))
        .header("X-Spark-Shard", "a")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut first = String::new();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(r).lines();
    while !first.starts_with("id:") {
        first = lines.next().unwrap().unwrap();
    }
    // The first op's cursor: seq 1, a dot, 16 hex digits of the chain.
    let cursor = first
        .trim()
        .strip_prefix("id:1.")
        .unwrap_or_else(|| panic!("{first}"));
    assert!(
        cursor.len() == 16 && cursor.bytes().all(|b| b.is_ascii_hexdigit()),
        "{first}"
    );
    drop(weed);
}
