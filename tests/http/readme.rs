//! The walk-throughs work word for word: README.md's "Try it" and the
//! walk-throughs of `docs/` ([`SECTIONS`]) run in bash against a fresh
//! server, and what each command prints must match the output the file
//! shows under it.
//!
//! Each section in [`SECTIONS`] runs in a bash session of its own, in a fresh
//! temporary directory, against its own server on an ephemeral port. The
//! section's ```` ```sh ```` blocks are split into steps: a command (with its
//! `\` continuation lines), then the `# ` comment lines right under it, which
//! are the output it must print (a bare `#` is an empty line). In those lines
//! `...` stands for any text within a line, and a line of only `...` for any
//! number of lines. Every step must exit 0, so a step that shows no output
//! is still checked.
//!
//! What the test changes, and nothing else: `:8080` becomes the ephemeral
//! port (and `SPARK_LISTEN` says it to the server); `cargo` is a stand-in on
//! `PATH` that maps `cargo run --release [-p spark-replay-tools] -- ARGS` to
//! the binaries this test run built, and `cargo build --release` to nothing;
//! `./target/release/` in the temporary directory links to those binaries;
//! `tests/fixtures/` is copied there.
//!
//! Needs `bash`, `curl`, `python3` and `sha256sum` (for the message id and the
//! upload's digest); without one it prints that it skipped and why, unless
//! `SPARK_REQUIRE_README=1` (`.ci/run` sets it), which makes it fail. It also
//! needs `spark-replay` and `spark-client` beside `spark-engine` in the target directory, which
//! `cargo test --workspace` builds.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// The walk-throughs whose shell blocks run, each as one session: a file
/// of the repository, and the heading of the section of it that runs (up
/// to the next `## ` heading), or `None` for the whole file.
const SECTIONS: [(&str, Option<&str>); 4] = [
    ("README.md", Some("## Try it")),
    ("docs/walkthrough.md", None),
    ("docs/operations.md", None),
    ("docs/client.md", None),
];

/// The longest one section's session may take before the test fails.
const SESSION_TIMEOUT: Duration = Duration::from_secs(180);

/// The environment variable that makes a missing program a failure.
const REQUIRE_VAR: &str = "SPARK_REQUIRE_README";

/// One command of a walk-through and the output the file shows for it.
#[derive(Debug)]
struct Step {
    /// The file's line the command starts on (1-based), for messages.
    line: usize,
    /// The command, continuation lines included.
    command: String,
    /// The shown output, one pattern per line (`...` as described above).
    expected: Vec<String>,
}

/// The steps of every ```` ```sh ```` block of `text` (the file `file`):
/// of the section that starts with the heading line `heading`, up to the
/// next `## ` heading, or of the whole text when `heading` is `None`.
fn section_steps(file: &str, text: &str, heading: Option<&str>) -> Vec<Step> {
    let lines: Vec<&str> = text.lines().collect();
    let (first, end) = match heading {
        Some(heading) => {
            let start = lines
                .iter()
                .position(|l| *l == heading)
                .unwrap_or_else(|| panic!("{file} has no section {heading:?}"));
            let end = lines[start + 1..]
                .iter()
                .position(|l| l.starts_with("## "))
                .map_or(lines.len(), |i| start + 1 + i);
            (start + 1, end)
        }
        None => (0, lines.len()),
    };
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut continued = false;
    for (i, line) in lines.iter().enumerate().take(end).skip(first) {
        if !in_block {
            in_block = *line == "```sh";
            continue;
        }
        if *line == "```" {
            in_block = false;
            continue;
        }
        if continued {
            let step = steps.last_mut().expect("a continued step");
            step.command.push('\n');
            step.command.push_str(line);
        } else if *line == "#" || line.starts_with("# ") {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("{file} line {}: output before any command", i + 1));
            step.expected.push(line.get(2..).unwrap_or("").to_owned());
            continue;
        } else if !line.trim().is_empty() {
            steps.push(Step {
                line: i + 1,
                command: (*line).to_owned(),
                expected: Vec::new(),
            });
        }
        continued = line.ends_with('\\');
    }
    assert!(!steps.is_empty(), "{file} ({heading:?}) has no shell steps");
    steps
}

