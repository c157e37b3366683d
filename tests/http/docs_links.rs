//! Every relative link of the repository's Markdown files leads somewhere:
//! the file (or directory) it names exists, and an anchor (`#a-full-disk`)
//! is the slug of a heading of that file, as GitHub makes them. README.md
//! points a newcomer into `docs/`; a link that breaks when a section moves
//! fails here, in `cargo test --workspace` (and so in CI).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The Markdown files to check: every `*.md` under the repository's root,
/// except build output and installed packages.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    const SKIPPED: [&str; 5] = ["target", "node_modules", ".git", "dist", "out"];
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !SKIPPED.contains(&name.as_str()) {
                    pending.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_code = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            !in_code
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, characters other than
/// letters, digits, blanks, `-` and `_` dropped, blanks made `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings (a repeated heading gets `-1`, `-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links of `text` (`[text](target)`), outside
/// code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Code spans may hold `](`; drop them first.
        let mut prose = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                prose.push_str(part);
            }
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// Why `target`, a link in `file`, leads nowhere; `None` when it leads
/// somewhere (or is not a relative link).
fn broken(root: &Path, file: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let linked = if path.is_empty() {
        file.to_owned()
    } else {
        file.parent().unwrap().join(path)
    };
    if !linked.exists() {
        return Some(format!("{} does not exist", linked.display()));
    }
    if !linked.starts_with(root) && !linked.canonicalize().is_ok_and(|p| p.starts_with(root)) {
        return Some(format!("{} is outside the repository", linked.display()));
    }
    let anchor = anchor?;
    let text = std::fs::read_to_string(&linked).ok()?;
    (!anchors(&text).contains(anchor)).then(|| {
        format!(
            "{} has no heading whose anchor is #{anchor}",
            linked.display()
        )
    })
}

#[test]
fn every_relative_link_of_the_docs_leads_somewhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("docs/walkthrough.md")),
        "{files:?}"
    );
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            checked += 1;
            if let Some(why) = broken(root, file, &target) {
                failures.push(format!(
                    "{}: ({target}): {why}",
                    file.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(checked >= 20, "only {checked} links found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_link_checker_finds_what_is_broken() {
    let text = "# A full disk\n\n## Two `words`, and more\n\n```sh\n# not a heading\n```\n";
    let found = anchors(text);
    assert!(found.contains("a-full-disk"), "{found:?}");
    assert!(found.contains("two-words-and-more"), "{found:?}");
    assert!(!found.contains("not-a-heading"), "{found:?}");
    let links = link_targets("see [a](docs/x.md#y) and `[b](no)`\n```\n[c](no)\n```\n");
    assert_eq!(links, ["docs/x.md#y"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = root.join("README.md");
    assert!(broken(root, &readme, "docs/walkthrough.md").is_none());
    assert!(broken(root, &readme, "docs/no-such-file.md").is_some());
    assert!(broken(root, &readme, "docs/operations.md#a-full-disk").is_none());
    assert!(broken(root, &readme, "docs/operations.md#no-such-heading").is_some());
    assert!(broken(root, &readme, "https://example.com/x").is_none());
}
