//! The modules of every crate depend on each other one way only: a circle (a imports b,
//! which imports a, directly or through others) makes neither understandable alone and is
//! the first thing a refactor trips on. This reads each crate's sources as text, takes
//! every `crate::module` a top-level module names (in `use` lines and paths alike, `//`
//! comments left out), and fails on any circle among top-level modules, naming it. It does
//! the same one level down, file by file: a module file (`run/args.rs`) naming a sibling or
//! any other file (`super::setup`, `crate::compare::procs`) is an edge too, so two files
//! of one folder that import each other fail it. A file naming its own ancestors (its
//! parent's items, as `use super::Item` does) is how a module shares with its children,
//! not a circle, and is left out; so is code after `#[cfg(test)]`. Last, no module a
//! binary's root (`main.rs`) declares may name that root's own items (`crate::TITLE`
//! defined in main.rs): such a module only the binary can build, and no test reaches it.
//!
//! It also keeps the size limits, so that no file or function grows past what one reader
//! can hold: no source file with over 700 lines of non-test code, and at most one non-test
//! function of the crates over 120 lines, with a doc comment saying why it stays whole ("It
//! stays one function"); none in the end-to-end suite (tests/, the fuzz targets aside),
//! whose scenarios read as named steps. Code is read as rustfmt leaves it: a function ends at
//! the first line after its signature that is a `}` at the signature's own indentation; a
//! file's test code starts at `#[cfg(test)]` followed by `mod tests`.
//!
//! `map` holds the docs' maps to the tree: ARCHITECTURE.md's proxy modules and their
//! dependencies, and each crate root's list of its modules.
//!
//! And the suite's own prerequisites stay installable: tests/run, the README's test command,
//! installs every Debian package that tests/common/prerequisites.rs names for a tool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use e2e::repo_root;

