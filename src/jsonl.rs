//! JSONL: its non-blank lines, numbered from 1, each parsed as JSON. [`values`] reads text in
//! memory (the datasets, `acpo generate`'s prompt files, `acpo score`'s responses); [`read`]
//! streams a file another program wrote (verl's logs), a regular file only, each line bounded,
//! with Python's bare `NaN` / `Infinity` read as `null` and counted. Each caller names its own
//! fields and errors.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::files::{AtPath, PathIoError};

/// The non-blank lines of `text` with their 1-based line numbers, each parsed.
pub fn values(text: &str) -> impl Iterator<Item = (usize, serde_json::Result<Value>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str(l)))
}

/// Why a JSONL file could not be streamed, naming it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{}, line {line}: longer than {max} bytes", .path.display())]
    LineTooLong {
        path: PathBuf,
        line: usize,
        max: usize,
    },
}

/// A line of [`read`]: its number, its JSON (or why it is not), and how many of Python's bare
/// non-finite numbers (`NaN`, `Infinity`, `-Infinity`) it held, read as `null`.
pub struct Line {
    pub number: usize,
    pub value: serde_json::Result<Value>,
    pub non_finite: usize,
}

/// Streams the non-blank lines of the regular file `path` ([`crate::files`]), each of at most `max_line` bytes,
/// to `f`; stops at the first error `f` returns.
pub fn read<E: From<ReadError>>(
    path: &Path,
    max_line: usize,
    mut f: impl FnMut(Line) -> Result<(), E>,
) -> Result<(), E> {
    let file = crate::files::open(path).at(path).map_err(ReadError::Io)?;
    let mut reader = std::io::BufReader::new(file);
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        number += 1;
        let n = (&mut reader)
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut buf)
            .at(path)
            .map_err(ReadError::Io)?;
        if n == 0 {
            return Ok(());
        }
        if buf.len() > max_line && buf.last() != Some(&b'\n') {
            return Err(ReadError::LineTooLong {
                path: path.to_owned(),
                line: number,
                max: max_line,
            }
            .into());
        }
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        let (clean, non_finite) = python_non_finite_to_null(&text);
        f(Line {
            number,
            value: serde_json::from_str(&clean),
            non_finite,
        })?;
    }
}

/// The JSON text with Python's bare `NaN`, `Infinity` and `-Infinity` (outside strings) as
/// `null`, and how many there were: what `json.dumps` writes for non-finite floats and JSON
/// has no word for.
fn python_non_finite_to_null(text: &str) -> (std::borrow::Cow<'_, str>, usize) {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return (std::borrow::Cow::Borrowed(text), 0);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped, mut count) = (false, false, 0);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        if let Some(word) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|w| rest.starts_with(w))
        {
            out.push_str("null");
            count += 1;
            rest = &rest[word.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    (std::borrow::Cow::Owned(out), count)
}

#[cfg(test)]
mod tests {
    use super::{python_non_finite_to_null, read, ReadError};

    /// Read to the end, each line accepted.
    fn read_all(path: &std::path::Path, max_line: usize) -> Result<usize, ReadError> {
        let mut lines = 0;
        read(path, max_line, |_| {
            lines += 1;
            Ok::<(), ReadError>(())
        })?;
        Ok(lines)
    }

    #[test]
    fn a_files_errors_name_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("missing.jsonl");
        let e = read_all(&missing, 64).expect_err("no such file");
        assert!(e.to_string().contains("missing.jsonl"), "{e}");
        let long = dir.path().join("long.jsonl");
        std::fs::write(&long, format!("{{}}\n\"{}\"\n", "x".repeat(100))).expect("write");
        let e = read_all(&long, 64).expect_err("a line too long");
        let shown = e.to_string();
        assert!(
            shown.contains("long.jsonl") && shown.contains("line 2"),
            "{shown}"
        );
        assert_eq!(read_all(&long, 1024).expect("within bounds"), 2);
    }

    #[test]
    fn bare_non_finite_numbers_become_null_outside_strings_only() {
        let (t, n) = python_non_finite_to_null(
            r#"{"a": NaN, "b": -Infinity, "c": [Infinity, 1], "d": "NaN \" Infinity"}"#,
        );
        assert_eq!(
            t,
            r#"{"a": null, "b": null, "c": [null, 1], "d": "NaN \" Infinity"}"#
        );
        assert_eq!(n, 3);
        let (t, n) = python_non_finite_to_null(r#"{"a": 1.5}"#);
        assert_eq!((t.as_ref(), n), (r#"{"a": 1.5}"#, 0));
    }
}
