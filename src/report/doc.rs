//! Generated blocks of Markdown documents: `<!-- begin: NAME -->` … `<!-- end: NAME -->` holds
//! the file NAME of a folder of generated reports, so docs quote generated files and never
//! hand-typed numbers. Every generator shares this one format and this one filler: `acpo
//! report`, `reproduce`, `sweep`, `bench` and `pipeline` through their `--doc`, the GPU
//! suite's report (tools/gpu/report.py writes its files, `acpo doc` fills them in).

use crate::files::AtPath;
use std::path::{Path, PathBuf};

use super::{ReportError, Result};

/// Fills each block `<!-- begin: NAME -->` … `<!-- end: NAME -->` of the Markdown document
/// `doc` (read from `doc_path`) with the generated file `root/NAME` (e.g. `table1.md`), so docs
/// quote generated files instead of hand-typed numbers. Returns the new text and the number of
/// blocks filled. A block naming a file `root` does not have is left as it is (another
/// generator fills it: the GPU blocks come from the GPU suite's results, the memory plan from
/// `acpo bench`), but a document none of whose blocks `root` can fill is an error (a wrong root or a
/// misspelt name). NAME is a relative path that stays inside `root` (issue #35: a block naming
/// `/etc/hostname` or `../x` is refused, links leading out of `root` too); errors name the
/// document.
pub fn splice(doc_path: &Path, doc: &str, root: &Path) -> Result<(String, usize)> {
    let invalid = |reason: String| ReportError::Invalid {
        path: doc_path.to_owned(),
        reason,
    };
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    let mut filled = 0;
    let mut seen = Vec::new();
    while let Some(i) = rest.find("<!-- begin: ") {
        let after = &rest[i + "<!-- begin: ".len()..];
        let name_end = after
            .find(" -->")
            .ok_or_else(|| invalid("a `<!-- begin: NAME` marker is not closed by ` -->`".into()))?;
        let name = &after[..name_end];
        let end_marker = format!("<!-- end: {name} -->");
        let body_start = i + "<!-- begin: ".len() + name_end + " -->".len();
        let j = rest[body_start..]
            .find(&end_marker)
            .ok_or_else(|| invalid(format!("no `{end_marker}` after `<!-- begin: {name} -->`")))?;
        if let Some(other) = inner_marker(&rest[body_start..body_start + j]) {
            return Err(invalid(format!(
                "block `{name}` holds `{other}`: another block nested in it or crossing it would be deleted when `{name}` is filled (refused; each block must be closed before the next opens)"
            )));
        }
        let path = block_file(root, name).ok_or_else(|| {
            invalid(format!(
                "block `{name}` is not a file inside the reports folder {}",
                root.display()
            ))
        })?;
        if !path.exists() {
            let block_end = body_start + j + end_marker.len();
            out.push_str(&rest[..block_end]);
            rest = &rest[block_end..];
            seen.push(name.to_owned());
            continue;
        }
        let body = crate::files::read_to_string_at_most(&path, MAX_GENERATED_BYTES).at(&path)?;
        if let Some(reason) = holds_marker(&body) {
            return Err(ReportError::Invalid {
                path: path.clone(),
                reason: format!(
                    "{reason}: quoted into block `{name}` of {} it would end or open a block there, so the document could never be filled the same way twice (generated text must hold no block marker)",
                    doc_path.display()
                ),
            });
        }
        out.push_str(&rest[..body_start]);
        out.push('\n');
        out.push_str(body.trim_end());
        out.push('\n');
        out.push_str(&end_marker);
        rest = &rest[body_start + j + end_marker.len()..];
        filled += 1;
        if (out.len() + rest.len()) as u64 > MAX_DOC_BYTES {
            return Err(invalid(format!(
                "filled, it would be larger than the {MAX_DOC_BYTES} bytes a document may have: refused"
            )));
        }
    }
    if filled == 0 && !seen.is_empty() {
        return Err(invalid(format!(
            "none of its generated blocks ({}) is in the reports folder {}",
            seen.join(", "),
            root.display()
        )));
    }
    out.push_str(rest);
    Ok((out, filled))
}

/// The markers that open and close a block: a generated file holding one would change the
/// blocks of the document it is quoted into (issue #47).
const MARKERS: [&str; 2] = ["<!-- begin: ", "<!-- end: "];

/// Bytes of a generated file quoted into a block (the largest generated report is a few KB):
/// a bigger one is refused before it is held whole.
pub const MAX_GENERATED_BYTES: u64 = 4 << 20;
/// Bytes of a document read or written by [`fill`] (the largest doc is ~100 KB).
pub const MAX_DOC_BYTES: u64 = 16 << 20;

/// The first block marker inside a block's body (the whole marker when it is closed on its
/// line), or None.
fn inner_marker(body: &str) -> Option<String> {
    let at = MARKERS.iter().filter_map(|m| body.find(m)).min()?;
    let marker = &body[at..];
    let line = marker.lines().next().unwrap_or(marker);
    let shown = match line.find(" -->") {
        Some(end) => &line[..end + " -->".len()],
        None => line,
    };
    Some(shown.chars().take(200).collect())
}

/// Where generated text holds a block marker (its line), or None.
fn holds_marker(body: &str) -> Option<String> {
    body.lines().enumerate().find_map(|(i, line)| {
        MARKERS
            .iter()
            .find(|m| line.contains(*m))
            .map(|m| format!("line {} holds `{}`", i + 1, m.trim_end()))
    })
}

/// `root/name` when `name` is a relative path of plain components that, links followed, stays
/// inside `root`; None otherwise.
fn block_file(root: &Path, name: &str) -> Option<PathBuf> {
    let rel = Path::new(name);
    let plain = !name.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        return None;
    }
    let path = root.join(rel);
    match (path.canonicalize(), root.canonicalize()) {
        (Ok(real), Ok(base)) if !real.starts_with(&base) => None,
        _ => Some(path),
    }
}

/// What [`fill`] did to one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filled {
    pub doc: PathBuf,
    /// Blocks whose file the folder has.
    pub blocks: usize,
    /// Whether any of them differed from its file (with `check`, the document is stale).
    pub changed: bool,
}

/// Fills the generated blocks of each of `docs` from the files in `root` ([`splice`]); with
/// `check`, writes nothing and only says which would change. The documents are written together
/// or not at all (issue #47): every one is read and spliced before any is written, then the
/// changed ones are replaced as one set ([`crate::atomic::replace_together`]: through a link,
/// keeping each file's permissions and owner).
pub fn fill(docs: &[PathBuf], root: &Path, check: bool) -> Result<Vec<Filled>> {
    if !root.is_dir() {
        return Err(ReportError::Invalid {
            path: root.to_owned(),
            reason: "not a folder of generated files".into(),
        });
    }
    let mut out = Vec::new();
    let mut changes = Vec::new();
    for doc in docs {
        let text = crate::files::read_to_string_at_most(doc, MAX_DOC_BYTES).at(doc)?;
        let (new, blocks) = splice(doc, &text, root)?;
        let changed = new != text;
        if changed {
            changes.push((doc.clone(), new.into_bytes()));
        }
        out.push(Filled {
            doc: doc.clone(),
            blocks,
            changed,
        });
    }
    if !check {
        crate::atomic::replace_together(&changes)?;
    }
    Ok(out)
}
