//! verl's logs of a run → our run directory, so that `acpo report` and `acpo archive` read a
//! verl-trained run as they read ours (issue #21).
//!
//! Inputs, as verl 0.9.1 writes them (read in its source, `verl/utils/tracking.py` and
//! `verl/trainer/ppo/ray_trainer.py`):
//! - the file logger (`trainer.logger=[...,file]`): one JSON line per step,
//!   `{"step": N, "data": {"actor/pg_loss": ..., "val-core/...": ..., ...}}`, written with
//!   orjson, which writes NaN and ±∞ as `null`; with `trainer.val_before_train` (the export's
//!   launch sets it) a first line at step 0 holds the initial validation alone. A logger on
//!   Python's `json` writes bare `NaN` / `Infinity` instead: read as `null` too
//!   ([`crate::jsonl::read`]). Non-finite metrics go into the provenance by step, never into
//!   metrics.jsonl as numbers;
//! - `trainer.validation_data_dir`: `<step>.jsonl`, one line per validation sample with `input`,
//!   `output`, `gts`, `score`, `step` and the extra keys the reward function returned. The
//!   `acpo.verl` reward function returns `data_source` (the benchmark) and `problem_id`.
//!
//! The inputs are regular files streamed line by line (a paper run's dumps reach gigabytes;
//! a pipe would never end). The run is built in a staging directory beside `--out` and renamed
//! into place when complete: `--out` must not exist, or be a sealed run this command made (it is
//! then replaced); nothing else is written into.
//!
//! Outputs: `manifest.yaml`, `fingerprint`, `metrics.jsonl` (verl's numeric metrics: ours were
//! named after verl's, so names carry over; `reward/acc/mean`, which verl does not log, is
//! derived from `critic/score/mean` on the manifest's reward scale; `training/global_step`
//! added; the validation metrics are left to `eval.jsonl`), `eval.jsonl` (every validation dump re-judged by
//! our verifier, Avg@k per benchmark as `acpo eval` computes it: verl's own `score` is not
//! trusted), `provenance.json` (engine `verl`, the inputs' SHA-256) and `SHA256SUMS`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::eval::{bench_result, summarize, EvalSummary};
use crate::files::{AtPath, PathIoError};
use crate::manifest::Experiment;
use crate::reward::RewardKind;
use crate::run::{metric, Provenance, RunDir};

/// verl's mean sequence score, from which our accuracy metric is derived.
const VERL_SCORE: &str = "critic/score/mean";

/// The longest line read from verl's logs: a validation sample holds a prompt and a response of
/// up to 8k tokens, far below this.
const MAX_LINE: usize = 64 << 20;

/// Why verl's logs could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {0}")]
    Stream(crate::jsonl::ReadError),
    #[error("cannot write {}: {}", .0.path.display(), .0.source)]
    Write(PathIoError),
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
    /// Metric values verl logged as non-finite (left out of metrics.jsonl, listed in the
    /// provenance).
    pub non_finite: usize,
    /// Benchmarks whose problem ids could not be checked: their data is not on this machine.
    pub unchecked_ids: Vec<&'static str>,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::atomic::write(path, bytes).map_err(ImportError::Write)
}

/// Whether an import may go to `out`: a new directory, or a sealed run an earlier import made
/// (true: it is replaced).
fn destination(out: &Path) -> Result<bool> {
    if out.file_name().is_none() {
        return Err(ImportError::Invalid {
            path: out.to_owned(),
            reason: "--out must name a new directory".into(),
        });
    }
    if !out.exists() {
        return Ok(false);
    }
    let run = RunDir::at(out);
    let imported = crate::files::read(run.provenance())
        .ok()
        .and_then(|b| serde_json::from_slice::<Provenance>(&b).ok())
        .is_some_and(|p| p.engine.as_deref() == Some("verl"));
    if out.is_dir() && imported && run.is_sealed() {
        return Ok(true);
    }
    Err(ImportError::Invalid {
        path: out.to_owned(),
        reason: "exists and is not a run `acpo import verl` made: import into a new directory (nothing was written)".into(),
    })
}

