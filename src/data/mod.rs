//! Evaluation benchmarks and the training set, one file each with its version and checksum.
//!
//! Problems come from a data directory of prepared JSONL files ([`default_dir`]: `--data-dir`,
//! else `ACPO_DATA_DIR`, else `~/.cache/acpo/data`), checked against the SHA-256 recorded in the
//! benchmark's file. A file missing there is read from the HF hub where a faithful hub copy
//! exists (MATH-500 as JSONL, DAPO-Math-17k as parquet read with polars), through the hub cache.
//! Minerva, the 675-row OlympiadBench and the assembled AIME-like set have no faithful hub copy:
//! for them the error names the file to put in the data directory.

pub mod aime_like;
pub mod dapo;
pub mod math500;
pub mod minerva;
pub mod olympiad;
mod suite;
pub mod synthetic;

pub use suite::{Benchmark, DataSpec, DataSuite, PromptTemplate};

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hub::HubOptions;

/// One problem with its gold answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub id: String,
    pub problem: String,
    pub answer: String,
}

/// Where a hub copy lives and how to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubCopy {
    /// A JSONL file with `id`/`problem`/`answer`-like fields under the given names.
    Jsonl {
        repo: &'static str,
        file: &'static str,
        id_field: &'static str,
        problem_field: &'static str,
        answer_field: &'static str,
    },
    /// verl-format parquet (`prompt[0].content` with the DAPO template, `reward_model.ground_truth`).
    DapoParquet {
        repo: &'static str,
        file: &'static str,
    },
}

/// A dataset of problems: the evaluation benchmarks and the DAPO training set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetSpec {
    /// The name used in files and metric keys (`val-core/<name>/acc/mean@k`).
    pub name: &'static str,
    /// How a table heads its column (Table 1: `MATH500`, ..., `AIME-like`).
    pub heading: &'static str,
    /// File name in the data directory.
    pub file: &'static str,
    /// Problem count (a benchmark's weight in the weighted accuracy).
    pub rows: usize,
    /// Version of this loader's view of the data; bump when the file or its reading changes.
    pub version: &'static str,
    /// SHA-256 of `file` (the prepared copy's).
    pub sha256: &'static str,
    pub hub: Option<HubCopy>,
}

/// The dataset behind a benchmark role.
pub fn spec(b: Benchmark) -> &'static DatasetSpec {
    match b {
        Benchmark::Math500 => &math500::SPEC,
        Benchmark::Minerva => &minerva::SPEC,
        Benchmark::Olympiadbench => &olympiad::SPEC,
        Benchmark::AimeLike => &aime_like::SPEC,
    }
}

/// Where datasets are read from.
#[derive(Debug, Clone)]
pub enum DataLocation {
    Dir(PathBuf),
    Hub(HubOptions),
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}: SHA-256 {got} does not match the expected {want} for {name} v{version}: the file changed or is not the prepared copy")]
    Checksum {
        path: PathBuf,
        name: &'static str,
        version: &'static str,
        got: String,
        want: &'static str,
    },
    #[error("{path}:{line}: {reason}")]
    Row {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path}: {name} should have {want} rows, found {got}")]
    Rows {
        path: PathBuf,
        name: &'static str,
        want: usize,
        got: usize,
    },
    #[error("{name}: no faithful copy on the HF hub; give a data directory with {file} (--data-dir or ACPO_DATA_DIR)")]
    NoHubCopy {
        name: &'static str,
        file: &'static str,
    },
    #[error("{}: {name} is not in the data directory and has no faithful copy on the HF hub: put the prepared {file} there (--data-dir or ACPO_DATA_DIR)", dir.display())]
    Missing {
        dir: PathBuf,
        name: &'static str,
        file: &'static str,
    },
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
    #[error("{path}: parquet: {reason}")]
    Parquet { path: PathBuf, reason: String },
}

/// The data directory when none is given: `ACPO_DATA_DIR`, else `acpo/data` in the user's cache
/// (`XDG_CACHE_HOME`, else `~/.cache`).
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ACPO_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("acpo").join("data")
}

