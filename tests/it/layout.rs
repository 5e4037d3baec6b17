//! The repository's structure as docs/ARCHITECTURE.md states it: modules, and the files inside each
//! folder, depend on each other one way only, and nothing in the product points outside the
//! repository.

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

/// Inside one folder of `src/`: each file or subfolder → the siblings its code names, as
/// `super::X` (from a file directly in the folder) or `crate::<folder>::X`. The folder's own
/// `mod.rs` is the parent every child may use, so it is not a node.
fn sibling_graph(folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = repo().join("src");
    let module = folder
        .strip_prefix(&src)
        .expect("under src")
        .to_string_lossy()
        .replace('/', "::");
    let mut nodes: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(folder).expect("read folder") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            nodes.insert(name, files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            nodes.insert(name, vec![path]);
        }
    }
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut graph = BTreeMap::new();
    for (name, files) in &nodes {
        let mut deps = BTreeSet::new();
        for file in files {
            let direct = file.parent() == Some(folder);
            let text = std::fs::read_to_string(file).expect("read");
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or("");
                let prefix = format!("crate::{module}::");
                for (i, _) in code.match_indices(&prefix) {
                    deps.insert(ident(&code[i + prefix.len()..]));
                }
                if !direct {
                    continue;
                }
                for (i, _) in code.match_indices("super::") {
                    if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == ':') {
                        continue;
                    }
                    let rest = &code[i + "super::".len()..];
                    match rest.strip_prefix('{') {
                        // `super::{a::X, b}`: every name in the braces that is a sibling
                        Some(list) => deps.extend(
                            list.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                                .map(str::to_string),
                        ),
                        None => {
                            deps.insert(ident(rest));
                        }
                    }
                }
            }
        }
        deps.retain(|d| d != name && nodes.contains_key(d));
        graph.insert(name.clone(), deps);
    }
    graph
}

/// A back-edge of `graph` as "a -> b -> ... -> a", if any.
fn back_edge(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    for (from, deps) in graph {
        for to in deps {
            let (mut seen, mut stack) = (BTreeSet::new(), vec![to.clone()]);
            while let Some(m) = stack.pop() {
                if &m == from {
                    return Some(format!("{from} -> {to} -> ... -> {from}"));
                }
                if seen.insert(m.clone()) {
                    stack.extend(graph.get(&m).into_iter().flatten().cloned());
                }
            }
        }
    }
    None
}

#[test]
fn modules_depend_on_each_other_one_way_only() {
    let graph = module_graph();
    assert!(graph.len() > 20, "modules found: {:?}", graph.keys());
    if let Some(circle) = back_edge(&graph) {
        panic!("back-edge: {circle}");
    }
}

#[test]
fn files_inside_each_folder_depend_on_each_other_one_way_only() {
    let mut folders = Vec::new();
    let mut stack = vec![repo().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                folders.push(path.clone());
                stack.push(path);
            }
        }
    }
    assert!(folders.len() >= 10, "folders found: {folders:?}");
    let mut edges = 0;
    for folder in folders {
        let graph = sibling_graph(&folder);
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        if let Some(circle) = back_edge(&graph) {
            panic!("{}: back-edge {circle}", folder.display());
        }
    }
    // the scan sees the imports it must (train's phases, perf's plans, ...)
    assert!(
        edges >= 20,
        "only {edges} edges between sibling files found"
    );
}

