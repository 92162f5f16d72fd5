//! The shape of the code, checked: no crate's modules may depend on each other in a cycle.
//!
//! Each crate's top-level modules (a file `src/x.rs` or a folder `src/x/`) are the nodes; an
//! edge a → b is any path `crate::b…` written in a's files outside their `#[cfg(test)]`
//! modules, where a name the crate root re-exports (`pub use b::Name`) counts as b. Data
//! should flow one way through a crate, so any strongly connected set of two or more modules
//! fails the test, with the cycle spelled out; the same holds inside every folder module, among
//! its files and subfolders. No source file (Rust or Python, library or
//! test) is over [`MAX_LINES`] lines. And the wire sits below the library: the protocol crate
//! needs only `mdl-format` and serde, and the HTTP client none of the library, codec, store or
//! GPU crates. Imports are explicit and every crate keeps the workspace lints.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose modules are checked, relative to the workspace root: every member of the
/// workspace, so a new crate is checked from its first commit.
fn crates(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let start = manifest
        .find("members = [")
        .expect("the workspace lists its members");
    let list = &manifest[start..];
    let list = &list[..list.find(']').unwrap()];
    let members: Vec<String> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(members.len() >= 12, "only {members:?} found in Cargo.toml");
    members
}

/// Each workspace crate's name and the names of its `[dependencies]` (dev-dependencies apart).
fn dependencies(root: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for member in crates(root) {
        let manifest = std::fs::read_to_string(root.join(&member).join("Cargo.toml")).unwrap();
        let mut name = None;
        let mut deps = Vec::new();
        let mut section = "";
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
            } else if let Some((key, value)) = line.split_once('=') {
                let key = key.trim().trim_end_matches(".workspace").to_string();
                match section {
                    "[package]" if key == "name" => {
                        name = Some(value.trim().trim_matches('"').to_string())
                    }
                    "[dependencies]" => deps.push(key),
                    _ => {}
                }
            }
        }
        out.insert(name.expect("every member has a name"), deps);
    }
    out
}

