//! What a parse error says: one sentence naming the file, the line and the field path (the
//! YAML crate's snippet dropped, the field recovered from the text), and the refusal of a
//! number or boolean written as a quoted string.

use std::path::Path;

use super::ManifestError;

/// The first field written as a quoted string where the manifest wants a number or a boolean
/// (`seed: "1"`): the YAML crate converts the text, a typo'd type should not pass silently.
pub(super) fn quoted_scalar(
    written: &serde_json::Value,
    typed: &serde_json::Value,
    at: String,
) -> Option<(String, String)> {
    use serde_json::Value;
    let join = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match (written, typed) {
        (Value::String(s), Value::Number(_) | Value::Bool(_)) => Some((at, s.clone())),
        (Value::Object(w), Value::Object(t)) => w
            .iter()
            .find_map(|(k, v)| t.get(k).and_then(|tv| quoted_scalar(v, tv, join(k)))),
        (Value::Array(w), Value::Array(t)) => w
            .iter()
            .zip(t)
            .enumerate()
            .find_map(|(i, (v, tv))| quoted_scalar(v, tv, format!("{at}[{i}]"))),
        _ => None,
    }
}

/// serde-saphyr reports a line and column with a source snippet; a manifest error is one
/// sentence naming the field, so the snippet is dropped and the field path is recovered from
/// the line.
pub(super) fn parse_error(err: serde_saphyr::Error, text: &str, path: &Path) -> ManifestError {
    let plain = err.without_snippet().to_string();
    // "error: line 8 column 1: unknown field ..." -> "unknown field ..."
    let mut message = plain.trim().trim_start_matches("error:").trim();
    if message.starts_with("line ") {
        if let Some((_, rest)) = message.split_once(": ") {
            message = rest;
        }
    }
    let mut message = message.lines().next().unwrap_or("").trim();
    if let Some((head, _)) = message.rsplit_once(" at line ") {
        message = head;
    }
    let message = message.to_string();
    match err.location().filter(|l| l.line() > 0) {
        Some(location) => {
            // A quote left open runs into the lines after it, where the YAML parser stops: the
            // fault is on the line that opened it.
            let line = location.line() as usize;
            let line = if message.contains("quoted scalar") {
                unclosed_quote_line(text, line).unwrap_or(line)
            } else {
                line
            };
            ManifestError::Parse {
                path: path.to_owned(),
                line: line as u64,
                field: field_path_at_line(text, line),
                message,
            }
        }
        None => ManifestError::Syntax {
            path: path.to_owned(),
            message,
        },
    }
}

/// The last line up to `line` (1-based) that opens a quote it does not close.
fn unclosed_quote_line(text: &str, line: usize) -> Option<usize> {
    let opens_unclosed = |l: &str| {
        let mut quote: Option<char> = None;
        let mut chars = l.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, '#') => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some('\''), '\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                }
                (Some(q), c) if c == q => quote = None,
                _ => {}
            }
        }
        quote.is_some()
    };
    text.lines()
        .take(line)
        .enumerate()
        .filter(|(_, l)| opens_unclosed(l))
        .map(|(i, _)| i + 1)
        .last()
}

/// The dotted key path (`rollout.n`) of a 1-based line of block-style YAML, from indentation.
fn field_path_at_line(text: &str, line: usize) -> String {
    let mut stack: Vec<(usize, &str)> = Vec::new();
    for raw_line in text.lines().take(line) {
        let content = raw_line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = raw_line.len() - content.len();
        let Some((key, _)) = content.split_once(':') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
    }
    if stack.is_empty() {
        return "(top level)".to_string();
    }
    stack.iter().map(|(_, k)| *k).collect::<Vec<_>>().join(".")
}
