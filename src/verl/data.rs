//! The training set and the benchmarks as verl's parquet files (issue #21), the layout of
//! verl's `examples/data_preprocess` (and of the hub's DAPO-Math-17k copy): `data_source`;
//! `prompt`, the chat messages (one user turn, rendered with the manifest's prompt template:
//! verl applies the model's chat template itself); `ability`; `reward_model` {`style`: "rule",
//! `ground_truth`}; `extra_info` {`split`, `index`, `problem_id`}. The `acpo.verl` reward function
//! judges `ground_truth` with our verifier and returns `data_source` and `problem_id`, which
//! verl's validation dumps carry to `acpo import verl`.

use crate::files::AtPath;
use std::path::{Path, PathBuf};

use polars::prelude::*;

use crate::data::{self, DataError, DataLocation, Problem};
use crate::data::{DataSuite, PromptTemplate};
use crate::manifest::Experiment;

/// `data_source` of the training rows.
pub const TRAIN_SOURCE: &str = "dapo-math-17k";

/// One written file and its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub path: PathBuf,
    pub rows: usize,
}

fn fail(path: &Path, e: impl std::fmt::Display) -> DataError {
    DataError::Parquet {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Writes `<dir>/dapo-math-17k.parquet` and `<dir>/<benchmark>.parquet` for `exp`'s
/// training set and benchmarks, read from `from` (checksummed as for training).
pub fn write_parquet(
    exp: &Experiment,
    from: &DataLocation,
    dir: &Path,
) -> Result<Vec<Written>, DataError> {
    if exp.data.suite != DataSuite::Real {
        return Err(fail(
            dir,
            "the synthetic task has no verl parquet files (data.suite: real only)",
        ));
    }
    std::fs::create_dir_all(dir).at(dir)?;
    let mut written = Vec::new();
    let train = data::load(&data::dapo::SPEC, from)?;
    let path = dir.join(format!("{TRAIN_SOURCE}.parquet"));
    write_split(
        &path,
        TRAIN_SOURCE,
        "train",
        &train,
        exp.data.prompt_template,
    )?;
    written.push(Written {
        path,
        rows: train.len(),
    });
    for b in &exp.eval.benchmarks {
        let problems = data::load(data::spec(*b), from)?;
        let path = dir.join(format!("{}.parquet", b.name()));
        write_split(&path, b.name(), "test", &problems, exp.eval.prompt_template)?;
        written.push(Written {
            path,
            rows: problems.len(),
        });
    }
    Ok(written)
}

/// One split's rows in verl's layout.
fn write_split(
    path: &Path,
    source: &str,
    split: &str,
    problems: &[Problem],
    template: PromptTemplate,
) -> Result<(), DataError> {
    let n = problems.len();
    let prompts: ListChunked = problems
        .iter()
        .map(|p| {
            let role = Series::new("role".into(), ["user"]);
            let content = Series::new(
                "content".into(),
                [data::render_prompt(template, &p.problem)],
            );
            StructChunked::from_series("item".into(), 1, [role, content].iter())
                .map(|s| Some(s.into_series()))
        })
        .collect::<PolarsResult<_>>()
        .map_err(|e| fail(path, e))?;
    let strings = |name: &str, f: &dyn Fn(usize, &Problem) -> String| {
        Series::new(
            name.into(),
            problems
                .iter()
                .enumerate()
                .map(|(i, p)| f(i, p))
                .collect::<Vec<_>>(),
        )
    };
    let reward = StructChunked::from_series(
        "reward_model".into(),
        n,
        [
            strings("style", &|_, _| "rule".into()),
            strings("ground_truth", &|_, p| p.answer.clone()),
        ]
        .iter(),
    )
    .map_err(|e| fail(path, e))?;
    let index: Vec<i64> = (0..n as i64).collect();
    let extra = StructChunked::from_series(
        "extra_info".into(),
        n,
        [
            strings("split", &|_, _| split.into()),
            Series::new("index".into(), index),
            strings("problem_id", &|_, p| p.id.clone()),
        ]
        .iter(),
    )
    .map_err(|e| fail(path, e))?;
    let mut df = DataFrame::new(
        n,
        vec![
            strings("data_source", &|_, _| source.into()).into(),
            prompts.with_name("prompt".into()).into_series().into(),
            strings("ability", &|_, _| "math".into()).into(),
            reward.into_series().into(),
            extra.into_series().into(),
        ],
    )
    .map_err(|e| fail(path, e))?;
    let mut temp = crate::atomic::Temp::beside(path).at(path)?;
    ParquetWriter::new(temp.file())
        .finish(&mut df)
        .map_err(|e| fail(path, e))?;
    Ok(temp.commit(path).at(path)?)
}
