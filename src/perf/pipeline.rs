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
//! the worst case, and the report says so. The report puts each run's phases in a table and
//! costs the 16 paper runs from them ([`pipeline_plan`]).

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{memory, plan, write_report, PerfError, Result};
use crate::hub::ModelSource;
use crate::manifest::{edit, raw, Experiment, Scale};
use crate::model::init::{InitTokenizer, TokenizerFiles};
use crate::report::table::{Align::Left, Align::Right, Table};
use crate::run::RunDir;

/// A value as YAML flow text: JSON is YAML, quoted where a path or a sentence needs it.
fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("invariant: manifest values are JSON")
}

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
    pub device: Option<crate::model::spec::Device>,
    /// Another KV-cache layout for every run's samplers (`kv_layout`); None: each manifest's
    /// own.
    pub kv_layout: Option<crate::rollout::KvLayout>,
    /// Another layer backward for every run's train step (`model.layer_backward`; the paper
    /// manifests all checkpoint); None: each manifest's own.
    pub layer_backward: Option<crate::model::spec::LayerBackward>,
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
    let (exp, raw) = Experiment::from_yaml_with_raw(text, path)?;
    derive_from(&exp, &raw, text, path, d)
}

/// [`derive`] from the manifest already read: its experiment and its fields as written. The
/// derived text is the manifest's own, fields set by [`edit::set_field`] (comments and order
/// kept), read once.
fn derive_from(
    exp: &Experiment,
    m: &raw::Manifest,
    text: &str,
    path: &Path,
    d: &Derivation,
) -> Result<(Experiment, String)> {
    let (repo, revision) =
        match &exp.model.source {
            ModelSource::Hub { repo, revision } => (repo.clone(), revision.clone()),
            ModelSource::Dir(_) => return Err(invalid(
                path,
                "model",
                "a pipeline run replaces a hub model (model.repo) by random weights of its config",
            )),
        };
    check_divisor(m, path, d)?;
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
        return Err(PathIoError::refused(
            config,
            std::io::ErrorKind::NotFound,
            "no config for this model",
        )
        .into());
    }
    let tokenizer = match &d.tokenizer {
        Some(dir) => TokenizerFiles::Dir { dir: dir.clone() },
        None => TokenizerFiles::Hub {
            repo: repo.clone(),
            revision: revision.clone(),
        },
    };
    let mini_batch = m.actor.mini_batch_size / d.divisor;
    let responses = mini_batch * m.rollout.n;
    // The flag is taken as given or refused (issue #47: 3 became 1 and 10^6 became 4, silently);
    // the manifest's own micro-batch is the default, made to divide the divided mini-batch.
    if let Some(mb) = d
        .micro_batch
        .filter(|&mb| mb == 0 || !responses.is_multiple_of(mb))
    {
        return Err(PerfError::Shape(format!(
            "{}: --micro-batch {mb} does not divide the {responses} responses of a mini-batch (actor.mini_batch_size / --divisor {} = {}, × rollout.n {})",
            path.display(),
            d.divisor,
            mini_batch,
            m.rollout.n
        )));
    }
    let init = raw::ModelInit {
        config,
        seed: 0,
        tokenizer: Some(InitTokenizer::Files(tokenizer)),
        warm_start: None,
    };
    let micro_batch = d
        .micro_batch
        .or(m.actor.micro_batch_size.map(|mb| gcd(mb, responses)));
    let fields = derived_fields(m, d, &d.models.join(&stem), &init, micro_batch);
    let mut body = text.to_string();
    for (field, value) in fields {
        body = match value {
            Some(value) => edit::set_field(&body, field, &value),
            None if edit::has_field(&body, field) => edit::remove_field(&body, field),
            None => Some(body),
        }
        .ok_or_else(|| {
            invalid(
                path,
                field,
                "cannot derive the pipeline manifest: its parent mapping is not in the text",
            )
        })?;
    }
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

/// The flags at least 1, and the divisor dividing both batch sizes.
fn check_divisor(m: &raw::Manifest, path: &Path, d: &Derivation) -> Result<()> {
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
    Ok(())
}