mod map;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source text names after `crate::` (`crate::a::b`, and each
/// item of `crate::{a, b::c}`).
fn named_modules(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Items at the group's top level: split on commas outside nested braces.
            let (mut depth, mut item_start) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.insert(ident(group[item_start..i].trim_start()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(group[item_start..i].trim_start()));
                        item_start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

/// `src`'s top-level modules and the others each one names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut all = Vec::new();
            rust_files(&path, &mut all);
            files.insert(name, all);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            files.insert(name, vec![path]);
        }
    }
    let mut graph = BTreeMap::new();
    for (module, paths) in &files {
        let mut uses = BTreeSet::new();
        for path in paths {
            let text = std::fs::read_to_string(path).unwrap();
            uses.extend(
                named_modules(&text)
                    .into_iter()
                    .filter(|m| m != module && files.contains_key(m)),
            );
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The module paths a source text names through `crate::` or `super::`, resolved against
/// `this` (the file's own module path): `crate::a::b::C` gives `[a, b, C]`, `super::x::Y`
/// in `run::args` gives `[run, x, Y]`; each item of a `{...}` group gives its own path.
fn named_paths(text: &str, this: &[String]) -> Vec<Vec<String>> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    // The segments of `a::b::c` at the start of `s`, and what follows them.
    fn segments(s: &str, is_ident: &dyn Fn(char) -> bool) -> (Vec<String>, usize) {
        let (mut out, mut at) = (Vec::new(), 0);
        loop {
            let len = s[at..].chars().take_while(|c| is_ident(*c)).count();
            if len == 0 {
                return (out, at);
            }
            out.push(s[at..at + len].to_owned());
            at += len;
            if s[at..].starts_with("::") && s[at + 2..].chars().next().is_some_and(is_ident) {
                at += 2;
            } else {
                return (out, at);
            }
        }
    }
    let mut paths = Vec::new();
    for (root, base) in [
        ("crate::", Vec::new()),
        ("super::", this[..this.len().saturating_sub(1)].to_vec()),
    ] {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(root) {
            let before = code.len() - rest.len() + at;
            rest = &rest[at + root.len()..];
            if before > 0 && code[..before].chars().last().is_some_and(is_ident) {
                continue;
            }
            let (segs, end) = segments(rest, &is_ident);
            let mut prefix = base.clone();
            prefix.extend(segs.iter().cloned());
            let tail = &rest[end..];
            let group = match tail.strip_prefix("::{") {
                Some(group) => Some(group),
                // `crate::{a, b}`: the group right after the root.
                None if segs.is_empty() => rest.strip_prefix('{'),
                None => None,
            };
            if let Some(group) = group {
                // Each item at the group's top level.
                let mut depth = 0;
                let mut item_start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' | ',' if depth == 0 => {
                            let (item, _) = segments(group[item_start..i].trim_start(), &is_ident);
                            let mut path = prefix.clone();
                            path.extend(item);
                            paths.push(path);
                            if c == '}' {
                                break;
                            }
                            item_start = i + 1;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
            } else {
                paths.push(prefix);
            }
        }
    }
    paths
}

/// `src`'s module files (by module path, `run::args`; `mod.rs` stands for its folder) and
/// the others each one names, its own ancestors left out.
fn file_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    rust_files(src, &mut all);
    let module_of = |path: &Path| -> Vec<String> {
        let rel = path.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    };
    let modules: BTreeSet<Vec<String>> = all.iter().map(|p| module_of(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &all {
        let this = module_of(path);
        let mut uses = BTreeSet::new();
        for named in named_paths(&std::fs::read_to_string(path).unwrap(), &this) {
            // The longest prefix that is a module file.
            let Some(target) = (1..=named.len())
                .rev()
                .map(|k| named[..k].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let own_ancestor = target.len() <= this.len() && this[..target.len()] == target[..];
            if !own_ancestor {
                uses.insert(target.join("::"));
            }
        }
        graph.entry(this.join("::")).or_default().extend(uses);
    }
    // Every node names only nodes of the graph.
    let nodes: BTreeSet<String> = graph.keys().cloned().collect();
    for uses in graph.values_mut() {
        uses.retain(|u| nodes.contains(u));
    }
    graph
}

/// A circle of `graph`, if it has one: the modules in order, the first repeated last.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in &graph[node] {
            if let Some(circle) = visit(next, graph, done, path) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_parser_sees_paths_groups_and_nested_groups() {
    let names = named_modules(
        "use crate::a::X;\nuse crate::{b, c::{D, E}, f};\nlet x = crate::g::h(); // crate::comment\n",
    );
    let expected: BTreeSet<String> = ["a", "b", "c", "f", "g"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected);
    let circle = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(find_circle(&circle).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn no_crate_has_a_module_circle() {
    for krate in ["proxy", "loadgen", "embedded-qdrant"] {
        let graph = module_graph(&repo_root().join(krate).join("src"));
        assert!(graph.len() > 3, "{krate}: {graph:?}");
        if let Some(circle) = find_circle(&graph) {
            panic!(
                "{krate}: modules import each other in a circle: {}",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_file_level_parser_resolves_crate_super_and_groups() {
    let this = ["run".to_owned(), "args".to_owned()];
    let paths = named_paths(
        "use super::setup::f;\nuse crate::{vectors::{A, B}, result::*};\nlet x = crate::client::http::send();\n#[cfg(test)]\nmod tests { use super::super::z; }\n",
        &this,
    );
    let shown: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        shown,
        ["vectors", "result", "client::http::send", "run::setup::f"]
    );
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    for krate in ["proxy", "loadgen", "embedded-qdrant"] {
        let graph = file_graph(&repo_root().join(krate).join("src"));
        assert!(graph.len() > 5, "{krate}: {graph:?}");
        if let Some(circle) = find_circle(&graph) {
            panic!(
                "{krate}: module files import each other in a circle: {}",
                circle.join(" -> ")
            );
        }
    }
}

/// The items a binary root (`main.rs`) defines itself, and the modules it declares.
fn root_items_and_modules(main_text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut items, mut modules) = (BTreeSet::new(), BTreeSet::new());
    let code = main_text.split("#[cfg(test)]").next().unwrap_or("");
    for line in code.lines() {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == ':' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        // Declarations at the file's top level only: no indentation.
        if line.starts_with(char::is_whitespace) || words.is_empty() {
            continue;
        }
        let mut at = usize::from(words[0] == "pub" || words[0].starts_with("pub("));
        if words.get(at) == Some(&"async") {
            at += 1;
        }
        match (words.get(at), words.get(at + 1)) {
            (Some(&"mod"), Some(name)) if line.trim_end().ends_with(';') => {
                modules.insert((*name).to_owned());
            }
            (
                Some(&("fn" | "const" | "static" | "struct" | "enum" | "type" | "trait")),
                Some(name),
            ) => {
                items.insert((*name).to_owned());
            }
            _ => {}
        }
    }
    (items, modules)
}

/// `(file, item)` for every file of a module that `main_text` declares which names an item
/// defined in `main_text` itself: a module leaning on its binary's root, which only the
/// binary can then build and no library user or test can reach. `files` are each module
/// file's module path (`run::args`) and text.
fn binary_root_imports(main_text: &str, files: &[(Vec<String>, String)]) -> Vec<(String, String)> {
    let (items, modules) = root_items_and_modules(main_text);
    let mut found = Vec::new();
    for (this, text) in files {
        if !this.first().is_some_and(|m| modules.contains(m)) {
            continue;
        }
        for named in named_paths(text, this) {
            if items.contains(&named[0]) && !modules.contains(&named[0]) {
                found.push((this.join("::"), named[0].clone()));
            }
        }
    }
    found
}

#[test]
fn the_binary_root_check_finds_a_module_naming_mains_items() {
    let main = "mod rest;\nmod grpc;\npub const SERVER_TITLE: &str = \"x\";\nfn main() {}\n#[cfg(test)]\nmod tests { const HIDDEN: u8 = 0; }\n";
    let files = vec![
        (
            vec!["rest".to_owned()],
            "use crate::SERVER_TITLE;\nuse crate::grpc::Thing;\n".to_owned(),
        ),
        (
            vec!["grpc".to_owned(), "points".to_owned()],
            "let t = crate::SERVER_TITLE;".to_owned(),
        ),
        (vec!["grpc".to_owned()], "use crate::HIDDEN;".to_owned()),
    ];
    assert_eq!(
        binary_root_imports(main, &files),
        [
            ("rest".to_owned(), "SERVER_TITLE".to_owned()),
            ("grpc::points".to_owned(), "SERVER_TITLE".to_owned()),
        ]
    );
}

#[test]
fn no_module_imports_its_binary_root() {
    for krate in ["proxy", "loadgen", "embedded-qdrant"] {
        let src = repo_root().join(krate).join("src");
        let main_text = std::fs::read_to_string(src.join("main.rs")).unwrap();
        let mut all = Vec::new();
        rust_files(&src, &mut all);
        let files: Vec<(Vec<String>, String)> = all
            .iter()
            .filter(|p| !p.ends_with("main.rs") && !p.ends_with("lib.rs"))
            .map(|p| {
                let rel = p.strip_prefix(&src).unwrap().with_extension("");
                let mut this: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if this.last().is_some_and(|l| l == "mod") {
                    this.pop();
                }
                (this, std::fs::read_to_string(p).unwrap())
            })
            .collect();
        let found = binary_root_imports(&main_text, &files);
        assert!(
            found.is_empty(),
            "{krate}: modules name items of the binary's root (main.rs): {found:?}; move them to the library"
        );
    }
}

const MAX_FILE_LINES: usize = 700;
const MAX_FUNCTION_LINES: usize = 120;
const MAX_LONG_FUNCTIONS: usize = 1;
/// What a long function's doc comment says for it to be let off.
const WHY_WHOLE: &str = "It stays one function";

/// The lines of `text` before its test module.
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// A function of a file: its name, length in lines, and the doc comment above it.
struct Function {
    name: String,
    lines: usize,
    doc: String,
}

fn functions(lines: &[&str]) -> Vec<Function> {
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let mut words = code.split_whitespace().peekable();
        // Qualifiers before `fn`.
        while let Some(w) = words.peek() {
            if w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(w) {
                words.next();
            } else {
                break;
            }
        }
        if words.next() != Some("fn") || line.trim_end().ends_with(';') {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(end) = (i + 1..lines.len()).find(|&j| {
            let l = lines[j];
            l.len() > indent && l[..indent].trim().is_empty() && l[indent..].starts_with('}')
        }) else {
            continue;
        };
        let doc: Vec<&str> = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("///") || t.starts_with("#[")
            })
            .copied()
            .collect();
        found.push(Function {
            name,
            lines: end - i + 1,
            doc: doc.join(" "),
        });
    }
    found
}

#[test]
fn the_reader_finds_functions_their_lengths_and_docs() {
    let text = "/// Short.\nfn a() {\n    x();\n}\n\nimpl T {\n    /// It stays one function: a list.\n    pub async fn b(\n        y: u8,\n    ) {\n        if y {\n        }\n    }\n    fn decl();\n}\n#[cfg(test)]\nmod tests {\n    fn c() {}\n}\n";
    let lines = non_test_lines(text);
    assert_eq!(lines.len(), 15);
    let f = functions(&lines);
    let seen: Vec<(&str, usize)> = f.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(seen, [("a", 3), ("b", 6)]);
    assert!(f[1].doc.contains(WHY_WHOLE));
}

#[test]
fn no_file_or_function_outgrows_its_limit() {
    let mut files = Vec::new();
    for krate in ["proxy", "loadgen", "embedded-qdrant"] {
        rust_files(&repo_root().join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    outgrown(&files, MAX_FUNCTION_LINES, MAX_LONG_FUNCTIONS);
}

/// The end-to-end suite under the same limits, with no long function let off: a scenario
/// reads as named steps.
#[test]
fn no_test_file_or_function_outgrows_its_limit() {
    let mut files = Vec::new();
    rust_files(&repo_root().join("tests"), &mut files);
    files.retain(|f| !f.starts_with(repo_root().join("tests/fuzz")));
    assert!(files.len() > 40, "{} files", files.len());
    outgrown(&files, MAX_FUNCTION_LINES, 0);
}

/// Fails on a file over [`MAX_FILE_LINES`] or a function over `max_function_lines` that
/// is not one of at most `long_functions_allowed`, each saying why it stays whole.
fn outgrown(files: &[PathBuf], max_function_lines: usize, long_functions_allowed: usize) {
    let (mut too_long_files, mut long_functions) = (Vec::new(), Vec::new());
    for path in files {
        let text = std::fs::read_to_string(path).unwrap();
        let lines = non_test_lines(&text);
        let shown = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        if lines.len() > MAX_FILE_LINES {
            too_long_files.push(format!("{shown}: {} lines", lines.len()));
        }
        for f in functions(&lines) {
            if f.lines > max_function_lines {
                long_functions.push((format!("{shown}: {} ({} lines)", f.name, f.lines), f.doc));
            }
        }
    }
    assert!(
        too_long_files.is_empty(),
        "files over {MAX_FILE_LINES} lines of non-test code: {too_long_files:?}"
    );
    let unexplained: Vec<&String> = long_functions
        .iter()
        .filter(|(_, doc)| !doc.contains(WHY_WHOLE))
        .map(|(f, _)| f)
        .collect();
    assert!(
        unexplained.is_empty(),
        "functions over {max_function_lines} lines without a comment saying why they stay whole ({WHY_WHOLE:?}): {unexplained:?}"
    );
    assert!(
        long_functions.len() <= long_functions_allowed,
        "more than {long_functions_allowed} functions over {max_function_lines} lines: {:?}",
        long_functions.iter().map(|(f, _)| f).collect::<Vec<_>>()
    );
}

/// The README's test command installs every package whose tool a test asks for, so that a
/// fresh machine passes with it: tests/run's package list holds each package of
/// tests/common/prerequisites.rs's table.
#[test]
fn the_test_command_installs_every_tool_the_tests_ask_for() {
    let script = std::fs::read_to_string(repo_root().join("tests/run")).expect("tests/run");
    let list = script
        .split_once("packages=(")
        .and_then(|(_, rest)| rest.split_once("\n)"))
        .expect("tests/run has a packages=( ... ) list")
        .0;
    let installed: BTreeSet<&str> = list
        .lines()
        .flat_map(|line| {
            line.split('#')
                .next()
                .unwrap_or_default()
                .split_whitespace()
        })
        .collect();
    let missing: Vec<_> = e2e::SYSTEM_TOOLS
        .iter()
        .filter(|(_, package)| !installed.contains(package))
        .collect();
    assert!(
        missing.is_empty(),
        "tests/run does not install {missing:?}; it installs {installed:?}"
    );
}
