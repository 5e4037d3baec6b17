//! Editing a manifest's text in place: one field set, the rest (comments, order, layout)
//! kept, so that a derived manifest (a sweep's run, `acpo pipeline`'s derivation) reads like
//! the one it came from. It is the one way a manifest is derived.

/// Sets `path` (dotted) to `value` in a block-style YAML manifest: the line of the field if it
/// is there (its trailing comment and any block under it dropped), else a new line under its
/// parent. A mapping is given as a flow (`{config: c.json, seed: 0}`). None when the parent
/// mapping is not in the text.
pub fn set_field(text: &str, path: &str, value: &str) -> Option<String> {
    edit_field(text, path, Some(value))
}

/// Drops the dotted field `path` (its line and any block under it); None when it is not there.
pub fn remove_field(text: &str, path: &str) -> Option<String> {
    edit_field(text, path, None)
}

/// Sets (`Some`) or removes (`None`) one field: see [`set_field`].
fn edit_field(text: &str, path: &str, value: Option<&str>) -> Option<String> {
    let keys: Vec<&str> = path.split('.').collect();
    let (parent, leaf) = keys.split_at(keys.len() - 1);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // The mappings enclosing the current line: (indent, key).
    let mut stack: Vec<(usize, String)> = Vec::new();
    // Where a new child of the parent goes: after this line, at this indent.
    let mut insert: Option<(usize, usize)> = parent.is_empty().then_some((lines.len(), 0));
    // The parent's indent while the lines are inside its block.
    let mut in_parent: Option<usize> = None;
    for i in 0..lines.len() {
        let line = &lines[i];
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        if let Some(p) = in_parent {
            if indent > p {
                insert = insert.map(|(_, child)| (i + 1, child));
            } else {
                in_parent = None;
            }
        }
        let Some((key, _)) = body.split_once(':').filter(|_| !body.starts_with('-')) else {
            continue;
        };
        while stack.last().is_some_and(|(d, _)| *d >= indent) {
            stack.pop();
        }
        let here: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        if here == keys {
            let block = block_end(&lines, i, indent);
            match value {
                Some(value) => {
                    lines.splice(i..block, [format!("{}{key}: {value}", " ".repeat(indent))]);
                }
                None => drop(lines.drain(i..block)),
            }
            return Some(join(&lines, text));
        }
        if !parent.is_empty() && here == parent {
            in_parent = Some(indent);
            insert = Some((i + 1, indent + 2));
        }
        stack.push((indent, key.to_string()));
    }
    let (value, (at, indent)) = (value?, insert?);
    lines.insert(at, format!("{}{}: {value}", " ".repeat(indent), leaf[0]));
    Some(join(&lines, text))
}

/// The end (exclusive) of the block the field on line `at` (at `indent`) opens: the lines after
/// it indented deeper, blank and comment lines between them included, the trailing ones not.
fn block_end(lines: &[String], at: usize, indent: usize) -> usize {
    let mut end = at + 1;
    for (i, line) in lines.iter().enumerate().skip(at + 1) {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if line.len() - body.len() <= indent {
            break;
        }
        end = i + 1;
    }
    end
}

fn join(lines: &[String], original: &str) -> String {
    let mut out = lines.join("\n");
    if original.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Whether the manifest text has the dotted field itself.
pub fn has_field(text: &str, path: &str) -> bool {
    remove_field(text, path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "name: x\nseed: 1\nalgorithm:\n  name: grpo\n  clip_ratio_low: 0.2   # a comment\nactor:\n  optim:\n    lr: 1.0e-3\n  mini_batch_size: 2\ntrainer:\n  total_steps: 3\n";

    #[test]
    fn set_field_replaces_nested_keys_adds_missing_leaves_and_refuses_missing_parents() {
        let t = set_field(YAML, "actor.optim.lr", "5e-4").expect("there");
        assert!(t.contains("\n    lr: 5e-4\n") && !t.contains("1.0e-3"));
        assert_eq!(t.lines().count(), YAML.lines().count());
        let t = set_field(YAML, "algorithm.clip_ratio_low", "0.1").expect("there");
        assert!(
            t.contains("\n  clip_ratio_low: 0.1\n"),
            "comment dropped: {t}"
        );
        // a missing leaf goes at the end of its parent's block, at the children's indent
        let t = set_field(YAML, "actor.epochs", "4").expect("parent there");
        assert!(
            t.contains("  mini_batch_size: 2\n  epochs: 4\ntrainer:"),
            "{t}"
        );
        let t = set_field(YAML, "algorithm.alpha", "2").expect("parent there");
        assert!(
            t.contains("  clip_ratio_low: 0.2   # a comment\n  alpha: 2\nactor:"),
            "{t}"
        );
        assert_eq!(set_field(YAML, "critic.optim.lr", "1"), None);
        assert!(set_field(YAML, "name", "y")
            .expect("top")
            .starts_with("name: y\n"));
        assert!(has_field(YAML, "actor.mini_batch_size"));
        assert!(!has_field(YAML, "algorithm.alpha"));
    }

    #[test]
    fn a_field_with_a_block_is_replaced_or_removed_whole() {
        let t = set_field(YAML, "actor.optim", "{lr: 2}").expect("there");
        assert!(
            t.contains("actor:\n  optim: {lr: 2}\n  mini_batch_size: 2\n"),
            "{t}"
        );
        let t = remove_field(YAML, "actor.optim").expect("there");
        assert!(t.contains("actor:\n  mini_batch_size: 2\n"), "{t}");
        let t = remove_field(YAML, "algorithm.clip_ratio_low").expect("there");
        assert!(t.contains("  name: grpo\nactor:"), "{t}");
        assert_eq!(remove_field(YAML, "algorithm.alpha"), None);
        // a trailing comment after a block stays with what follows
        let yaml = "a:\n  b: 1\n\n# about c\nc: 2\n";
        assert_eq!(
            remove_field(yaml, "a").as_deref(),
            Some("\n# about c\nc: 2\n")
        );
    }
}