/// The fields a pipeline run sets (a value, as YAML flow text) or drops (None) in its paper
/// manifest: random weights of `init`'s config at `dir`, batch sizes divided, `d.steps` steps
/// and one evaluation and checkpoint after the last.
fn derived_fields(
    m: &raw::Manifest,
    d: &Derivation,
    dir: &Path,
    init: &raw::ModelInit,
    micro_batch: Option<usize>,
) -> Vec<(&'static str, Option<String>)> {
    let description = format!(
        "{} at its own shapes on random weights (acpo pipeline): batch sizes / {}, {} steps, {} problems per benchmark",
        m.name, d.divisor, d.steps, d.eval_limit
    );
    let steps = Some(d.steps.to_string());
    let mut fields = vec![
        ("name", Some(json(&format!("{}-random", m.name)))),
        ("description", Some(json(&description))),
        ("scale", Some(json(&Scale::Pipeline))),
        ("model.repo", None),
        ("model.revision", None),
        ("model.dir", Some(json(&dir))),
        ("model.init", Some(json(init))),
        (
            "trainer.batch_size",
            Some((m.trainer.batch_size / d.divisor).to_string()),
        ),
        (
            "actor.mini_batch_size",
            Some((m.actor.mini_batch_size / d.divisor).to_string()),
        ),
        ("trainer.total_steps", steps.clone()),
        // one evaluation, after the last step
        ("trainer.val_before_train", Some("false".into())),
        ("trainer.eval_every", steps.clone()),
        ("trainer.checkpoint_every", steps.clone()),
        (
            "eval.limit",
            Some(
                m.eval
                    .limit
                    .map_or(d.eval_limit, |l| l.min(d.eval_limit))
                    .to_string(),
            ),
        ),
    ];
    if let Some(device) = d.device {
        fields.push(("device", Some(json(&device))));
    }
    if let Some(layout) = d.kv_layout {
        fields.push(("kv_layout", Some(json(&layout))));
    }
    if let Some(backward) = d.layer_backward {
        fields.push(("model.layer_backward", Some(json(&backward))));
    }
    if let Some(mb) = micro_batch {
        fields.push(("actor.micro_batch_size", Some(mb.to_string())));
    }
    // the r·Â tails (and the PPO types' difficulty probe) once, at the last step
    if m.trainer.tails_every > 0 {
        fields.push(("trainer.tails_every", steps));
    }
    fields
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
    /// How its samplers held their KV cache (the manifest's `kv_layout`, or `--paged-kv`'s).
    pub kv_layout: crate::rollout::KvLayout,
    /// How its train step computed each layer's backward (`model.layer_backward`, or
    /// `--layer-by-hand`'s).
    pub layer_backward: crate::model::spec::LayerBackward,
}

/// The phases of the run in `dir` (its metrics.jsonl), averaged over its steps.
pub fn run_phases(dir: &Path, exp: &Experiment, paper_run: &str) -> Result<RunPhases> {
    let run = RunDir::at(dir);
    let text = crate::files::read_to_string(run.metrics()).at(run.metrics())?;
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
        kv_layout: exp.kv_layout(),
        layer_backward: exp.model.layer_backward.unwrap_or_default(),
    })
}

