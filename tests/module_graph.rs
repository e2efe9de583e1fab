//! The modules of every crate depend on each other one way only: a circle (a imports b,
//! which imports a, directly or through others) makes neither understandable alone and is
//! the first thing a refactor trips on. This reads each crate's sources as text, takes
//! every `crate::module` a top-level module names (in `use` lines and paths alike, `//`
//! comments left out), and fails on any circle among top-level modules, naming it.

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
