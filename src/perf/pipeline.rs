//! `acpo pipeline`: a paper run end to end before any real weights (issue #34). Any paper
//! manifest is derived into one whose model is random weights of the same config and whose
//! batch sizes are divided by a stated factor, everything else kept: the real tokenizer and chat
//! template, DAPO-Math-17k's prompts, the prompt and response limits (1,024 + 8,196), n rollouts
//! per prompt, the optimizer steps per training step, the critic of the PPO types, evaluation on
//! the real benchmarks (the first problems of each). It is trained for a few steps by the same
//! trainer, and its run directory holds what a mini run's does: metrics with every phase's time,
//! tokens and peak memory (`timing_s/*`, `perf/*`), the evaluation, a checkpoint.
//!
//! Random weights rarely stop early, so their responses run to the limit: what is measured is
//! the worst case, and the report says so. [`report`] puts each run's phases in a table and
//! costs the 16 paper runs from them ([`super::plan`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{write_report, PerfError, Result};
use crate::manifest::{raw, Experiment, InitTokenizer, ModelSource, Scale, TokenizerFiles};
use crate::run::RunDir;

/// How a paper manifest becomes a pipeline run.
#[derive(Debug, Clone)]
pub struct Derivation {
    /// Prompts per step and per mini-batch are divided by this (it must divide both).
    pub divisor: usize,
    /// Training steps; the evaluation and the checkpoint come after the last.
    pub steps: usize,
    /// Problems per benchmark evaluated (the first ones).
    pub eval_limit: usize,
    /// The real tokenizer; None: the manifest's own model's, from the hub (cache).
    pub tokenizer: Option<PathBuf>,
    /// The HF config of each model, named after its repo (`qwen3-1.7b.json`).
    pub configs: PathBuf,
    /// Where the random models are created (one per config, shared by the runs).
    pub models: PathBuf,
    /// Another config for every run's model (a quick check of the pipeline on a CPU with a
    /// small model); None: each run's own.
    pub config: Option<PathBuf>,
    /// Another device for every run; None: each manifest's own.
    pub device: Option<crate::manifest::Device>,
    /// Sequences per micro-batch (memory only: the loss aggregates exactly across them); None:
    /// the manifest's, reduced to divide the smaller mini-batch.
    pub micro_batch: Option<usize>,
}

fn invalid(path: &Path, field: &str, reason: impl Into<String>) -> PerfError {
    PerfError::Manifest(crate::manifest::ManifestError::Invalid {
        path: path.to_owned(),
        field: field.into(),
        reason: reason.into(),
    })
}