/// The phases of the runs as Markdown: one table per run.
pub fn markdown(runs: &[RunPhases]) -> String {
    let mut s = String::new();
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or_else(|| "—".into(), f);
    for r in runs {
        s.push_str(&format!(
            "### {} (from {}; {} steps; responses at {:.0} % of their limit; {} KV cache{})\n\n",
            r.run,
            r.paper_run,
            r.steps,
            100.0 * r.response_share,
            match r.kv_layout {
                crate::rollout::KvLayout::Dense => "dense",
                crate::rollout::KvLayout::Paged => "paged",
            },
            match r.layer_backward {
                crate::model::spec::LayerBackward::Autograd => "",
                crate::model::spec::LayerBackward::ByHand => "; each layer's backward by hand",
            }
        ));
        let mut t = Table::new([
            ("phase", Left),
            ("seconds", Right),
            ("tokens", Right),
            ("tokens/s", Right),
            ("peak GB", Right),
        ]);
        for p in &r.phases {
            t.row([
                p.phase.clone(),
                format!("{:.2}", p.seconds),
                opt(p.tokens, &|t| format!("{t:.0}")),
                opt(p.tokens_per_second, &|t| format!("{t:.1}")),
                opt(p.peak_gb, &|g| format!("{g:.1}")),
            ]);
        }
        s.push_str(&t.to_string());
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
        let text = crate::files::read_to_string(path).at(path)?;
        let (paper, raw) = Experiment::from_yaml_with_raw(&text, path)?;
        let (exp, derived) = derive_from(&paper, &raw, &text, path, d)?;
        let paper_run = paper.name;
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
    pipeline_plan(&runs, paper, &d.configs, out)?;
    Ok(out.join("pipeline.md"))
}

/// NeMo-RL's published throughput of GRPO on Llama-3.1-8B over H100s, tokens/s per GPU, as issue
/// #34 quotes it: the yardstick for a whole step's throughput.
pub const NEMO_RL_TOKENS_PER_S_PER_GPU: f64 = 1581.0;
/// Llama-3.1-8B's parameters, to scale a measured throughput to that size.
const LLAMA_8B_PARAMETERS: f64 = 8.03e9;

/// A paper run costed from a pipeline run's measured phases.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineCost {
    pub run: String,
    /// The pipeline run its rates come from, and the parameter ratio they are scaled by.
    pub measured: String,
    pub scale: f64,
    pub steps: usize,
    /// GPU-hours on one GPU with every response at its limit (what random weights do), and at
    /// half of it.
    pub gpu_hours_at_limit: f64,
    pub gpu_hours_at_half: f64,
    pub paper_gpus: usize,
    /// A step's prompt + response tokens over its seconds, responses at their limit, per GPU,
    /// and that throughput scaled to 8.03 B parameters (NeMo-RL's Llama-3.1-8B).
    pub step_tokens_per_s: f64,
    pub at_8b_tokens_per_s: f64,
}

/// Seconds of one step of `exp` from the measured phases of `m` (a pipeline run of the same
/// family), with responses at `share` of their limit: per-token rates times the paper run's
/// tokens, per-response and per-step costs times its responses, scaled by `scale`.
fn step_seconds(exp: &Experiment, m: &RunPhases, share: f64, scale: f64) -> f64 {
    let phase = |n: &str| m.phases.iter().find(|p| p.phase == n);
    let responses = (exp.trainer.batch_size * exp.rollout.n) as f64;
    let prompt = plan::train_prompt(exp);
    let response = share * exp.data.max_response_length as f64;
    let step_tokens = responses * (prompt + response);
    let measured_responses = m.responses as f64;
    let per_token = |n: &str, tokens: f64| {
        phase(n)
            .and_then(|p| p.tokens_per_second)
            .map_or(0.0, |r| tokens / r.max(1e-9))
    };
    let per_response =
        |n: &str| phase(n).map_or(0.0, |p| p.seconds * responses / measured_responses.max(1.0));
    let tails = if exp.trainer.tails_every > 0 {
        1.0 / exp.trainer.tails_every as f64
    } else {
        0.0
    };
    scale
        * (per_token("gen_prefill", responses * prompt)
            + per_token("gen_decode", responses * response)
            + per_response("reward")
            + tails * per_response("probe")
            + per_token("old_log_prob", step_tokens)
            + per_token("values", step_tokens)
            + per_response("adv")
            + per_token("update_actor", step_tokens * exp.actor.epochs as f64)
            + per_token("update_critic", step_tokens * exp.actor.epochs as f64))
}

/// The paper run `exp` (of `params` parameters) costed from the measured run `m`, whose rates
/// are scaled by `scale` (the parameter ratio).
fn cost(exp: &Experiment, m: &RunPhases, params: f64, scale: f64) -> PipelineCost {
    let evals = exp.trainer.evaluations();
    let problems = exp.eval.problems();
    let checkpoints = exp
        .trainer
        .total_steps
        .checked_div(exp.trainer.checkpoint_every)
        .unwrap_or(0)
        + 1;
    let phase = |n: &str| m.phases.iter().find(|p| p.phase == n);
    let eval_rate = phase("testing").and_then(|p| p.tokens_per_second);
    let save = phase("save_checkpoint").map_or(0.0, |p| p.seconds);
    let hours = |share: f64| {
        let eval_tokens = evals as f64
            * problems as f64
            * exp.eval.sampling.n as f64
            * share
            * exp.eval.max_new_tokens as f64;
        let eval = eval_rate.map_or(0.0, |r| scale * eval_tokens / r.max(1e-9));
        (exp.trainer.total_steps as f64 * step_seconds(exp, m, share, scale)
            + eval
            + checkpoints as f64 * scale * save)
            / 3600.0
    };
    let responses = (exp.trainer.batch_size * exp.rollout.n) as f64;
    let step_tokens = responses * (plan::train_prompt(exp) + exp.data.max_response_length as f64);
    let tps = step_tokens / step_seconds(exp, m, 1.0, scale).max(1e-9);
    PipelineCost {
        run: exp.name.clone(),
        measured: m.run.clone(),
        scale,
        steps: exp.trainer.total_steps,
        gpu_hours_at_limit: hours(1.0),
        gpu_hours_at_half: hours(plan::RESPONSE_SHARE),
        paper_gpus: plan::paper_gpus(&exp.model.source.label()),
        step_tokens_per_s: tps,
        at_8b_tokens_per_s: tps * params / LLAMA_8B_PARAMETERS,
    }
}