/// Whether `text` matches `pattern`, where `...` matches any text.
fn line_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split("...");
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether the output lines match the patterns, a `...` line matching any
/// number of lines.
fn lines_match(patterns: &[String], lines: &[&str]) -> bool {
    match patterns.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => {
            (0..=lines.len()).any(|skip| lines_match(rest, &lines[skip..]))
        }
        Some((p, rest)) => {
            !lines.is_empty() && line_matches(p, lines[0]) && lines_match(rest, &lines[1..])
        }
    }
}

/// `None` when `program` is on `PATH`, else why the test cannot run.
fn missing_program(program: &str) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| dir.join(program).is_file());
    (!found).then(|| format!("`{program}` is not installed (the walk-throughs use it)"))
}

/// A TCP port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().unwrap().port()
}

/// The stand-in for `cargo` on the session's `PATH` (see the module doc).
fn cargo_stand_in(engine: &Path, replay: &Path) -> String {
    format!(
        r#"#!/usr/bin/env bash
# The README test's stand-in for cargo: the binaries are already built.
case "$*" in
  "build --release"|"build --release -p "*) exit 0 ;;
  "run --release -p spark-replay-tools -- "*) shift 5; exec '{replay}' "$@" ;;
  "run --release") exec '{engine}' ;;
  "run --release -- "*) shift 3; exec '{engine}' "$@" ;;
  *) echo "README test: cargo $* is not a command the walk-through may use" >&2; exit 99 ;;
esac
"#,
        replay = replay.display(),
        engine = engine.display(),
    )
}