/// Imports the verl run of `manifest` from its file-logger logs `metrics` (one per launch
/// attempt, in the order they ran) and its `validation` directory into the run directory
/// `out`: a new directory, or a sealed run an earlier import made, which is replaced.
/// Everything is built in a staging directory beside `out` and renamed into place when
/// complete.
///
/// A relaunch resumes from verl's last checkpoint and logs the steps after it again, into a
/// log of its own (verl's file logger opens its file with "w": the export's launch gives each
/// attempt its own name so none is truncated). The attempts are merged by step: a later
/// attempt's lines replace the earlier ones' from its first step on.
pub fn import(
    manifest: &Path,
    metrics: &[PathBuf],
    validation: &Path,
    out: &Path,
) -> Result<Imported> {
    let exp = Experiment::load(manifest)?;
    let (steps, non_finite) = attempts(metrics, &exp)?;
    let last = steps
        .last()
        .and_then(|m| m.get(metric::STEP))
        .map_or(0, |&s| s as usize);
    let known = known_problems(&exp, &crate::data::default_dir())?;
    let evals = evaluations(&exp, validation, last, &known)?;
    destination(out)?;
    let written = |path: &Path, r: std::io::Result<()>| r.at(path).map_err(ImportError::Write);
    let staged = crate::atomic::StagedDir::new(out, "import")
        .at(crate::atomic::staging(out, "import"))
        .map_err(ImportError::Write)?;
    let stage = staged.path().to_owned();
    let run = RunDir::at(&stage);
    let text = crate::files::read_to_string(manifest).map_err(|source| ImportError::Read {
        path: manifest.to_owned(),
        source,
    })?;
    write(&run.manifest(), text.as_bytes())?;
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
    for (i, path) in metrics.iter().enumerate() {
        let key = if metrics.len() == 1 {
            "verl metrics".to_string()
        } else {
            format!("verl metrics, attempt {}", i + 1)
        };
        provenance.data.insert(
            key,
            crate::checksum::sha256_file(path).map_err(|source| ImportError::Read {
                path: path.to_owned(),
                source,
            })?,
        );
    }
    provenance.non_finite_metrics = non_finite.clone();
    provenance.finish(steps.len());
    let json = serde_json::to_string_pretty(&provenance).expect("invariant: provenance is JSON");
    write(&run.provenance(), json.as_bytes())?;
    crate::archive::write_sums(&stage)?;
    // The commit: the staged run takes `out`'s place (an earlier import's, moved aside first).
    written(out, staged.commit(out))?;
    Ok(Imported {
        dir: out.to_owned(),
        steps: steps.len(),
        evaluations: evals.len(),
        samples: evals
            .iter()
            .flat_map(|e| &e.benchmarks)
            .map(|b| b.problems * b.k)
            .sum(),
        non_finite: non_finite.values().map(Vec::len).sum(),
        unchecked_ids: exp
            .eval
            .benchmarks
            .iter()
            .filter(|b| !known.contains_key(b.name()))
            .map(|b| b.name())
            .collect(),
    })
}

/// The problem ids each benchmark evaluates (its first `eval.limit` problems), for the
/// benchmarks whose prepared file is in the data directory `dir`; the others are left out (their
/// ids cannot be checked on this machine, and the import says so). A file there that is not the
/// prepared copy is an error.
fn known_problems(
    exp: &Experiment,
    dir: &Path,
) -> Result<BTreeMap<&'static str, BTreeSet<String>>> {
    let mut known = BTreeMap::new();
    for b in &exp.eval.benchmarks {
        let spec = crate::data::spec(*b);
        if !dir.join(spec.file).is_file() {
            continue;
        }
        let problems = crate::data::load(spec, &crate::data::DataLocation::Dir(dir.to_owned()))
            .map_err(|e| ImportError::Invalid {
                path: dir.join(spec.file),
                reason: format!("cannot check the problem ids of `{}`: {e}", b.name()),
            })?;
        let limit = exp.eval.limit.unwrap_or(problems.len());
        known.insert(
            b.name(),
            problems.into_iter().take(limit).map(|p| p.id).collect(),
        );
    }
    Ok(known)
}