/// The pipeline manifest of the manifest `text` (read from `path`): the experiment and the YAML
/// its run directory keeps, a header saying what was derived from what.
pub fn derive(text: &str, path: &Path, d: &Derivation) -> Result<(Experiment, String)> {
    let exp = Experiment::from_yaml(text, path)?;
    let mut m: raw::Manifest = serde_saphyr::from_str(text).map_err(|e| {
        PerfError::Manifest(crate::manifest::ManifestError::Syntax {
            path: path.to_owned(),
            message: e.to_string(),
        })
    })?;
    let (repo, revision) =
        match &exp.model.source {
            ModelSource::Hub { repo, revision } => (repo.clone(), revision.clone()),
            ModelSource::Dir(_) => return Err(invalid(
                path,
                "model",
                "a pipeline run replaces a hub model (model.repo) by random weights of its config",
            )),
        };
    if d.divisor == 0 || d.steps == 0 || d.eval_limit == 0 {
        return Err(PerfError::Shape(
            "--divisor, --steps and --eval-limit must be at least 1".into(),
        ));
    }
    for (field, v) in [
        ("trainer.batch_size", m.trainer.batch_size),
        ("actor.mini_batch_size", m.actor.mini_batch_size),
    ] {
        if v % d.divisor != 0 {
            return Err(invalid(
                path,
                field,
                format!("{v} is not divisible by --divisor {}", d.divisor),
            ));
        }
    }
    let stem = exp.model.source.label().to_lowercase();
    let config = d
        .config
        .clone()
        .unwrap_or_else(|| d.configs.join(format!("{stem}.json")));
    let stem = match &d.config {
        Some(c) => c
            .file_stem()
            .map_or_else(|| "config".into(), |s| s.to_string_lossy().into_owned()),
        None => stem,
    };
    if !config.is_file() {
        return Err(PerfError::Io {
            path: config,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no config for this model"),
        });
    }
    let tokenizer = match &d.tokenizer {
        Some(dir) => TokenizerFiles::Dir { dir: dir.clone() },
        None => TokenizerFiles::Hub {
            repo: repo.clone(),
            revision: revision.clone(),
        },
    };
    let name = format!("{}-random", m.name);
    m.description = Some(format!(
        "{} at its own shapes on random weights (acpo pipeline): batch sizes / {}, {} steps, {} problems per benchmark",
        m.name, d.divisor, d.steps, d.eval_limit
    ));
    m.name = name;
    m.scale = Scale::Pipeline;
    if let Some(device) = d.device {
        m.device = device;
    }
    m.model.repo = None;
    m.model.revision = None;
    m.model.dir = Some(d.models.join(&stem));
    m.model.init = Some(raw::ModelInit {
        config,
        seed: 0,
        tokenizer: Some(InitTokenizer::Files(tokenizer)),
        warm_start: None,
    });
    m.trainer.batch_size /= d.divisor;
    m.actor.mini_batch_size /= d.divisor;
    let responses = m.actor.mini_batch_size * m.rollout.n;
    m.actor.micro_batch_size = d
        .micro_batch
        .or(m.actor.micro_batch_size)
        .map(|mb| gcd(mb, responses));
    m.trainer.total_steps = d.steps;
    // one evaluation, after the last step
    m.trainer.val_before_train = Some(false);
    m.trainer.eval_every = d.steps;
    m.trainer.checkpoint_every = d.steps;
    // the r·Â tails (and the PPO types' difficulty probe) once, at the last step
    if m.trainer.tails_every > 0 {
        m.trainer.tails_every = d.steps;
    }
    m.eval.limit = Some(m.eval.limit.map_or(d.eval_limit, |l| l.min(d.eval_limit)));
    let body = serde_saphyr::to_string(&m).map_err(|e| {
        PerfError::Shape(format!(
            "{}: cannot write the derived manifest: {e}",
            path.display()
        ))
    })?;
    let text = format!(
        "# Derived by `acpo pipeline` from {}: random weights of {}'s config, batch sizes / {},\n# steps: {}, problems per benchmark: {}. Measures cost and fit, not accuracy.\n{body}",
        path.display(),
        repo,
        d.divisor,
        d.steps,
        d.eval_limit,
    );
    let exp = Experiment::from_yaml(&text, path)?;
    Ok((exp, text))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One phase of a pipeline run, summed over its steps.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseCost {
    pub phase: String,
    /// Seconds per step (the evaluation's and the checkpoint's: per time they ran).
    pub seconds: f64,
    pub tokens: Option<f64>,
    pub tokens_per_second: Option<f64>,
    /// The most device memory in use during the phase, over the steps (CUDA).
    pub peak_gb: Option<f64>,
}

/// A pipeline run's phases, as its metrics recorded them.
#[derive(Debug, Clone, Serialize)]
pub struct RunPhases {
    pub run: String,
    /// The paper manifest it was derived from.
    pub paper_run: String,
    pub steps: usize,
    pub phases: Vec<PhaseCost>,
    /// Responses per step, and their prompt and response tokens (what a step trains on).
    pub responses: usize,
    pub step_tokens: f64,
    /// Mean response length over the limit: 1 when every response ran to its end.
    pub response_share: f64,
}

/// The phases of the run in `dir` (its metrics.jsonl), averaged over its steps.
pub fn run_phases(dir: &Path, exp: &Experiment, paper_run: &str) -> Result<RunPhases> {
    let run = RunDir::at(dir);
    let text = std::fs::read_to_string(run.metrics()).map_err(|source| PerfError::Io {
        path: run.metrics(),
        source,
    })?;
    let lines: Vec<serde_json::Map<String, serde_json::Value>> = text
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| PerfError::Shape(format!("{}: {e}", run.metrics().display())))
        })
        .collect::<Result<_>>()?;
    let mut names: Vec<String> = Vec::new();
    for l in &lines {
        for k in l.keys() {
            if let Some(n) = k.strip_prefix("timing_s/") {
                if !names.iter().any(|x| x == n) {
                    names.push(n.to_string());
                }
            }
        }
    }
    let mean = |key: &str| -> Option<f64> {
        let v: Vec<f64> = lines.iter().filter_map(|l| l.get(key)?.as_f64()).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let max = |key: &str| -> Option<f64> {
        lines
            .iter()
            .filter_map(|l| l.get(key)?.as_f64())
            .reduce(f64::max)
    };
    let phases = names
        .iter()
        .filter_map(|n| {
            let seconds = mean(&format!("timing_s/{n}"))?;
            let rate = mean(&format!("perf/tokens_per_s/{n}"));
            Some(PhaseCost {
                phase: n.clone(),
                seconds,
                tokens: rate.map(|r| r * seconds),
                tokens_per_second: rate,
                peak_gb: max(&format!("perf/max_memory_allocated_gb/{n}")),
            })
        })
        .collect();
    let limit = exp.data.max_response_length as f64;
    let response = mean(crate::run::metric::RESPONSE_LENGTH).unwrap_or(0.0);
    let responses = exp.trainer.batch_size * exp.rollout.n;
    let prompt = exp.data.max_prompt_length as f64;
    Ok(RunPhases {
        run: exp.name.clone(),
        paper_run: paper_run.to_string(),
        steps: lines.len(),
        phases,
        responses,
        step_tokens: responses as f64 * (prompt + response),
        response_share: response / limit.max(1.0),
    })
}

