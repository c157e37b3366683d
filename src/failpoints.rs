//! Failpoints for the durability tests: named places in every write, fsync,
//! rename, directory fsync and segment roll where a test can make the
//! engine fail on purpose (SPEC "durability").
//!
//! Compiled in only with the cargo feature `failpoints`; without it,
//! [`check`] is an empty inline function and costs nothing. With it, a test
//! arms a failpoint by name ([`arm`]), or the binary reads
//! `SPARK_FAILPOINTS=name=action[,name=action...]` at startup (actions:
//! `eio`, `enospc`, `short`, `abort`; append `*N` to fire N times, e.g.
//! `log.fsync=eio*1`).
//!
//! Names: the log's file seam (`log.write`, `log.fsync`, `log.sync_all`,
//! `log.set_len`, `log.create`, `log.dir_fsync`, `log.remove`: a segment
//! roll is `log.fsync` of the seal, then `log.create`, `log.write` and
//! `log.sync_all` of the new header, then `log.dir_fsync`), and the media
//! store's, which uses the same seam for files under `<data>/media/`
//! (`media.create`, `media.write`, `media.fsync`, `media.rename`,
//! `media.dir_fsync`, `media.remove`, and `media.before_op`, between a
//! durable blob and its `media.put`), and the checkpoint worker's, for
//! files under `<data>/checkpoint/` (`checkpoint.create`,
//! `checkpoint.write`, `checkpoint.fsync`, `checkpoint.rename`,
//! `checkpoint.dir_fsync`, `checkpoint.remove`: a checkpoint is written by
//! `Fs::write_file_durably`, create, write, fsync, rename, directory
//! fsync).

use std::io;

/// What an armed failpoint does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Fail with EIO.
    Eio,
    /// Fail with ENOSPC (no space left on device).
    Enospc,
    /// For writes: write the first half of the buffer, then fail with EIO.
    /// Elsewhere like `Eio`.
    Short,
    /// Abort the process at once, as a crash or power cut would.
    Abort,
}

impl Action {
    /// The error this action returns.
    pub fn error(self) -> io::Error {
        match self {
            Action::Enospc => io::Error::from_raw_os_error(28),
            _ => io::Error::from_raw_os_error(5),
        }
    }
}

#[cfg(feature = "failpoints")]
mod registry {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};

    use super::Action;

    /// Armed failpoints: name -> (action, times left; None = every time).
    type Armed = Mutex<HashMap<String, (Action, Option<u64>)>>;

    /// The process-wide table of armed failpoints.
    pub(super) fn armed() -> &'static Armed {
        static ARMED: OnceLock<Armed> = OnceLock::new();
        ARMED.get_or_init(|| Mutex::new(HashMap::new()))
    }

    /// The action for `name` if armed, counting one firing.
    pub(super) fn fire(name: &str) -> Option<Action> {
        let mut armed = armed().lock().unwrap_or_else(PoisonError::into_inner);
        let (action, left) = armed.get_mut(name)?;
        let action = *action;
        match left {
            Some(0) => return None,
            Some(n) => *n -= 1,
            None => {}
        }
        Some(action)
    }
}

/// Arms failpoint `name` to do `action` the next `times` times (every time
/// when `None`). Does nothing without the `failpoints` feature.
pub fn arm(name: &str, action: Action, times: Option<u64>) {
    #[cfg(feature = "failpoints")]
    {
        registry::armed()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), (action, times));
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = (name, action, times);
}

/// Whether failpoint `name` was armed for a number of times and has fired
/// them all: how a test knows that a background write (a checkpoint) met
/// it. Always `false` without the `failpoints` feature.
pub fn spent(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        registry::armed()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .is_some_and(|&(_, left)| left == Some(0))
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Disarms every failpoint.
pub fn disarm_all() {
    #[cfg(feature = "failpoints")]
    registry::armed()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
}

/// Arms the failpoints named in `spec` (`name=action[*times],...`).
/// Errors name the part that does not parse.
pub fn arm_from_spec(spec: &str) -> Result<(), String> {
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, action) = part
            .split_once('=')
            .ok_or_else(|| format!("failpoint {part:?} is not name=action"))?;
        let (action, times) = match action.split_once('*') {
            Some((a, n)) => (
                a,
                Some(
                    n.parse::<u64>()
                        .map_err(|_| format!("bad count in {part:?}"))?,
                ),
            ),
            None => (action, None),
        };
        let action = match action {
            "eio" => Action::Eio,
            "enospc" => Action::Enospc,
            "short" => Action::Short,
            "abort" => Action::Abort,
            other => return Err(format!("unknown failpoint action {other:?} in {part:?}")),
        };
        arm(name, action, times);
    }
    Ok(())
}

/// The action armed at `name`, if any (always `None` without the feature).
/// `Abort` never returns: the process ends here.
#[inline(always)]
pub fn fire(name: &str) -> Option<Action> {
    #[cfg(feature = "failpoints")]
    {
        let action = registry::fire(name)?;
        if action == Action::Abort {
            eprintln!("failpoint {name}: abort");
            std::process::abort();
        }
        Some(action)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        None
    }
}

/// `Err` when failpoint `name` is armed (see [`fire`]).
#[inline(always)]
pub fn check(name: &str) -> io::Result<()> {
    match fire(name) {
        None => Ok(()),
        Some(action) => Err(action.error()),
    }
}

#[cfg(feature = "failpoints")]
pub use seam::FailpointFs;