/// Why a stream of lines stopped: the file, or what a line held.
enum Stop {
    Read(crate::jsonl::ReadError),
    Import(ImportError),
}

impl From<crate::jsonl::ReadError> for Stop {
    fn from(e: crate::jsonl::ReadError) -> Stop {
        Stop::Read(e)
    }
}

/// Every JSON line of the file `path`, streamed to `f` with an error maker naming the line.
fn json_lines(
    path: &Path,
    mut f: impl FnMut(serde_json::Value, &dyn Fn(String) -> ImportError) -> Result<()>,
) -> Result<()> {
    crate::jsonl::read(path, MAX_LINE, |line| {
        let bad = |reason: String| ImportError::Line {
            path: path.to_owned(),
            line: line.number,
            reason,
        };
        line.value
            .map_err(|e| bad(format!("not JSON: {e}")))
            .and_then(|v| f(v, &bad))
            .map_err(Stop::Import)
    })
    .map_err(|stop| match stop {
        Stop::Read(e) => ImportError::Stream(e),
        Stop::Import(e) => e,
    })
}

/// Steps and metric names verl logged as non-finite.
type NonFinite = BTreeMap<String, Vec<usize>>;

/// verl's file-logger lines as our metrics lines: numeric values (`reward/acc/mean` derived),
/// validation metrics left out, `training/global_step` added; steps strictly increasing after
/// an initial validation at step 0. Null values (verl's NaN and ±∞) are returned apart.
/// The steps of every attempt's log merged in order: each later attempt's steps replace the
/// earlier attempts' from its first step on (a resumed run logs again from its checkpoint).
fn attempts(
    paths: &[PathBuf],
    exp: &Experiment,
) -> Result<(Vec<BTreeMap<String, f64>>, NonFinite)> {
    let Some(first) = paths.first() else {
        return Err(ImportError::Invalid {
            path: PathBuf::from("--metrics"),
            reason: "no file-logger log given".into(),
        });
    };
    let step_of = |m: &BTreeMap<String, f64>| m.get(metric::STEP).map_or(0, |&s| s as usize);
    let (mut steps, mut non_finite) = metrics_lines(first, exp)?;
    for path in &paths[1..] {
        let (later, later_non_finite) = metrics_lines(path, exp)?;
        let from = later.first().map_or(usize::MAX, step_of);
        steps.retain(|m| step_of(m) < from);
        steps.extend(later);
        for steps_of in non_finite.values_mut() {
            steps_of.retain(|&s| s < from);
        }
        for (k, v) in later_non_finite {
            non_finite.entry(k).or_default().extend(v);
        }
        non_finite.retain(|_, v| !v.is_empty());
    }
    Ok((steps, non_finite))
}

fn metrics_lines(path: &Path, exp: &Experiment) -> Result<(Vec<BTreeMap<String, f64>>, NonFinite)> {
    let (reward, total) = (exp.trainer.reward, exp.trainer.total_steps);
    let mut out: Vec<BTreeMap<String, f64>> = Vec::new();
    let mut non_finite = NonFinite::new();
    let mut last: Option<usize> = None;
    json_lines(path, |v, bad| {
        let step = v
            .get("step")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad("no integer `step`".into()))? as usize;
        let data = v
            .get("data")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| bad("no object `data`".into()))?;
        if let Some(last) = last.filter(|&l| step <= l) {
            return Err(bad(format!(
                "step {step} after step {last}: within one attempt's log a run's steps only grow (a relaunch's steps go in a log of its own: give each with --metrics, in order)"
            )));
        }
        if step > total {
            return Err(bad(format!(
                "field `step`: step {step}, beyond the manifest's trainer.total_steps ({total})"
            )));
        }
        last = Some(step);
        if step == 0 {
            // the initial validation (val_before_train): its samples are in 0.jsonl
            return Ok(());
        }
        let mut m = BTreeMap::new();
        for (k, v) in data {
            if k.starts_with("val-") {
                continue; // re-judged into eval.jsonl
            }
            match v {
                serde_json::Value::Null => non_finite.entry(k.clone()).or_default().push(step),
                v => {
                    if let Some(x) = v.as_f64() {
                        if let Some((lo, hi, what)) = bounded_metric(k, reward) {
                            if !(lo..=hi).contains(&x) {
                                return Err(bad(format!(
                                    "field `data.{k}`: {x} is outside [{lo}, {hi}], the range of {what}"
                                )));
                            }
                        }
                        m.insert(k.clone(), x);
                    }
                }
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
        Ok(())
    })?;
    if out.is_empty() {
        return Err(ImportError::Invalid {
            path: path.to_owned(),
            reason: "no training steps".into(),
        });
    }
    Ok((out, non_finite))
}