/// Every workspace crate `name` depends on, directly or not.
fn reaches(deps: &BTreeMap<String, Vec<String>>, name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        for d in deps.get(&n).into_iter().flatten() {
            if deps.contains_key(d) && seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_wire_sits_below_the_library() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let deps = dependencies(&root);
    let protocol: BTreeSet<&str> = deps["mdl-protocol"].iter().map(String::as_str).collect();
    assert_eq!(
        protocol,
        BTreeSet::from(["mdl-format", "serde"]),
        "mdl-protocol may depend on mdl-format and serde only"
    );
    let client = reaches(&deps, "mdl-client");
    for heavy in ["mdl", "mdl-codec", "mdl-store", "mdl-gpu"] {
        assert!(
            !client.contains(heavy),
            "mdl-client reaches {heavy}: speaking to a server must not need it"
        );
    }
    assert!(
        reaches(&deps, "mdl").contains("mdl-protocol"),
        "the library builds the protocol's types"
    );
}

/// Names are imported from where they are made: no module outside the tests takes its
/// parent's names wholesale (`use super::*`), so a file's imports say what it depends on. And
/// every crate keeps the workspace's lints, `unreachable_pub` among them, so `pub` means
/// "part of the crate's API" (the CI's clippy run denies warnings).
#[test]
fn imports_are_explicit_and_every_crate_keeps_the_lints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        workspace.contains("\nunreachable_pub = \"warn\"\n"),
        "the workspace lints must include unreachable_pub"
    );
    let mut problems = Vec::new();
    let mut files = 0;
    for krate in crates(&root) {
        let manifest = std::fs::read_to_string(root.join(&krate).join("Cargo.toml")).unwrap();
        if !manifest.contains("[lints]\nworkspace = true") {
            problems.push(format!("{krate}/Cargo.toml: no [lints] workspace = true"));
        }
        for file in rust_files(&root.join(&krate).join("src")) {
            files += 1;
            let is_tests = file.file_stem().is_some_and(|s| s == "tests");
            let code = code_of(&std::fs::read_to_string(&file).unwrap());
            if !is_tests && code.contains("use super::*") {
                let shown = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                problems.push(format!("{shown}: use super::* outside a test module"));
            }
        }
    }
    assert!(files > 100, "only {files} Rust files found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The most lines a source file may have: past it, a file holds more than one thing.
const MAX_LINES: usize = 800;

/// The folders whose `.rs` and `.py` files are held to [`MAX_LINES`], and folders inside them.
const SOURCES: &[&str] = &["crates", "server", "cli", "python", "tests"];

#[test]
fn no_source_file_is_over_the_line_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = SOURCES.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                // Build output and virtual environments are not sources.
                if !name.starts_with('.') && name != "target" && name != "__pycache__" {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            let shown = f.strip_prefix(&root).unwrap_or(f).display().to_string();
            (lines > MAX_LINES).then(|| format!("{shown}: {lines} lines"))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    let mut edges = 0;
    for krate in crates(&root) {
        let graph = module_graph(&root.join(&krate).join("src"));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        for cycle in cycles(&graph) {
            problems.push(format!("{krate}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        edges > 50,
        "only {edges} dependencies between modules found: is the checker blind?"
    );
    assert!(
        problems.is_empty(),
        "module cycles:\n{}",
        problems.join("\n")
    );
}

/// Inside every folder module too: its files and subfolders may not name each other in a
/// cycle (`super::x`, `crate::folder::x`), so a folder is not one module spread over files.
#[test]
fn no_folder_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    let mut folders = 0;
    for krate in crates(&root) {
        for (folder, graph) in folder_graphs(&root.join(&krate).join("src")) {
            folders += 1;
            for cycle in cycles(&graph) {
                problems.push(format!("{krate} {folder}: {}", cycle.join(" -> ")));
            }
        }
    }
    assert!(folders > 10, "only {folders} folder modules found");
    assert!(
        problems.is_empty(),
        "module cycles inside folders:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_a_cycle_inside_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod f;\n").unwrap();
    std::fs::create_dir_all(src.join("f/c")).unwrap();
    std::fs::write(src.join("f/mod.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("f/a.rs"), "use super::b::thing;\n").unwrap();
    std::fs::write(src.join("f/c/mod.rs"), "mod d;\n").unwrap();
    std::fs::write(src.join("f/c/d.rs"), "use super::super::a::x;\n").unwrap();
    std::fs::write(src.join("f/b.rs"), "fn g() { crate::f::c::h() }\n").unwrap();
    let graphs = folder_graphs(src);
    let f = &graphs.iter().find(|(name, _)| name == "f").unwrap().1;
    assert_eq!(cycles(f), vec![vec!["a", "b", "c", "a"]]);
    std::fs::write(src.join("f/c/d.rs"), "use super::super::other;\n").unwrap();
    let graphs = folder_graphs(src);
    assert!(graphs.iter().all(|(_, g)| cycles(g).is_empty()));
}

/// Each folder module (by its path, `a::b`) with the graph of its children: files and
/// subfolders → the siblings they name.
fn folder_graphs(src: &Path) -> Vec<(String, Graph)> {
    let mut out = Vec::new();
    let mut todo: Vec<(PathBuf, Vec<String>)> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (p, vec![name])
        })
        .collect();
    while let Some((dir, folder)) = todo.pop() {
        // Each child with its files, each file with its module path.
        let mut children: BTreeMap<String, Vec<(PathBuf, Vec<String>)>> = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let mut module = folder.clone();
            module.push(name.clone());
            if path.is_dir() {
                children
                    .entry(name)
                    .or_default()
                    .extend(module_files(&path, &module));
                todo.push((path, module));
            } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
                children.entry(name).or_default().push((path, module));
            }
        }
        let mut graph = Graph::new();
        for (child, files) in &children {
            let edges = graph.entry(child.clone()).or_default();
            for (file, module) in files {
                let code = code_of(&std::fs::read_to_string(file).unwrap());
                let mut named = crate_paths(&code, "crate::");
                for path in crate_paths(&code, "super::") {
                    let up = 1 + path.iter().take_while(|s| *s == "super").count();
                    let Some(keep) = module.len().checked_sub(up) else {
                        continue;
                    };
                    let mut absolute = module[..keep].to_vec();
                    absolute.extend(path.into_iter().skip(up - 1));
                    named.push(absolute);
                }
                for path in named {
                    if path.len() > folder.len() && path[..folder.len()] == folder[..] {
                        let sibling = &path[folder.len()];
                        if sibling != child && children.contains_key(sibling) {
                            edges.insert(sibling.clone());
                        }
                    }
                }
            }
        }
        out.push((folder.join("::"), graph));
    }
    out
}

/// The Rust files under `dir`, the folder of module `module`, each with its module path.
fn module_files(dir: &Path, module: &[String]) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut inner = module.to_vec();
        if name != "mod" {
            inner.push(name);
        }
        if path.is_dir() {
            files.extend(module_files(&path, &inner));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push((path, inner));
        }
    }
    files
}

#[test]
fn the_checker_sees_a_cycle_through_a_re_export() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\npub use b::{Thing, other};\n",
    )
    .unwrap();
    std::fs::write(src.join("a.rs"), "use crate::Thing;\n").unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    std::fs::write(src.join("b/mod.rs"), "mod c;\n").unwrap();
    std::fs::write(
        src.join("b/c.rs"),
        "pub fn f() { crate::a::g() }\n#[cfg(test)]\nmod tests { use crate::z; }\n",
    )
    .unwrap();
    let graph = module_graph(src);
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "a"]]);
    std::fs::write(
        src.join("b/c.rs"),
        "// crate::a is only named in a comment\n",
    )
    .unwrap();
    assert!(cycles(&module_graph(src)).is_empty());
}