/// The code of a Rust file: comments and the test module (from `#[cfg(test)]` on) left out.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The items a file declares (only at its top level with `top`), as (visibility, name): `pub`,
/// `restricted` (`pub(super)`, `pub(crate)`, `pub(in ..)`) or `private`.
fn declared(code: &str, top: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for line in code.lines() {
        if top && line.starts_with(char::is_whitespace) {
            continue;
        }
        let mut rest = line.trim_start();
        let vis = if let Some(r) = rest.strip_prefix("pub(") {
            rest = r.split_once(')').map_or("", |(_, r)| r).trim_start();
            "restricted"
        } else if let Some(r) = rest.strip_prefix("pub ") {
            rest = r.trim_start();
            "pub"
        } else {
            "private"
        };
        // `const fn`, `unsafe fn`, `async fn`: the item is the fn (a `const X` is a const)
        let qualified = |r: &str| {
            ["fn ", "unsafe ", "async "]
                .iter()
                .any(|k| r.starts_with(k))
        };
        while let Some(r) = ["const ", "unsafe ", "async "]
            .iter()
            .find_map(|q| rest.strip_prefix(q).filter(|r| qualified(r)))
        {
            rest = r;
        }
        for kind in [
            "fn ", "struct ", "enum ", "type ", "const ", "static ", "trait ",
        ] {
            if let Some(r) = rest.strip_prefix(kind) {
                let name: String = r
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push((vis, name));
                }
            }
        }
    }
    out
}

/// Whether `code` names `item` of the child module `child` (`child::item`, or inside
/// `child::{..}`).
fn names_item_of(code: &str, child: &str, item: &str) -> bool {
    let word = |s: &str, at: usize, len: usize| {
        let before = s[..at].chars().next_back();
        let after = s[at + len..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    let prefix = format!("{child}::");
    code.match_indices(&prefix).any(|(i, _)| {
        if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            return false;
        }
        let rest = &code[i + prefix.len()..];
        let scope = match rest.strip_prefix('{') {
            Some(list) => list.split('}').next().unwrap_or(""),
            None => rest,
        };
        scope
            .match_indices(item)
            .any(|(j, _)| word(scope, j, item.len()) && (rest.starts_with('{') || j == 0))
    })
}

/// A folder's `mod.rs` and each child (file or subfolder) lean on each other's helpers one way
/// at most: `mod.rs` may call a child's restricted items (`pub(super)`, `pub(crate)`) or the
/// child may use `mod.rs`'s non-`pub` items through `super::`, not both, which would be a
/// circle between the parent and the child. A child's `pub` items are its interface and
/// `mod.rs`'s `pub` items the folder's: either may be named.
fn parent_child_circles(folder: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(folder.join("mod.rs")) else {
        return Vec::new();
    };
    let parent = code_of(&text);
    let parent_helpers: BTreeSet<String> = declared(&parent, true)
        .into_iter()
        .filter(|(vis, _)| *vis != "pub")
        .map(|(_, name)| name)
        .collect();
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(folder).expect("read folder") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        let direct = if path.is_dir() {
            path.join("mod.rs")
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            path.clone()
        } else {
            continue;
        };
        let Ok(child_text) = std::fs::read_to_string(&direct) else {
            continue;
        };
        let child = code_of(&child_text);
        let down: Vec<String> = declared(&child, false)
            .into_iter()
            .filter(|(vis, item)| *vis == "restricted" && names_item_of(&parent, &name, item))
            .map(|(_, item)| item)
            .collect();
        let up: Vec<&String> = parent_helpers
            .iter()
            .filter(|h| {
                child.match_indices("super::").any(|(i, _)| {
                    let free = !child[..i].ends_with(|c: char| c.is_alphanumeric() || c == ':');
                    let rest = &child[i + "super::".len()..];
                    let scope = match rest.strip_prefix('{') {
                        Some(list) => list.split('}').next().unwrap_or(""),
                        None => rest
                            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .next()
                            .unwrap_or(""),
                    };
                    free && scope
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|w| w == h.as_str())
                })
            })
            .collect();
        if !down.is_empty() && !up.is_empty() {
            circles.push(format!(
                "{}: mod.rs uses {name}'s helpers {down:?}, and {name} uses mod.rs's helpers {up:?}",
                folder.display()
            ));
        }
    }
    circles
}

