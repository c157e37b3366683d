//! A PostgreSQL server of the bench's own on loopback, for the `postgres`
//! peer: `initdb` into a temporary directory, then `postgres` on
//! 127.0.0.1 with a free port, its socket in the same directory,
//! `fsync=on` and `synchronous_commit=on`. PostgreSQL refuses to run as
//! root, so as root it runs as the `postgres` user (Debian's package makes
//! it) through `setpriv` (or `runuser`), with the directory chowned to it.
//! Stopped (fast shutdown, then SIGKILL after 20 s) when dropped, which a
//! panic's unwinding does too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running server.
pub struct Postgres {
    child: Child,
    /// Where it listens (TCP, 127.0.0.1).
    pub addr: SocketAddr,
    dir: Option<tempfile::TempDir>,
}

/// The directory of `initdb` and `postgres`: `SPARK_POSTGRES_BIN`, else
/// the newest `/usr/lib/postgresql/*/bin`, else the one of `initdb` on
/// `PATH`. `Err` says where it looked.
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("SPARK_POSTGRES_BIN") {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").is_file() {
            Ok(dir)
        } else {
            Err(format!("no initdb in SPARK_POSTGRES_BIN={}", dir.display()))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
            return Ok(dir);
        }
    }
    Err("no initdb in SPARK_POSTGRES_BIN, /usr/lib/postgresql/*/bin or PATH".into())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program args...`, as the `postgres` user when we are root.
fn as_postgres(program: &Path) -> Command {
    if !is_root() {
        return Command::new(program);
    }
    if Path::new("/usr/bin/setpriv").is_file() || which("setpriv") {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--reset-env",
        ])
        .arg(program);
        c
    } else {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    }
}

fn which(name: &str) -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join(name).is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

impl Postgres {
    /// initdb + start, under `parent` (a temp dir is made there). Waits
    /// until the server takes connections. `Err` says what failed, with
    /// the server's log.
    pub fn start(bin: &Path, parent: Option<&Path>) -> Result<Postgres, String> {
        let dir = match parent {
            Some(p) => tempfile::tempdir_in(p),
            None => tempfile::tempdir(),
        }
        .map_err(|e| format!("temp dir: {e}"))?;
        let data = dir.path().join("pgdata");
        let log = dir.path().join("postgres.log");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !status.success() {
                return Err("chown to postgres failed (no postgres user?)".into());
            }
        }
        let out = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .current_dir(dir.path())
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port();
        let log_file = std::fs::File::create(&log).map_err(|e| format!("log: {e}"))?;
        let child = as_postgres(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                "-c",
                "max_connections=64",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| format!("postgres: {e}"))?;
        let mut server = Postgres {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir: Some(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        loop {
            let ready = runtime.block_on(async {
                let mut config = tokio_postgres::Config::new();
                config
                    .host("127.0.0.1")
                    .port(port)
                    .user("postgres")
                    .dbname("postgres");
                config.connect(tokio_postgres::NoTls).await.is_ok()
            });
            if ready {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "postgres exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "postgres did not take connections within 60 s: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The postmaster's pid (setpriv execs, so it is the child's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The version line of the server (`postgres --version`).
    pub fn version(bin: &Path) -> String {
        Command::new(bin.join("postgres"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT: fast shutdown.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(self.dir.take());
    }
}
