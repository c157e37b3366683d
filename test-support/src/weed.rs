//! A SeaweedFS `weed mini` server of a test's (or a bench's) own, on
//! 127.0.0.1 ports of its own, as the S3-compatible store of the archive
//! (SPEC section 11). Used by the archive tests and benches of
//! `spark-replay-tools` ([`crate::s3`]) and by `benches/load.rs`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::ObjectStore;

/// The access key every test server accepts.
pub const KEY_ID: &str = "sparktest";
/// Its secret.
pub const SECRET: &str = "sparktest-secret";
/// The bucket every test server makes at start.
pub const BUCKET: &str = "spark";

/// A `weed mini` server: started by [`Weed::start`], killed by
/// [`Weed::stop`] (and on drop), started again on the same directory and
/// ports by [`Weed::resume`].
pub struct Weed {
    binary: PathBuf,
    dir: tempfile::TempDir,
    base_port: u16,
    child: Option<Child>,
}

/// The `weed` binary: `SPARK_WEED`, else `weed` on `PATH`.
pub fn weed_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SPARK_WEED") {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("weed"))
        .find(|path| path.is_file())
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// How many ports one server takes: http `base..base+8` (S3 at `+4`,
/// Prometheus metrics at `+7`) and grpc `base+8..base+13`.
const PORTS: u16 = 13;

/// The lowest port the kernel hands out for outgoing connections and
/// `bind(0)` (`/proc/sys/net/ipv4/ip_local_port_range`, 32768 on Linux by
/// default). Every port a server takes lies below it, so no client socket
/// of the tests can hold one of them (what made a start fail with "bind:
/// address already in use" when the grpc ports were `+10000`, in
/// 30000..39000).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A base port no other server of this process has and whose ports are
/// free now; the next pick on every call, so servers started at once by
/// parallel tests never share one.
fn pick_base_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low = 10_000u16;
    let slots = (ephemeral_low().max(low + 16 * PORTS) - low) / 16;
    let mut slot = NEXT
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_add(rand_u16())
        % slots;
    for _ in 0..slots {
        let base = low + slot * 16;
        if (0..PORTS).all(|i| port_free(base + i)) {
            NEXT.fetch_add(1, Ordering::Relaxed);
            return base;
        }
        slot = (slot + 1) % slots;
    }
    panic!(
        "no {PORTS} free ports below {} for weed mini",
        ephemeral_low()
    )
}

impl Weed {
    /// Starts a server on ports of its own (see [`PORTS`]); when another
    /// process took one of them between the pick and the bind, starts
    /// again on others (at most 5 picks).
    pub fn start(binary: PathBuf) -> Weed {
        let mut weed = Weed {
            binary,
            dir: tempfile::tempdir().unwrap(),
            base_port: pick_base_port(),
            child: None,
        };
        for _ in 0..4 {
            match weed.try_resume() {
                Ok(()) => return weed,
                Err(log) if log.contains("address already in use") => {
                    weed.stop();
                    weed.base_port = pick_base_port();
                }
                Err(log) => panic!("weed mini did not serve S3 within 120 s: {log}"),
            }
        }
        weed.resume();
        weed
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.base_port + 4)
    }

    /// The server's own Prometheus metrics (`SeaweedFS_s3_request_total`
    /// by `type` and `code`), `http://127.0.0.1:PORT/metrics`.
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.base_port + 7)
    }

    /// The server process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts (again) on the same directory and ports; waits until S3
    /// answers a signed put (at most 120 s, then panics with its log: a
    /// busy machine running several tests' servers starts it slowly).
    pub fn resume(&mut self) {
        if let Err(log) = self.try_resume() {
            panic!("weed mini did not serve S3 within 120 s: {log}");
        }
    }

    /// [`Weed::resume`], or the server's log when it exited or did not
    /// serve within 120 s.
    fn try_resume(&mut self) -> Result<(), String> {
        let p = |i: u16| (self.base_port + i).to_string();
        let log = std::fs::File::create(self.dir.path().join("weed.log")).unwrap();
        let child = Command::new(&self.binary)
            .arg("mini")
            .arg(format!("-dir={}", self.dir.path().join("data").display()))
            .args([
                "-master.telemetry=false",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            .arg(format!("-master.port={}", p(1)))
            .arg(format!("-volume.port={}", p(2)))
            .arg(format!("-filer.port={}", p(3)))
            .arg(format!("-s3.port={}", p(4)))
            .arg(format!("-admin.port={}", p(5)))
            .arg(format!("-webdav.port={}", p(6)))
            .arg(format!("-metricsPort={}", p(7)))
            .arg(format!("-master.port.grpc={}", p(8)))
            .arg(format!("-volume.port.grpc={}", p(9)))
            .arg(format!("-filer.port.grpc={}", p(10)))
            .arg(format!("-s3.port.grpc={}", p(11)))
            .arg(format!("-admin.port.grpc={}", p(12)))
            .arg(format!("-bucket={BUCKET}"))
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .current_dir(self.dir.path())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        std::fs::create_dir_all(self.dir.path().join("data")).unwrap();
        self.child = Some(child);
        // Ready once a signed put of a probe object succeeds.
        let deadline = Instant::now() + Duration::from_secs(120);
        let store = raw_store(&self.endpoint());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let log = || std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        loop {
            let ok = rt.block_on(async {
                store
                    .put(
                        &object_store::path::Path::from("probe"),
                        object_store::PutPayload::from_static(b"x"),
                    )
                    .await
                    .is_ok()
            });
            if ok {
                return Ok(());
            }
            let exited = matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                return Err(log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the server (the store is unreachable until [`Weed::resume`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A cheap random number (time and process id), for ports and prefixes.
pub fn rand_u16() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    (nanos ^ std::process::id().wrapping_mul(2_654_435_761)) as u16
}

/// A plain client of `endpoint` (overwrites allowed): the readiness probe,
/// and what the tests use to damage objects.
pub fn raw_store(endpoint: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_access_key_id(KEY_ID)
        .with_secret_access_key(SECRET)
        .build()
        .unwrap()
}