#[test]
fn a_folders_mod_rs_and_its_children_share_helpers_one_way_only() {
    let mut circles = Vec::new();
    let mut parents = 0;
    let mut stack = vec![repo().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                parents += usize::from(path.join("mod.rs").is_file());
                circles.extend(parent_child_circles(&path));
                stack.push(path);
            }
        }
    }
    assert!(parents >= 10, "only {parents} folders with a mod.rs found");
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_parent_check_finds_a_parent_and_child_leaning_on_each_other() {
    let dir = tempfile::tempdir().expect("tmp");
    let folder = dir.path().join("train");
    std::fs::create_dir(&folder).expect("mkdir");
    std::fs::write(
        folder.join("mod.rs"),
        "mod checkpoint;\nfn io() {}\npub fn run() { checkpoint::save(); }\n",
    )
    .expect("w");
    std::fs::write(
        folder.join("checkpoint.rs"),
        "use super::io;\npub(super) fn save() { io(); }\n",
    )
    .expect("w");
    assert_eq!(parent_child_circles(&folder).len(), 1);
    // the child's interface (`pub`) may be called by a parent whose helpers it uses
    std::fs::write(
        folder.join("checkpoint.rs"),
        "use super::io;\npub fn save() { io(); }\n",
    )
    .expect("w");
    assert!(parent_child_circles(&folder).is_empty());
}

