//! verl's logs of a run → our run directory, so that `acpo report` and `acpo archive` read a
//! verl-trained run as they read ours (issue #21).
//!
//! Inputs, as verl 0.9.1 writes them:
//! - the file logger (`trainer.logger=[...,file]`): one JSON line per step,
//!   `{"step": N, "data": {"actor/pg_loss": ..., "val-core/...": ..., ...}}`;
//! - `trainer.validation_data_dir`: `<step>.jsonl`, one line per validation sample with `input`,
//!   `output`, `gts`, `score`, `step` and the extra keys the reward function returned. The
//!   `acpo_verl` reward function returns `data_source` (the benchmark) and `problem_id`.
//!
//! Outputs: `manifest.yaml`, `fingerprint`, `metrics.jsonl` (verl's numeric metrics: ours were
//! named after verl's, so names carry over; `reward/acc/mean`, which verl does not log, is
//! derived from `critic/score/mean` on the manifest's reward scale; `training/global_step`
//! added; the validation metrics are left to `eval.jsonl`), `eval.jsonl` (every validation dump re-judged by
//! our verifier, Avg@k per benchmark as `acpo eval` computes it: verl's own `score` is not
//! trusted), `provenance.json` (engine `verl`, the inputs' SHA-256) and `SHA256SUMS`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::eval::{bench_result, summarize, EvalSummary};
use crate::manifest::{Experiment, RewardKind};
use crate::run::{metric, Provenance, RunDir};

/// verl's mean sequence score, from which our accuracy metric is derived.
const VERL_SCORE: &str = "critic/score/mean";

/// Why verl's logs could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
}

type Result<T> = std::result::Result<T, ImportError>;

/// What an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub dir: PathBuf,
    pub steps: usize,
    pub evaluations: usize,
    pub samples: usize,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ImportError::Io {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::atomic::write(path, bytes).map_err(|source| ImportError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Imports the verl run of `manifest` from its file-logger `metrics` and its `validation`
/// directory into the run directory `out` (created; it must not hold a run already).
pub fn import(manifest: &Path, metrics: &Path, validation: &Path, out: &Path) -> Result<Imported> {
    let exp = Experiment::load(manifest)?;
    let steps = metrics_lines(metrics, exp.trainer.reward)?;
    let evals = evaluations(&exp, validation)?;
    let run = RunDir::at(out);
    if run.manifest().exists() {
        return Err(ImportError::Invalid {
            path: out.to_owned(),
            reason: "holds a run already: import into a new directory".into(),
        });
    }
    std::fs::create_dir_all(out).map_err(|source| ImportError::Io {
        path: out.to_owned(),
        source,
    })?;
    write(&run.manifest(), read(manifest)?.as_bytes())?;
    write(&run.fingerprint(), exp.fingerprint().as_bytes())?;
    let lines: Vec<String> = steps
        .iter()
        .map(|m| serde_json::to_string(m).expect("invariant: metrics are JSON"))
        .collect();
    write(&run.metrics(), crate::run::join_lines(&lines).as_bytes())?;
    let lines: Vec<String> = evals
        .iter()
        .map(|e| serde_json::to_string(e).expect("invariant: an evaluation is JSON"))
        .collect();
    write(&run.eval(), crate::run::join_lines(&lines).as_bytes())?;
    let mut provenance = Provenance::start(&exp, "verl");
    provenance.engine = Some("verl".into());
    provenance.hardware = BTreeMap::from([("engine".into(), "verl (imported logs)".into())]);
    provenance.data.insert(
        "verl metrics".into(),
        crate::checksum::sha256_file(metrics).map_err(|source| ImportError::Io {
            path: metrics.to_owned(),
            source,
        })?,
    );
    provenance.finish(steps.len());
    let json = serde_json::to_string_pretty(&provenance).expect("invariant: provenance is JSON");
    write(&run.provenance(), json.as_bytes())?;
    crate::archive::write_sums(out)?;
    Ok(Imported {
        dir: out.to_owned(),
        steps: steps.len(),
        evaluations: evals.len(),
        samples: evals
            .iter()
            .flat_map(|e| &e.benchmarks)
            .map(|b| b.problems * b.k)
            .sum(),
    })
}

/// The JSON values of a JSONL file's lines, each with its line number and an error maker that
/// names the file and the line.
fn json_lines(
    path: &Path,
    text: &str,
) -> Result<Vec<(serde_json::Value, impl Fn(String) -> ImportError)>> {
    crate::jsonl::values(text)
        .map(|(line, v)| {
            let path = path.to_owned();
            let bad = move |reason: String| ImportError::Line {
                path: path.clone(),
                line,
                reason,
            };
            let v = v.map_err(|e| bad(format!("not JSON: {e}")))?;
            Ok((v, bad))
        })
        .collect()
}

/// verl's file-logger lines as our metrics lines: numeric values (`reward/acc/mean` derived),
/// validation metrics left out, `training/global_step` added; steps strictly increasing.
fn metrics_lines(path: &Path, reward: RewardKind) -> Result<Vec<BTreeMap<String, f64>>> {
    let text = read(path)?;
    let mut out: Vec<BTreeMap<String, f64>> = Vec::new();
    let mut last = 0;
    for (v, bad) in json_lines(path, &text)? {
        let step = v
            .get("step")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad("no integer `step`".into()))? as usize;
        let data = v
            .get("data")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| bad("no object `data`".into()))?;
        if step <= last {
            return Err(bad(format!(
                "step {step} after step {last}: verl's file logger truncates on restart, so a run's steps only grow"
            )));
        }
        last = step;
        let mut m = BTreeMap::new();
        for (k, v) in data {
            if k.starts_with("val-") {
                continue; // re-judged into eval.jsonl
            }
            if let Some(x) = v.as_f64() {
                m.insert(k.clone(), x);
            }
        }
        if let Some(&score) = m.get(VERL_SCORE) {
            // a sequence scores 1 when correct, else 0 (binary) or −1 (signed)
            let acc = match reward {
                RewardKind::Binary => score,
                RewardKind::Signed => (score + 1.0) / 2.0,
            };
            m.entry(metric::ACC.to_owned()).or_insert(acc);
        }
        m.insert(metric::STEP.to_owned(), step as f64);
        out.push(m);
    }
    if out.is_empty() {
        return Err(ImportError::Invalid {
            path: path.to_owned(),
            reason: "no steps".into(),
        });
    }
    Ok(out)
}

