//! Running `tesseract` under supervision: found on `PATH` or configured,
//! fed the photo through a temporary file, its output capped, killed (and
//! reaped) when over time or when the caller gives up.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::reading::{normalise_whitespace, snippet};

/// The most bytes of `tesseract` output read (1 MiB); the rest is ignored.
const MAX_OCR_OUTPUT_BYTES: u64 = 1 << 20;

/// Runs `program <file> stdout [-l lang]` on the photo's bytes (written to
/// a temporary file named after `content_type`) for at most `timeout`, and
/// returns what it printed, or why it failed (a sentence for the reading).
pub(super) async fn run_ocr(
    program: &Path,
    ocr_lang: Option<&str>,
    timeout: Duration,
    bytes: &[u8],
    content_type: Option<&str>,
) -> Result<String, String> {
    let file = TempImage::write(bytes, content_type)
        .await
        .map_err(|e| format!("could not write the photo for OCR: {e}"))?;
    let mut command = Command::new(program);
    command
        .arg(file.path())
        .arg("stdout")
        .env("OMP_THREAD_LIMIT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(lang) = ocr_lang.filter(|l| !l.is_empty()) {
        command.arg("-l").arg(lang);
    }
    let output = run_with_timeout(command, timeout).await?;
    drop(file);
    if !output.success {
        let err = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "OCR failed ({}): {}",
            output.status,
            snippet(&normalise_whitespace(&err), 200)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The outcome of a finished child process.
struct Finished {
    success: bool,
    status: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Kills (and reaps) the child if the future running it is dropped early,
/// e.g. by the engine's timeout.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                std::thread::spawn(move || {
                    let _ = child.wait();
                });
            }
        }
    }
}

/// Spawns the command, collects its output and waits at most `timeout`;
/// kills it when over time.
async fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<Finished, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut guard = ChildGuard(Some(child));
    let read_out = tokio::task::spawn_blocking(move || read_all(stdout));
    let read_err = tokio::task::spawn_blocking(move || read_all(stderr));

    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    let status = loop {
        let Some(child) = guard.0.as_mut() else {
            return Err("OCR process vanished".into());
        };
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("could not wait for {program}: {e}")),
        }
        if started.elapsed() >= timeout {
            drop(guard); // kills it
            return Err(format!(
                "OCR timed out after {} ms and was stopped",
                timeout.as_millis()
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    guard.0 = None;
    let stdout = read_out.await.unwrap_or_default();
    let stderr = read_err.await.unwrap_or_default();
    Ok(Finished {
        success: status.success(),
        status: status.to_string(),
        stdout,
        stderr,
    })
}

fn read_all<R: Read>(pipe: Option<R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(pipe) = pipe {
        let _ = pipe.take(MAX_OCR_OUTPUT_BYTES).read_to_end(&mut buf);
    }
    buf
}

/// A uniquely named file in the temp directory, removed on drop.
struct TempImage(PathBuf);

impl TempImage {
    async fn write(bytes: &[u8], content_type: Option<&str>) -> std::io::Result<TempImage> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let ext = match content_type.map(|c| c.trim().to_ascii_lowercase()) {
            Some(c) if c.starts_with("image/png") => "png",
            Some(c) if c.starts_with("image/jpeg") || c.starts_with("image/jpg") => "jpg",
            Some(c) if c.starts_with("image/webp") => "webp",
            Some(c) if c.starts_with("image/gif") => "gif",
            Some(c) if c.starts_with("image/tiff") => "tif",
            _ => "img",
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "spark-ocr-{}-{}-{nanos}.{ext}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        let image = TempImage(path);
        tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await?;
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        Ok(image)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Finds an executable file called `name` in the directories of `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for candidate in [dir.join(name), dir.join(format!("{name}.exe"))] {
            if is_executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}
