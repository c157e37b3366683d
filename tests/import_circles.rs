//! No import circles between the files of any crate of the workspace: a
//! file that imports another of its crate (a `crate::` or `super::` path
//! outside a comment) must not be imported back, directly or through
//! others, so each module sits on the ones below it.
//!
//! A path names the file of its longest module prefix (`crate::a::b::C`:
//! `a/b.rs` or `a/b/mod.rs`, else `a.rs` or `a/mod.rs`); the crate root
//! (`lib.rs`, `main.rs`) is left out, since it only declares and
//! re-exports. A `super::` path in a `mod.rs` or the root is taken as an
//! inline module (tests) looking at its own file, and a file's test module
//! (`#[cfg(test)]` then `mod`, at the end of the file) is left out: it
//! imports its own file with `super::*`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked (each one's `src`), relative to the workspace root.
const CRATES: [&str; 6] = [
    "src",
    "archive/src",
    "client/src",
    "core/src",
    "log-format/src",
    "replay-tools/src",
];

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in CRATES {
        let src = here.join(dir);
        let graph = import_graph(&src);
        assert!(graph.len() > 1, "{}: no source files found", src.display());
        for circle in circles(&graph) {
            let names: Vec<String> = circle
                .iter()
                .map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string())
                .collect();
            found.push(format!("{}: {}", src.display(), names.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The test finds a circle when there is one (so a pass means something).
#[test]
fn a_circle_is_found() {
    let dir = std::env::temp_dir().join(format!("import-circles-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("m")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod m;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::m::b::B;\npub struct A;\n").unwrap();
    std::fs::write(dir.join("m/mod.rs"), "pub mod b;\n").unwrap();
    std::fs::write(
        dir.join("m/b.rs"),
        "// crate::nothing\npub struct B(crate::a::A);\n",
    )
    .unwrap();
    let graph = import_graph(&dir);
    let found = circles(&graph);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, vec![vec![dir.join("a.rs"), dir.join("m/b.rs")]]);
}

/// A file's test module may import what imports the file: it is not part
/// of the module graph the crate is built from.
#[test]
fn a_test_module_is_left_out() {
    let dir = std::env::temp_dir().join(format!("import-circles-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::B;\npub struct A(B);\n").unwrap();
    std::fs::write(
        dir.join("b.rs"),
        "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
    )
    .unwrap();
    let found = circles(&import_graph(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(found.is_empty(), "{found:?}");
}

/// Every `.rs` file under `src` with the files it imports.
fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    walk(src, &mut files);
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let own = module_path(src, file);
            let is_root_or_mod = own.is_empty() || file.ends_with("mod.rs");
            let mut imports = BTreeSet::new();
            let lines: Vec<&str> = text.lines().collect();
            // The file's own test module, where it starts.
            let tests_at = lines
                .windows(2)
                .position(|w| {
                    w[0].trim() == "#[cfg(test)]"
                        && (w[1].trim_start().starts_with("mod ")
                            || w[1].trim_start().starts_with("pub(crate) mod "))
                })
                .unwrap_or(lines.len());
            for line in lines[..tests_at]
                .iter()
                .filter(|l| !l.trim_start().starts_with("//"))
            {
                for (anchor, path) in paths_in(line) {
                    let full = match anchor {
                        "crate" => path,
                        _ if is_root_or_mod => continue,
                        _ => own[..own.len() - 1].iter().cloned().chain(path).collect(),
                    };
                    if let Some(target) = module_file(src, &full) {
                        if &target != file {
                            imports.insert(target);
                        }
                    }
                }
            }
            (file.clone(), imports)
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of `file` (`a/b.rs` and `a/b/mod.rs`: `[a, b]`; the
/// root: empty).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
        parts.pop();
    }
    parts
}

/// The file of the longest prefix of `path` that is a module, other than
/// the crate root.
fn module_file(src: &Path, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base: PathBuf = path[..n].iter().collect();
        let base = src.join(base);
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|f| f.is_file())
    })
}

/// The `crate::...` and `super::...` paths in a line, with their anchor;
/// `crate::{a::X, b::Y}` gives one path per item.
fn paths_in(line: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for anchor in ["crate", "super"] {
        let needle = format!("{anchor}::");
        let mut from = 0;
        while let Some(at) = line[from..].find(&needle).map(|i| from + i) {
            from = at + needle.len();
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &line[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    out.push((anchor, segments(item.trim())));
                }
            } else {
                out.push((anchor, segments(rest)));
            }
        }
    }
    out
}

/// The leading `a::b::c` of `text`, as segments.
fn segments(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        parts.push(rest[..end].to_owned());
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    parts
}

/// The strongly connected groups of more than one file (Tarjan), each
/// sorted, in the order found.
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a Path, usize>,
        low: BTreeMap<&'a Path, usize>,
        stack: Vec<&'a Path>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Path) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            let graph = self.graph;
            for w in graph.get(v).into_iter().flatten() {
                let w = w.as_path();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|f| *f == v).unwrap();
                let mut group: Vec<PathBuf> =
                    self.stack.drain(at..).map(Path::to_path_buf).collect();
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_path()) {
            walk.visit(v);
        }
    }
    walk.found
}