/// Every `<step>.jsonl` of the validation directory, re-judged: one evaluation per step.
fn evaluations(exp: &Experiment, dir: &Path) -> Result<Vec<EvalSummary>> {
    let entries = std::fs::read_dir(dir).map_err(|source| ImportError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<(usize, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let step = p.file_stem()?.to_str()?.parse().ok()?;
            (p.extension()? == "jsonl").then_some((step, p))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ImportError::Invalid {
            path: dir.to_owned(),
            reason: "no <step>.jsonl validation dumps".into(),
        });
    }
    files
        .iter()
        .map(|(step, path)| evaluation(exp, *step, path))
        .collect()
}

/// One validation dump: each sample judged by our verifier against its gold answer, grouped
/// by benchmark and problem; every problem must have the manifest's k samples.
fn evaluation(exp: &Experiment, step: usize, path: &Path) -> Result<EvalSummary> {
    let text = read(path)?;
    // benchmark → problem id → verdicts
    let mut judged: BTreeMap<String, BTreeMap<String, Vec<bool>>> = BTreeMap::new();
    for (v, bad) in json_lines(path, &text)? {
        let field = |name: &str| -> Result<String> {
            match v.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(serde_json::Value::Number(x)) => Ok(x.to_string()),
                _ => Err(bad(format!(
                    "no `{name}` (the acpo_verl reward function writes `data_source` and `problem_id`)"
                ))),
            }
        };
        let (source, problem) = (field("data_source")?, field("problem_id")?);
        let (output, gold) = (field("output")?, field("gts")?);
        if !exp.eval.benchmarks.iter().any(|b| b.name() == source) {
            return Err(bad(format!(
                "benchmark `{source}` is not one of the manifest's ({})",
                exp.eval
                    .benchmarks
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let verdict = crate::verify::verify(&gold, &output);
        judged
            .entry(source)
            .or_default()
            .entry(problem)
            .or_default()
            .push(verdict.correct);
    }
    let k = exp.eval.sampling.n;
    let mut results = Vec::new();
    for b in &exp.eval.benchmarks {
        let problems = judged
            .remove(b.name())
            .ok_or_else(|| ImportError::Invalid {
                path: path.to_owned(),
                reason: format!("no samples of benchmark `{}`", b.name()),
            })?;
        if let Some((id, got)) = problems.iter().find(|(_, c)| c.len() != k) {
            return Err(ImportError::Invalid {
                path: path.to_owned(),
                reason: format!(
                    "problem `{id}` of `{}` has {} samples, the manifest's eval.k is {k}",
                    b.name(),
                    got.len()
                ),
            });
        }
        let (ids, correct): (Vec<String>, Vec<Vec<bool>>) = problems.into_iter().unzip();
        results.push(bench_result(b.name(), &ids, &correct));
    }
    Ok(summarize(step, results))
}
