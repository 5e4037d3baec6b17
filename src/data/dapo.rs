//! DAPO-Math-17k, the training set (Yu et al., DAPO), deduplicated.
//!
//! The prepared file holds the 17,917-row block of the release with exact-string duplicates
//! removed (17,290 rows). The hub release (`BytedTsinghua-SIA/DAPO-Math-17k`) is verl-format
//! parquet of that block repeated 100 times, with the DAPO template around each problem in
//! `prompt[0].content` and the answer in `reward_model.ground_truth`; it is read with polars,
//! the template stripped and exact duplicates dropped (first occurrence kept). Its problem texts
//! keep whitespace the prepared copy lost, so its unique count is about 17.4k, not 17,290.

use crate::files::AtPath;
use std::path::Path;

use polars::prelude::*;

use super::{DataError, DatasetSpec, HubCopy, Problem, DAPO_TEMPLATE_HEAD, DAPO_TEMPLATE_TAIL};

pub const SPEC: DatasetSpec = DatasetSpec {
    name: "dapo-math-17k",
    heading: "DAPO-Math-17k",
    file: "dapo_math_17k.jsonl",
    rows: 17_290,
    version: "1",
    sha256: "ea95ed82b454e71c71aa2854c34f30b6a30a220e1f120ae9ed2d2a9be5af6f5f",
    hub: Some(HubCopy::DapoParquet {
        repo: "BytedTsinghua-SIA/DAPO-Math-17k",
        file: "data/dapo-math-17k.parquet",
    }),
};

/// Reads verl-format DAPO parquet into deduplicated problems.
pub fn read_parquet(path: &Path) -> Result<Vec<Problem>, DataError> {
    let fail = |reason: String| DataError::Parquet {
        path: path.to_owned(),
        reason,
    };
    let file = crate::files::open(path).at(path)?;
    let df = ParquetReader::new(file)
        .finish()
        .map_err(|e| fail(e.to_string()))?;
    let column = |name: &str| -> Result<Series, DataError> {
        Ok(df
            .column(name)
            .map_err(|e| fail(format!("column `{name}`: {e}")))?
            .as_materialized_series()
            .clone())
    };
    let prompts = column("prompt")?;
    let prompts = prompts
        .list()
        .map_err(|e| fail(format!("column `prompt`: {e}")))?;
    let reward = column("reward_model")?;
    let truths = reward
        .struct_()
        .and_then(|s| s.field_by_name("ground_truth"))
        .map_err(|e| fail(format!("column `reward_model.ground_truth`: {e}")))?;
    let truths = truths
        .str()
        .map_err(|e| fail(format!("`reward_model.ground_truth`: {e}")))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for i in 0..df.height() {
        let messages = prompts
            .get_as_series(i)
            .ok_or_else(|| fail(format!("row {i}: no prompt")))?;
        let content = messages
            .struct_()
            .and_then(|s| s.field_by_name("content"))
            .map_err(|e| fail(format!("row {i}: prompt[0].content: {e}")))?;
        let content = content
            .str()
            .map_err(|e| fail(format!("row {i}: prompt content: {e}")))?;
        let text = content
            .get(0)
            .ok_or_else(|| fail(format!("row {i}: empty prompt")))?;
        let problem = text
            .strip_prefix(DAPO_TEMPLATE_HEAD)
            .and_then(|t| t.strip_suffix(DAPO_TEMPLATE_TAIL))
            .unwrap_or(text)
            .to_string();
        let answer = truths
            .get(i)
            .ok_or_else(|| fail(format!("row {i}: no ground truth")))?
            .to_string();
        if seen.insert(problem.clone()) {
            out.push(Problem {
                id: format!("dapo17k/{i}"),
                problem,
                answer,
            });
        }
    }
    Ok(out)
}