#[test]
fn the_circle_check_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("step", vec!["update"]),
        ("update", vec!["probe"]),
        ("probe", vec!["step"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert!(back_edge(&graph).is_some());
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

/// The variants `enum name` declares in `code`: its lines at one indent that start with a
/// capital.
fn variants(code: &str, name: &str) -> Vec<String> {
    let body = code
        .split(&format!("pub enum {name} {{"))
        .nth(1)
        .unwrap_or_else(|| panic!("`pub enum {name}` not found"));
    let body = &body[..body.find("\n}").expect("the enum's end")];
    body.lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| {
            l.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// Where `code` matches on a variant of `enum_name` (a pattern of a `match` arm, `if let`,
/// `matches!`), as the variants it names there; constructing one is not matching.
fn matched_variants(code: &str, enum_name: &str, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        let needle = format!("{enum_name}::{name}");
        for (i, _) in code.match_indices(&needle) {
            let mut rest = &code[i + needle.len()..];
            if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            rest = rest.trim_start();
            if let Some(open) = rest.chars().next().filter(|c| *c == '{' || *c == '(') {
                let close = if open == '{' { '}' } else { ')' };
                let mut depth = 0;
                for (j, c) in rest.char_indices() {
                    depth += i32::from(c == open) - i32::from(c == close);
                    if depth == 0 {
                        rest = &rest[j + 1..];
                        break;
                    }
                }
            }
            let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ')');
            let before = code[..i]
                .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
                .trim_end();
            let line_start = code[..i].rfind('\n').map_or(0, |n| n + 1);
            let pattern = rest.starts_with("=>")
                || (rest.starts_with('=') && !rest.starts_with("=="))
                || (rest.starts_with('|') && !rest.starts_with("||"))
                || (before.ends_with('|') && !before.ends_with("||"))
                || code[line_start..i].contains("matches!(");
            if pattern {
                out.push(name.clone());
            }
        }
    }
    out
}

/// The files ARCHITECTURE.md says adding a clipping rule touches: the paths in its contract
/// "A clipping rule lives whole in `algo/clip.rs`".
fn files_a_new_rule_touches() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).expect("read");
    let start = doc
        .find("- **A clipping rule lives whole in `algo/clip.rs`**")
        .expect("the clipping rule's contract in docs/ARCHITECTURE.md");
    let section = &doc[start..];
    let section = &section[..section[2..].find("\n- **").map_or(section.len(), |e| e + 2)];
    let list = &section[section
        .find("Adding a rule touches")
        .expect("the list of files a new rule touches")..];
    let items: String = list
        .lines()
        .skip_while(|l| !l.starts_with("  - "))
        .take_while(|l| l.starts_with("  - ") || l.starts_with("    "))
        .collect();
    items
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains('/') && s.contains('.') && !s.contains(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn only_the_files_the_architecture_lists_match_on_a_clipping_rule() {
    let listed = files_a_new_rule_touches();
    assert!(
        listed.iter().any(|f| f == "src/algo/clip.rs"),
        "the list names clip.rs: {listed:?}"
    );
    for file in &listed {
        assert!(repo().join(file).is_file(), "listed but absent: {file}");
    }
    let clip = code_of(&std::fs::read_to_string(repo().join("src/algo/clip.rs")).expect("read"));
    let enums: Vec<(&str, Vec<String>)> = ["PolicyClip", "PolicyLossMode"]
        .into_iter()
        .map(|e| (e, variants(&clip, e)))
        .collect();
    assert!(enums[0].1.len() >= 5, "{:?}", enums[0].1);
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    let mut matching = BTreeSet::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        for (name, vs) in &enums {
            if !matched_variants(&code, name, vs).is_empty() {
                let rel = file.strip_prefix(repo()).expect("in the repository");
                matching.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    assert!(matching.contains("src/algo/clip.rs"), "{matching:?}");
    for file in &matching {
        assert!(
            listed.contains(file),
            "{file} matches on a clipping rule's variants, so a new rule must touch it, \
             but docs/ARCHITECTURE.md does not list it: ask the rule (a method in \
             src/algo/clip.rs) instead"
        );
    }
}

#[test]
fn the_rule_check_tells_a_match_from_a_construction() {
    let names = ["Ratio".to_string(), "Unclipped".to_string()];
    let matched = |code: &str| matched_variants(code, "PolicyClip", &names);
    for code in [
        "match c { PolicyClip::Ratio { eps_low, .. } => eps_low, _ => 0.0 }",
        "if let PolicyClip::Ratio { eps_low, .. } = c { }",
        "matches!(c, PolicyClip::Unclipped)",
        "match c { PolicyClip::Unclipped | PolicyClip::Ratio { .. } => 1 }",
        "match (k, c) { (Kind::Ppo, PolicyClip::Unclipped) => 1 }",
    ] {
        assert!(!matched(code).is_empty(), "a match: {code}");
    }
    for code in [
        "let c = PolicyClip::Ratio { eps_low, eps_high, dual_clip_c: 3.0 };",
        "f(PolicyClip::Unclipped, 2) == x",
        "PolicyClip::Unclipped.retains(r, a) || b",
        "let r = PolicyClip::Unclipped;",
    ] {
        assert!(matched(code).is_empty(), "a construction: {code}");
    }
}

/// The entries of the repository's root that docs/ARCHITECTURE.md lists: those its "Outside
/// `src/`" section names in its opening paragraph and in its table's first column.
fn listed_root_entries() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).expect("read");
    let start = doc.find("## Outside `src/`").expect("the section");
    let section = &doc[start + 3..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let paragraph = section
        .split("\n\n")
        .find(|p| p.starts_with("The repository's root holds"))
        .expect("the paragraph naming the root's entries");
    let cells = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l.split('`').next().unwrap_or(""));
    let named = paragraph.split('`').skip(1).step_by(2).chain(cells);
    named
        .filter_map(|p| p.split('/').next())
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// The entries at the repository's root: what git tracks or would add (ignored files aside),
/// or, without git, what is there (`.git` and cargo's `target` aside).
fn root_entries() -> BTreeSet<String> {
    let listed = std::process::Command::new("git")
        .arg("-C")
        .arg(repo())
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success());
    match listed {
        Some(out) => String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter_map(|p| p.split('/').next())
            .filter(|p| !p.is_empty())
            .filter(|p| repo().join(p).exists())
            .map(str::to_string)
            .collect(),
        None => std::fs::read_dir(repo())
            .expect("read the root")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .filter(|n| n != ".git" && n != "target")
            .collect(),
    }
}

#[test]
fn the_root_holds_only_what_the_architecture_lists() {
    let listed = listed_root_entries();
    for expected in ["src", "Cargo.toml", "tests", "docs", "tools", ".ci"] {
        assert!(listed.contains(expected), "{expected} in {listed:?}");
    }
    let entries = root_entries();
    assert!(
        entries.contains("src") && entries.contains("Cargo.toml"),
        "{entries:?}"
    );
    let unlisted: Vec<&String> = entries.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "at the repository's root but not in docs/ARCHITECTURE.md's \"Outside `src/`\": \
         {unlisted:?} (list it there with what it holds, or move it)"
    );
}
