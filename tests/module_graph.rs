//! The modules of every crate depend on each other one way only: a circle (a imports b,
//! which imports a, directly or through others) makes neither understandable alone and is
//! the first thing a refactor trips on. This reads each crate's sources as text, takes
//! every `crate::module` a top-level module names (in `use` lines and paths alike, `//`
//! comments left out), and fails on any circle among top-level modules, naming it. It does
//! the same one level down, file by file: a module file (`run/args.rs`) naming a sibling or
//! any other file (`super::setup`, `crate::compare::procs`) is an edge too, so two files
//! of one folder that import each other fail it. A file naming its own ancestors (its
//! parent's items, as `use super::Item` does) is how a module shares with its children,
//! not a circle, and is left out; so is code after `#[cfg(test)]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

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
        let graph = module_graph(&repo().join(krate).join("src"));
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
        let graph = file_graph(&repo().join(krate).join("src"));
        assert!(graph.len() > 5, "{krate}: {graph:?}");
        if let Some(circle) = find_circle(&graph) {
            panic!(
                "{krate}: module files import each other in a circle: {}",
                circle.join(" -> ")
            );
        }
    }
}
