//! JSONL text: its non-blank lines, numbered from 1, each parsed as JSON. The one reader under
//! the datasets, `acpo generate`'s prompt files and `acpo score`'s responses; each caller names
//! its own fields and errors.

use serde_json::Value;

/// The non-blank lines of `text` with their 1-based line numbers, each parsed.
pub fn values(text: &str) -> impl Iterator<Item = (usize, serde_json::Result<Value>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str(l)))
}