/// Loads a dataset, checking its checksum and row count. A file missing from the data
/// directory is read from its hub copy (downloaded unless `HF_HUB_OFFLINE`), where one exists.
pub fn load(spec: &DatasetSpec, from: &DataLocation) -> Result<Vec<Problem>, DataError> {
    match from {
        DataLocation::Dir(dir) if !dir.join(spec.file).exists() => match spec.hub {
            Some(_) => load(spec, &DataLocation::Hub(HubOptions::from_env())),
            None => Err(DataError::Missing {
                dir: dir.clone(),
                name: spec.name,
                file: spec.file,
            }),
        },
        DataLocation::Dir(dir) => {
            let path = dir.join(spec.file);
            let got = crate::checksum::sha256_file(&path).at(&path)?;
            if got != spec.sha256 {
                return Err(DataError::Checksum {
                    path,
                    name: spec.name,
                    version: spec.version,
                    got,
                    want: spec.sha256,
                });
            }
            let rows = read_jsonl(&path, "id", "problem", "answer")?;
            check_rows(spec, &path, rows)
        }
        DataLocation::Hub(opts) => match spec.hub {
            None => Err(DataError::NoHubCopy {
                name: spec.name,
                file: spec.file,
            }),
            Some(HubCopy::Jsonl {
                repo,
                file,
                id_field,
                problem_field,
                answer_field,
            }) => {
                let path = crate::hub::dataset_file(repo, file, opts)?;
                let rows = read_jsonl(&path, id_field, problem_field, answer_field)?;
                check_rows(spec, &path, rows)
            }
            Some(HubCopy::DapoParquet { repo, file }) => {
                // The hub release keeps whitespace variants the prepared copy merged: its
                // unique count is not the local file's (see dapo.rs); it must not be empty.
                let path = crate::hub::dataset_file(repo, file, opts)?;
                let rows = dapo::read_parquet(&path)?;
                if rows.is_empty() {
                    return Err(DataError::Rows {
                        path,
                        name: spec.name,
                        want: spec.rows,
                        got: 0,
                    });
                }
                Ok(rows)
            }
        },
    }
}

fn check_rows(
    spec: &DatasetSpec,
    path: &Path,
    rows: Vec<Problem>,
) -> Result<Vec<Problem>, DataError> {
    if rows.len() != spec.rows {
        return Err(DataError::Rows {
            path: path.to_owned(),
            name: spec.name,
            want: spec.rows,
            got: rows.len(),
        });
    }
    Ok(rows)
}

fn read_jsonl(
    path: &Path,
    id: &str,
    problem: &str,
    answer: &str,
) -> Result<Vec<Problem>, DataError> {
    let text = crate::files::read_to_string(path).at(path)?;
    let mut out = Vec::new();
    for (line, v) in crate::jsonl::values(&text) {
        let row = |reason: String| DataError::Row {
            path: path.to_owned(),
            line,
            reason,
        };
        let v = v.map_err(|e| row(e.to_string()))?;
        let field = |name: &str| -> Result<String, DataError> {
            match v.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
                _ => Err(row(format!("field `{name}` (a string) is missing"))),
            }
        };
        out.push(Problem {
            id: field(id)?,
            problem: field(problem)?,
            answer: field(answer)?,
        });
    }
    Ok(out)
}

/// DAPO's training prompt (the `source_prompt` of the DAPO release).
pub const DAPO_TEMPLATE_HEAD: &str = "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n";
pub const DAPO_TEMPLATE_TAIL: &str =
    "\n\nRemember to put your answer on its own line after \"Answer:\".";

/// The user message for a problem under a template.
pub fn render_prompt(template: PromptTemplate, problem: &str) -> String {
    match template {
        PromptTemplate::Dapo => format!("{DAPO_TEMPLATE_HEAD}{problem}{DAPO_TEMPLATE_TAIL}"),
        PromptTemplate::Boxed => {
            format!("{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
        }
        PromptTemplate::Answer => format!("{problem}\nPut the final answer after \"Answer:\"."),
        PromptTemplate::Raw => problem.to_string(),
    }
}