/// Writes `<out>/pipeline-plan.{json,md}`: each paper run of `paper` costed from the measured
/// pipeline run of the same family (with or without a critic) and model, else of the nearest
/// size, scaled by parameters.
pub fn pipeline_plan(
    measured: &[RunPhases],
    paper: &Path,
    configs: &Path,
    out: &Path,
) -> Result<PathBuf> {
    let exps = super::manifests(paper)?;
    let by_name = |name: &str| exps.iter().find(|e| e.name == name);
    let params_of = |exp: &Experiment| -> Result<f64> {
        Ok(memory::parameters(&memory::model_config(exp, configs)?, false) as f64)
    };
    let mut rows = Vec::new();
    for exp in &exps {
        let params = params_of(exp)?;
        // the measured runs of this family, the same model first, else the closest size
        let mut candidates = Vec::new();
        for m in measured {
            let Some(src) = by_name(&m.paper_run) else {
                continue;
            };
            if src.critic.is_some() != exp.critic.is_some() {
                continue;
            }
            let p = params_of(src)?;
            candidates.push(((p / params).ln().abs(), m, p));
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let Some(&(_, m, p)) = candidates.first() else {
            continue;
        };
        rows.push(cost(exp, m, params, params / p));
    }
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the plan is JSON");
    write_report(out, "pipeline-plan.json", json.as_bytes())?;
    let mut md = format!(
        "Each paper run costed from the measured phases of a pipeline run (`acpo pipeline`: its model at its own shapes on random weights, batch sizes divided): per-token rates times the run's tokens (its prompts at DAPO-Math-17k's mean, `perf::plan::TRAIN_PROMPT_TOKENS`), per-response costs times its responses, the evaluation's and the checkpoint's as measured; another size's rates scaled by parameters (the `scale` column). Random weights run every response to its limit: the first GPU-hours column is that worst case, the second assumes responses at {:.0} % of it. Throughput: a step's prompt + response tokens over its seconds, responses at their limit, per GPU, and scaled to 8.03 B parameters beside NeMo-RL's {NEMO_RL_TOKENS_PER_S_PER_GPU:.0} tokens/s/GPU (Llama-3.1-8B, GRPO, H100).\n\n",
        100.0 * plan::RESPONSE_SHARE,
    );
    let half = format!("at {:.0} %", 100.0 * plan::RESPONSE_SHARE);
    let mut t = Table::new([
        ("run", Left),
        ("measured on", Left),
        ("scale", Right),
        ("steps", Right),
        ("GPU-hours, responses at the limit", Right),
        (half.as_str(), Right),
        ("GPUs the paper used", Right),
        ("step tokens/s/GPU", Right),
        ("at 8 B parameters", Right),
    ]);
    for r in &rows {
        t.row([
            r.run.clone(),
            r.measured.clone(),
            format!("{:.2}", r.scale),
            r.steps.to_string(),
            format!("{:.0}", r.gpu_hours_at_limit),
            format!("{:.0}", r.gpu_hours_at_half),
            r.paper_gpus.to_string(),
            format!("{:.0}", r.step_tokens_per_s),
            format!("{:.0}", r.at_8b_tokens_per_s),
        ]);
    }
    md.push_str(&t.to_string());
    write_report(out, "pipeline-plan.md", md.as_bytes())
}