/// The phases of the runs as Markdown: one table per run.
pub fn markdown(runs: &[RunPhases]) -> String {
    let mut s = String::new();
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or_else(|| "—".into(), f);
    for r in runs {
        s.push_str(&format!(
            "### {} (from {}; {} steps; responses at {:.0} % of their limit)\n\n| phase | seconds | tokens | tokens/s | peak GB |\n|---|---:|---:|---:|---:|\n",
            r.run,
            r.paper_run,
            r.steps,
            100.0 * r.response_share
        ));
        for p in &r.phases {
            s.push_str(&format!(
                "| {} | {:.2} | {} | {} | {} |\n",
                p.phase,
                p.seconds,
                opt(p.tokens, &|t| format!("{t:.0}")),
                opt(p.tokens_per_second, &|t| format!("{t:.1}")),
                opt(p.peak_gb, &|g| format!("{g:.1}")),
            ));
        }
        s.push('\n');
    }
    s
}

/// Derives every manifest, trains the derived runs that are not finished under
/// `results/pipeline/` (unless `report_only`: then their metrics must be there), then writes
/// `out/pipeline.{json,md}` (their phases) and `out/pipeline-plan.{json,md}` (the 16 paper runs
/// of `paper` costed from them).
pub fn run(
    manifests: &[PathBuf],
    d: &Derivation,
    results: &Path,
    data: &crate::data::DataLocation,
    paper: &Path,
    out: &Path,
    report_only: bool,
) -> Result<PathBuf> {
    let mut jobs = Vec::new();
    for path in manifests {
        let text = std::fs::read_to_string(path).map_err(|source| PerfError::Io {
            path: path.clone(),
            source,
        })?;
        let (exp, derived) = derive(&text, path, d)?;
        let paper_run = Experiment::from_yaml(&text, path)?.name;
        jobs.push((
            crate::reproduce::Job {
                exp,
                text: derived,
                results: results.to_owned(),
            },
            paper_run,
        ));
    }
    if !report_only {
        crate::reproduce::train_runs(jobs.iter().map(|(j, _)| j.clone()).collect(), data, Some(1))?;
    }
    let runs = jobs
        .iter()
        .map(|(j, paper_run)| {
            let dir = RunDir::of(&j.exp, results);
            if report_only && !dir.metrics().exists() {
                return Err(PerfError::Shape(format!(
                    "{}: no pipeline run of {paper_run} with these settings (run `acpo pipeline` without --report-only to train it)",
                    dir.path().display()
                )));
            }
            run_phases(dir.path(), &j.exp, paper_run)
        })
        .collect::<Result<Vec<_>>>()?;
    let json = serde_json::to_string_pretty(&runs).expect("invariant: phases are JSON");
    write_report(out, "pipeline.json", json.as_bytes())?;
    write_report(out, "pipeline.md", markdown(&runs).as_bytes())?;
    super::plan::pipeline_plan(&runs, paper, &d.configs, out)?;
    Ok(out.join("pipeline.md"))
}
