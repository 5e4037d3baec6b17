//! The repository's structure as DESIGN.md states it: modules depend on each other one way only,
//! and nothing in the product points outside the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module → the top-level modules its code names as `crate::X` (comments aside).
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = repo().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .expect("a component")
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if ["main", "cli", "lib"].contains(&top.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        let deps = graph.entry(top.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

#[test]
fn modules_depend_on_each_other_one_way_only() {
    let graph = module_graph();
    assert!(graph.len() > 20, "modules found: {:?}", graph.keys());
    for (from, deps) in &graph {
        for to in deps {
            // Is there a way back from `to` to `from`?
            let (mut seen, mut stack) = (BTreeSet::new(), vec![to.clone()]);
            while let Some(m) = stack.pop() {
                assert_ne!(&m, from, "back-edge: {from} -> {to} -> ... -> {from}");
                if seen.insert(m.clone()) {
                    stack.extend(graph.get(&m).into_iter().flatten().cloned());
                }
            }
        }
    }
}

#[test]
fn nothing_in_the_product_points_outside_the_repository() {
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    rust_files(&repo().join("tests"), &mut files);
    files.extend(["README.md", "REPRODUCE.md", "justfile"].map(|f| repo().join(f)));
    let outside = ["../", "shared/"].concat();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (i, line) in text.lines().enumerate() {
            assert!(
                !line.contains(&outside),
                "{}:{}: refers to a folder beside the repository: {line}",
                file.display(),
                i + 1
            );
        }
    }
}