/// Runs one section's steps in a bash session in a fresh directory and
/// returns what went wrong, if anything.
/// `place` names the walk-through in messages (its file, and section).
fn run_section(place: &str, steps: &[Step], engine: &Path, replay: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(root.join("tests/fixtures")).unwrap();
    std::fs::create_dir_all(root.join("target/release")).unwrap();
    std::fs::create_dir_all(root.join(".readme/bin")).unwrap();
    for entry in std::fs::read_dir(manifest.join("tests/fixtures")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            root.join("tests/fixtures").join(entry.file_name()),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(engine, root.join("target/release/spark-engine")).unwrap();
    std::os::unix::fs::symlink(replay, root.join("target/release/spark-replay")).unwrap();
    let client = replay.with_file_name("spark-client");
    std::os::unix::fs::symlink(client, root.join("target/release/spark-client")).unwrap();
    let cargo = root.join(".readme/bin/cargo");
    std::fs::write(&cargo, cargo_stand_in(engine, replay)).unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let port = free_port();
    let mut script = String::from("cd \"$(dirname \"$0\")/..\"\n");
    for (i, step) in steps.iter().enumerate() {
        let command = step.command.replace(":8080", &format!(":{port}"));
        script.push_str(&format!(
            "{{\n{command}\n}} >.readme/out.{i} 2>.readme/err.{i} </dev/null\necho $? >.readme/status.{i}\n"
        ));
    }
    std::fs::write(root.join(".readme/session.sh"), script).unwrap();

    let path = format!(
        "{}:{}",
        root.join(".readme/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .arg(root.join(".readme/session.sh"))
        .current_dir(root)
        .env("PATH", path)
        .env("SPARK_LISTEN", format!("127.0.0.1:{port}"))
        .env_remove("SPARK_DATA")
        .env_remove("SPARK_CONFIG")
        .env_remove("SPARK_SERVER")
        .env_remove("SPARK_OUTBOX")
        .env_remove("SPARK_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash starts");
    let started = Instant::now();
    let finished = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > SESSION_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The session's servers run in its process group: end them all.
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let mut session_err = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut session_err);
    }

    let read = |name: String| std::fs::read_to_string(root.join(".readme").join(name)).ok();
    for (i, step) in steps.iter().enumerate() {
        let place = format!("{place} line {}", step.line);
        let Some(status) = read(format!("status.{i}")) else {
            return Err(match finished {
                None => format!(
                    "{place}: did not finish within {SESSION_TIMEOUT:?}:\n{}",
                    step.command
                ),
                Some(_) => format!("{place}: never ran; the session ended early: {session_err}"),
            });
        };
        let out = read(format!("out.{i}")).unwrap_or_default();
        let err = read(format!("err.{i}")).unwrap_or_default();
        if status.trim() != "0" {
            return Err(format!(
                "{place}: exit status {}:\n{}\nstdout:\n{out}\nstderr:\n{err}",
                status.trim(),
                step.command
            ));
        }
        if step.expected.is_empty() {
            continue;
        }
        let port_text = format!(":{port}");
        let expected: Vec<String> = step
            .expected
            .iter()
            .map(|line| line.replace(":8080", &port_text))
            .collect();
        let printed: Vec<&str> = out.lines().map(|l| l.trim_end_matches('\r')).collect();
        if !lines_match(&expected, &printed) {
            return Err(format!(
                "{place}: the output differs from the file's.\ncommand:\n{}\nthe file shows:\n{}\nprinted:\n{}\nstderr:\n{err}",
                step.command,
                expected.join("\n"),
                printed.join("\n")
            ));
        }
    }
    Ok(())
}

#[test]
fn the_readme_walk_through_runs_as_shown() {
    let test = "readme::the_readme_walk_through_runs_as_shown";
    let engine = PathBuf::from(env!("CARGO_BIN_EXE_spark-engine"));
    let replay = engine.with_file_name("spark-replay");
    let missing = ["bash", "curl", "python3", "sha256sum"]
        .into_iter()
        .find_map(missing_program)
        .or_else(|| {
            [replay.clone(), engine.with_file_name("spark-client")]
                .into_iter()
                .find(|built| !built.is_file())
                .map(|absent| {
                    format!(
                        "{} is not built (`cargo test --workspace` builds it)",
                        absent.display()
                    )
                })
        });
    if !common::run_or_skip(test, missing, REQUIRE_VAR) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let failures: Vec<String> = SECTIONS
        .iter()
        .filter_map(|(file, heading)| {
            let text = std::fs::read_to_string(root.join(file))
                .unwrap_or_else(|e| panic!("{file} reads: {e}"));
            let steps = section_steps(file, &text, *heading);
            let place = match heading {
                Some(heading) => format!("{file} ({heading})"),
                None => (*file).to_owned(),
            };
            run_section(&place, &steps, &engine, &replay).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_output_patterns_match_as_documented() {
    let p = |s: &[&str]| s.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    assert!(line_matches("201", "201"));
    assert!(!line_matches("201", "2010"));
    assert!(line_matches(r#"{"a":1,...}"#, r#"{"a":1,"b":2}"#));
    assert!(!line_matches(r#"{"a":1,...}"#, r#"{"a":2,"b":2}"#));
    assert!(line_matches("a...b...c", "a-x-b-y-c"));
    assert!(!line_matches("a...b...c", "a-x-c-y-b"));
    assert!(!line_matches("ab...b", "ab"));
    assert!(line_matches("...", "anything"));
    assert!(lines_match(
        &p(&["HTTP/1.1 200 OK", "...", "etag: \"1\"", "..."]),
        &["HTTP/1.1 200 OK", "x: y", "etag: \"1\"", "", "{}"]
    ));
    assert!(!lines_match(&p(&["201"]), &["201", "extra"]));
    assert!(!lines_match(&p(&["a", "b"]), &["a"]));
    assert!(lines_match(&p(&["..."]), &[]));
}