#[cfg(feature = "failpoints")]
mod seam {
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use spark_log_format::{Fs, LogFile};

    use super::{check, fire, Action};

    /// The file seam with a failpoint in front of every operation, over
    /// another [`Fs`]: names `media.*` for the media store's files and
    /// directories (under `<data>/media/`, see [`is_media`]),
    /// `checkpoint.*` for the checkpoint directory and its files (see
    /// [`is_checkpoint`]), `log.*` for the rest.
    pub struct FailpointFs(pub Arc<dyn Fs>);

    /// Whether `path` is the media store's: `media/`, `media/tmp/`,
    /// `media/blobs/`, or a file directly in one of the last two.
    fn is_media(path: &Path) -> bool {
        let names: Vec<&std::ffi::OsStr> = path
            .components()
            .rev()
            .take(3)
            .map(|c| c.as_os_str())
            .collect();
        let store = |i: usize| names.get(i).is_some_and(|n| *n == "media");
        let area = |i: usize| names.get(i).is_some_and(|n| *n == "tmp" || *n == "blobs");
        store(0) || (area(0) && store(1)) || (area(1) && store(2))
    }

    /// Whether `path` is the checkpoint directory `checkpoint/` or a file
    /// directly in it.
    fn is_checkpoint(path: &Path) -> bool {
        let is = |p: Option<&Path>| {
            p.and_then(Path::file_name)
                .is_some_and(|n| n == "checkpoint")
        };
        is(Some(path)) || is(path.parent())
    }

    /// The area of `path`, the first part of its failpoint names.
    fn area(path: &Path) -> &'static str {
        if is_media(path) {
            "media"
        } else if is_checkpoint(path) {
            "checkpoint"
        } else {
            "log"
        }
    }

    /// The failpoint name of operation `op` on `path`.
    fn name(path: &Path, op: &str) -> String {
        format!("{}.{op}", area(path))
    }

    /// A file opened through [`FailpointFs`], with the area it lives in.
    struct File {
        inner: Box<dyn LogFile>,
        area: &'static str,
    }

    impl File {
        /// The failpoint name of `op` on this file: `log.<op>`, or
        /// `<area>.<other_op>` for a media or checkpoint file (whose
        /// `sync_all` is named `fsync`).
        fn name(&self, op: &str, other_op: &str) -> String {
            match self.area {
                "log" => format!("log.{op}"),
                area => format!("{area}.{other_op}"),
            }
        }
    }

    impl Fs for FailpointFs {
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.0.create_dir_all(path)
        }
        fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
            self.0.list(dir)
        }
        fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
            Ok(Box::new(File {
                inner: self.0.open_rw(path)?,
                area: area(path),
            }))
        }
        fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
            check(&name(path, "create"))?;
            Ok(Box::new(File {
                inner: self.0.create_new(path)?,
                area: area(path),
            }))
        }
        fn create_new_mode(&self, path: &Path, mode: u32) -> io::Result<Box<dyn LogFile>> {
            check(&name(path, "create"))?;
            Ok(Box::new(File {
                inner: self.0.create_new_mode(path, mode)?,
                area: area(path),
            }))
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            check(&name(path, "remove"))?;
            self.0.remove_file(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            check(&name(to, "rename"))?;
            self.0.rename(from, to)
        }
        fn modified(&self, path: &Path) -> io::Result<std::time::SystemTime> {
            self.0.modified(path)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            check(&name(dir, "dir_fsync"))?;
            self.0.sync_dir(dir)
        }
        fn map(&self, path: &Path) -> io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
            self.0.map(path)
        }
    }

    impl LogFile for File {
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
            match fire(&self.name("write", "write")) {
                None => self.inner.write_all_at(offset, buf),
                Some(Action::Short) => {
                    self.inner.write_all_at(offset, &buf[..buf.len() / 2])?;
                    Err(Action::Short.error())
                }
                Some(action) => Err(action.error()),
            }
        }
        fn sync_data(&mut self) -> io::Result<()> {
            check(&self.name("fsync", "fsync"))?;
            self.inner.sync_data()
        }
        fn sync_all(&mut self) -> io::Result<()> {
            check(&self.name("sync_all", "fsync"))?;
            self.inner.sync_all()
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            check(&self.name("set_len", "set_len"))?;
            self.inner.set_len(len)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{area, is_media};
        use std::path::Path;

        #[test]
        fn media_paths_are_told_from_log_paths() {
            for media in [
                "/d/media",
                "/d/media/tmp",
                "/d/media/blobs",
                "/d/media/tmp/upload-1",
                "/d/media/blobs/ab12",
            ] {
                assert!(is_media(Path::new(media)), "{media}");
            }
            for log in [
                "/d/log",
                "/d/log/00000000000000000001.seg",
                "/d",
                "/media/x/y",
            ] {
                assert!(!is_media(Path::new(log)), "{log}");
            }
        }

        #[test]
        fn checkpoint_paths_have_their_own_area() {
            for (path, want) in [
                ("/d/checkpoint", "checkpoint"),
                ("/d/checkpoint/00000000000000000042.ckpt", "checkpoint"),
                ("/d/checkpoint/00000000000000000042.ckpt.tmp", "checkpoint"),
                ("/d", "log"),
                ("/d/log/00000000000000000001.seg", "log"),
                ("/d/media/blobs/ab12", "media"),
            ] {
                assert_eq!(area(Path::new(path)), want, "{path}");
            }
        }
    }
}