/// Top-level module → the top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn module_graph(src: &Path) -> Graph {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            modules.entry(name).or_default().extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") && !is_root(&name) {
            modules.entry(name).or_default().push(path);
        }
    }
    let mut re_exports = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        if let Ok(text) = std::fs::read_to_string(src.join(root)) {
            for path in crate_paths(&code_of(&text), "pub use ") {
                if path.len() > 1 && modules.contains_key(&path[0]) {
                    re_exports.insert(path[path.len() - 1].clone(), path[0].clone());
                }
            }
        }
    }
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for file in files {
            let code = code_of(&std::fs::read_to_string(file).unwrap());
            for path in crate_paths(&code, "crate::") {
                let first = &path[0];
                let target = if modules.contains_key(first) {
                    Some(first.clone())
                } else {
                    re_exports.get(first).cloned()
                };
                if let Some(target) = target.filter(|t| t != module) {
                    edges.insert(target);
                }
            }
        }
    }
    graph
}

fn is_root(stem: &str) -> bool {
    matches!(stem, "lib" | "main")
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The code of a file without its comments, string literals and `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    // Test modules come last in this code base's files; a dependency only tests have is fine.
    // Other attributes may stand between `#[cfg(test)]` and the `mod`.
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]\n") {
        let at = from + found;
        let mut rest = out[at..].lines().skip(1);
        if rest
            .find(|line| !line.trim_start().starts_with("#["))
            .is_some_and(|line| line.starts_with("mod "))
        {
            return out[..at].to_string();
        }
        from = at + 1;
    }
    out
}

/// Every path written after `prefix` in `code`, as its segments (a `{…}` group gives one path
/// per member; `as` renames are dropped).
fn crate_paths(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let after_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
        rest = &rest[at + prefix.len()..];
        if after_word {
            let mut parser = UseTree {
                text: rest.as_bytes(),
                at: 0,
            };
            parser.tree(Vec::new(), &mut found);
        }
    }
    for path in &mut found {
        if path.first().is_some_and(|s| s == "crate") {
            path.remove(0);
        }
    }
    found.retain(|path| !path.is_empty());
    found
}

/// A small parser of `a::b::{c, d::e as f}` trees.
struct UseTree<'a> {
    text: &'a [u8],
    at: usize,
}

impl UseTree<'_> {
    fn tree(&mut self, mut path: Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            self.skip_space();
            if self.eat(b'{') {
                loop {
                    self.skip_space();
                    if self.eat(b'}') || self.at >= self.text.len() {
                        return;
                    }
                    self.tree(path.clone(), out);
                    self.skip_space();
                    self.eat(b',');
                }
            }
            let word = self.word();
            if word.is_empty() {
                break;
            }
            path.push(word);
            self.skip_space();
            if !(self.eat(b':') && self.eat(b':')) {
                break;
            }
        }
        self.skip_space();
        if self.text[self.at..].starts_with(b"as ") {
            self.at += 3;
            self.skip_space();
            self.word();
        }
        out.push(path);
    }

    fn word(&mut self) -> String {
        let start = self.at;
        while self.at < self.text.len()
            && (self.text[self.at].is_ascii_alphanumeric() || self.text[self.at] == b'_')
        {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.text[start..self.at]).into_owned()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.text.get(self.at) == Some(&byte);
        self.at += usize::from(hit);
        hit
    }

    fn skip_space(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }
}

/// Every cycle in the graph, one per strongly connected set of two or more modules, written
/// as a path that returns to its start.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        if let Some(path) = path_back(graph, start) {
            seen.extend(path.iter().cloned());
            found.push(path);
        }
    }
    found
}

/// The shortest path from `start` back to itself, if there is one.
fn path_back(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut previous: BTreeMap<String, String> = BTreeMap::new();
    let mut frontier = vec![start.to_string()];
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for node in frontier {
            for to in graph.get(&node).into_iter().flatten() {
                if to == start {
                    let mut back = Vec::new();
                    let mut at = node.clone();
                    while at != start {
                        let before = previous[&at].clone();
                        back.push(at);
                        at = before;
                    }
                    back.reverse();
                    let mut path = vec![start.to_string()];
                    path.extend(back);
                    path.push(start.to_string());
                    return Some(path);
                }
                if !previous.contains_key(to) {
                    previous.insert(to.clone(), node.clone());
                    next.push(to.clone());
                }
            }
        }
        frontier = next;
    }
    None
}
