//! The docs' maps held to the tree: ARCHITECTURE.md's table of the proxy's modules and its
//! list of their dependencies, and each crate root's doc naming every module it declares.

use std::collections::{BTreeMap, BTreeSet};

use e2e::repo_root;

use super::module_graph;

/// The edges ARCHITECTURE.md lists as `` `a → {b, c}` ``, by module.
fn documented_edges(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for piece in text.split('`').skip(1).step_by(2) {
        let piece = piece.replace('\n', " ");
        let Some((from, to)) = piece.split_once(" → ") else {
            continue;
        };
        let Some(list) = to
            .trim()
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
        else {
            continue;
        };
        edges.insert(
            from.trim().to_owned(),
            list.split(',').map(|m| m.trim().to_owned()).collect(),
        );
    }
    edges
}

/// ARCHITECTURE.md's proxy map matches the tree: every module its table names exists and
/// has a row, and its list of dependencies is every edge the code has, no more.
#[test]
fn the_architecture_map_matches_the_proxy_tree() {
    let text = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split_once("## Proxy modules")
        .and_then(|(_, rest)| rest.split_once("\n## "))
        .expect("ARCHITECTURE.md has a Proxy modules section")
        .0;
    let graph = module_graph(&repo_root().join("proxy/src"));
    let rows: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(|m| m.trim_end_matches('/').trim_end_matches(".rs").to_owned())
        .filter(|m| m != "module")
        .collect();
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    assert_eq!(rows, modules, "the module table's rows against proxy/src");
    let documented = documented_edges(section);
    for (module, uses) in &graph {
        if uses.is_empty() {
            assert!(!documented.contains_key(module), "{module} names no module");
            continue;
        }
        assert_eq!(
            documented.get(module),
            Some(uses),
            "ARCHITECTURE.md's `{module} → {{...}}` against the code"
        );
    }
    let unknown: Vec<&String> = documented
        .keys()
        .filter(|m| !graph.contains_key(*m))
        .collect();
    assert!(unknown.is_empty(), "no such modules: {unknown:?}");
}

/// Each crate's root lists its rooms: every module `lib.rs` declares is named in its doc.
#[test]
fn each_crate_root_names_every_module() {
    for krate in ["proxy", "loadgen", "embedded-qdrant"] {
        let text = std::fs::read_to_string(repo_root().join(krate).join("src/lib.rs")).unwrap();
        let doc: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join(" ");
        let unnamed: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l
                    .strip_prefix("pub(crate) ")
                    .or(l.strip_prefix("pub "))
                    .unwrap_or(l);
                l.strip_prefix("mod ")?.strip_suffix(';')
            })
            .filter(|m| !doc.contains(&format!("`{m}`")))
            .collect();
        assert!(
            unnamed.is_empty(),
            "{krate}/src/lib.rs's doc names no {unnamed:?}"
        );
    }
}