/// The range of a metric that is an accuracy or a sequence's score, and what it is: accuracies
/// (`.../acc/...`, ours and any verl logs) are fractions of correct answers, in [0, 1]; verl's
/// scores (`critic/score/*`) are a sequence's reward, 1 when correct, else 0 (binary) or −1
/// (signed). Other metrics (losses, lengths, timings) have no range.
fn bounded_metric(key: &str, reward: RewardKind) -> Option<(f64, f64, &'static str)> {
    let accuracy = key == metric::ACC || key.split('/').any(|part| part == "acc");
    if accuracy {
        return Some((0.0, 1.0, "an accuracy"));
    }
    key.strip_prefix("critic/score/")
        .filter(|stat| ["mean", "max", "min"].contains(stat))
        .map(|_| match reward {
            RewardKind::Binary => (0.0, 1.0, "a sequence's score with the binary reward"),
            RewardKind::Signed => (-1.0, 1.0, "a sequence's score with the signed reward"),
        })
}

/// Every `<step>.jsonl` of the validation directory, re-judged: one evaluation per step. A
/// dump's name is its step as verl writes it (`5.jsonl`: decimal digits, no sign or leading
/// zero, so no two names are one step), at a step the manifest evaluates at
/// ([`crate::manifest::TrainerSpec::evaluates_at`], the schedule the export gave verl) and at
/// most `last`, the last step verl logged (issue #47: `05.jsonl` and `+5.jsonl` were two more
/// evaluations at step 5, and a dump at step 999 of a 20-step log was taken).
fn evaluations(
    exp: &Experiment,
    dir: &Path,
    last: usize,
    known: &Known,
) -> Result<Vec<EvalSummary>> {
    let entries = std::fs::read_dir(dir).map_err(|source| ImportError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<(usize, PathBuf)> = Vec::new();
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    paths.sort();
    for path in paths {
        let invalid = |reason: String| ImportError::Invalid {
            path: path.clone(),
            reason,
        };
        // A pipe named like a dump is refused as what it is, before its name is judged.
        crate::files::regular(&path).map_err(|source| ImportError::Read {
            path: path.clone(),
            source,
        })?;
        let step = dump_step(&path).ok_or_else(|| {
            invalid("not a validation dump's name: verl names each `<step>.jsonl`, the step in decimal digits without a sign or a leading zero".into())
        })?;
        if step > last {
            return Err(invalid(format!(
                "a validation at step {step}, after the last step verl logged ({last})"
            )));
        }
        if !exp.trainer.evaluates_at(step) {
            return Err(invalid(format!(
                "a validation at step {step}, which the manifest does not evaluate at (trainer.eval_every {}, trainer.total_steps {}, val_before_train {}: verl's test_freq, total steps and val_before_train as exported)",
                exp.trainer.eval_every,
                exp.trainer.total_steps,
                exp.trainer.evaluates_at_start()
            )));
        }
        files.push((step, path));
    }
    files.sort();
    if files.is_empty() {
        return Err(ImportError::Invalid {
            path: dir.to_owned(),
            reason: "no <step>.jsonl validation dumps".into(),
        });
    }
    files
        .iter()
        .map(|(step, path)| evaluation(exp, *step, path, known))
        .collect()
}

/// The step a dump is named after: `<step>.jsonl` with the step as verl writes it (decimal
/// digits, `0` or no leading zero), or None.
fn dump_step(path: &Path) -> Option<usize> {
    let stem = path.file_stem()?.to_str()?;
    let canonical = !stem.is_empty()
        && stem.bytes().all(|b| b.is_ascii_digit())
        && (stem == "0" || !stem.starts_with('0'));
    canonical.then(|| stem.parse().ok()).flatten()
}

/// The problem ids of each benchmark whose data is on this machine ([`known_problems`]).
type Known = BTreeMap<&'static str, BTreeSet<String>>;

/// One validation dump: each sample judged by our verifier against its gold answer, grouped
/// by benchmark and problem; every problem must have the manifest's k samples. A benchmark has
/// at most the problems the manifest evaluates (its size, at most `eval.limit`), and where its
/// data is on this machine each id must be one of them.
fn evaluation(exp: &Experiment, step: usize, path: &Path, known: &Known) -> Result<EvalSummary> {
    // benchmark → problem id → verdicts
    let mut judged: BTreeMap<String, BTreeMap<String, Vec<bool>>> = BTreeMap::new();
    json_lines(path, |v, bad| {
        let field = |name: &str| -> Result<String> {
            match v.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(serde_json::Value::Number(x)) => Ok(x.to_string()),
                _ => Err(bad(format!(
                    "no `{name}` (the acpo.verl reward function writes `data_source` and `problem_id`)"
                ))),
            }
        };
        let (source, problem) = (field("data_source")?, field("problem_id")?);
        let (output, gold) = (field("output")?, field("gts")?);
        let Some(bench) = exp.eval.benchmarks.iter().find(|b| b.name() == source) else {
            return Err(bad(format!(
                "benchmark `{source}` is not one of the manifest's ({})",
                exp.eval
                    .benchmarks
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if known
            .get(bench.name())
            .is_some_and(|ids| !ids.contains(&problem))
        {
            return Err(bad(format!(
                "field `problem_id`: `{problem}` is not one of the problems of `{source}` the manifest evaluates"
            )));
        }
        let problems = judged.entry(source).or_default();
        let most = exp.eval.limit.map_or(bench.size(), |l| l.min(bench.size()));
        if !problems.contains_key(&problem) && problems.len() == most {
            return Err(bad(format!(
                "field `problem_id`: `{problem}` is a problem beyond the {most} of `{}` the manifest evaluates (its size {}, eval.limit {})",
                bench.name(),
                bench.size(),
                exp.eval.limit.map_or_else(|| "unset".to_string(), |l| l.to_string())
            )));
        }
        let verdict = crate::verify::verify(&gold, &output);
        problems.entry(problem).or_default().push(verdict.correct);
        Ok(())
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump's problem id must be one of the problems the manifest evaluates where the
    /// benchmark's problems are known ([`known_problems`] reads them from the prepared data).
    #[test]
    fn a_problem_id_the_benchmark_does_not_have_is_refused_naming_the_line_and_field() {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/paper/qwen3-1.7b-grpo.yaml");
        let exp = Experiment::load(&manifest).expect("manifest");
        let dir = tempfile::tempdir().expect("tmp");
        let dump = dir.path().join("0.jsonl");
        let line = |id: &str| {
            serde_json::json!({"output": "\\boxed{1}", "gts": "1", "data_source": "math500", "problem_id": id})
                .to_string()
        };
        std::fs::write(
            &dump,
            format!("{}\n{}\n", line("test/a/1.json"), line("math500/7")),
        )
        .expect("w");
        let known: Known =
            BTreeMap::from([("math500", BTreeSet::from(["test/a/1.json".to_string()]))]);
        let err = evaluation(&exp, 0, &dump, &known).expect_err("an unknown id");
        let msg = err.to_string();
        assert!(
            msg.contains("0.jsonl, line 2")
                && msg.contains("`problem_id`")
                && msg.contains("`math500/7`"),
            "{msg}"
        );
        // Unknown benchmarks' ids are not checked: the same dump stops at the sample count.
        let err = evaluation(&exp, 0, &dump, &Known::new()).expect_err("one sample, k = 16");
        assert!(err.to_string().contains("samples"), "{err}");
    }
}
