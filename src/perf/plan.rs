//! The costed paper plan (issue #20): from measured GPU rates of `acpo bench train-step` and
//! `acpo bench generate`, the GPU-hours each paper run would take on one GPU with acpo, beside
//! the GPUs the paper used.
//!
//! Two measurements feed it: a train step and a sampling run of one model shape (the GPU suite
//! measures Qwen3-1.7B). Other sizes are scaled by parameter count: a train step's FLOPs, and a
//! decode step's weight reads, both grow with it. Lengths are a stated assumption, since the
//! paper does not report its mean response length. A response is taken to use half of
//! `max_response_length`, and an evaluation answer half of `eval.max_new_tokens`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{memory, write_report, PerfError, Result};
use crate::manifest::Experiment;
use crate::model::QwenConfig;

/// The share of the length limits a response is taken to use.
pub const RESPONSE_SHARE: f64 = 0.5;

/// The GPUs per run the paper used (its appendix: 8 for Qwen2.5-Math-7B and Qwen3-8B, 4 for
/// Qwen3-4B, 2 for Qwen3-1.7B).
fn paper_gpus(model: &str) -> usize {
    let r = model.to_lowercase();
    if r.contains("1.7b") {
        2
    } else if r.contains("4b") {
        4
    } else {
        8
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunCost {
    pub run: String,
    pub steps: usize,
    pub sample_tokens: f64,
    pub train_tokens: f64,
    pub eval_tokens: f64,
    pub gpu_hours: f64,
    pub paper_gpus: usize,
}

/// A measured rate: what the plan scales from.
struct Rate {
    model: String,
    parameters: f64,
    tokens_per_second: f64,
    shape: String,
}

/// The first measurement in `dir/<name>.json` on CUDA in bf16.
fn measured(dir: &Path, name: &str) -> Result<Rate> {
    let path = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|source| PerfError::Io {
        path: path.clone(),
        source,
    })?;
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| PerfError::Shape(format!("{}: {e}", path.display())))?;
    let row = rows
        .into_iter()
        .find(|r| r["target"] == "cuda/bf16")
        .ok_or_else(|| PerfError::Shape(format!("{}: no cuda/bf16 measurement", path.display())))?;
    let get = |k: &str| {
        row[k]
            .as_f64()
            .ok_or_else(|| PerfError::Shape(format!("{}: no `{k}`", path.display())))
    };
    Ok(Rate {
        model: row["model"].as_str().unwrap_or("?").to_string(),
        parameters: get("parameters")?,
        tokens_per_second: get("tokens_per_second")?,
        shape: row["shape"].as_str().unwrap_or("?").to_string(),
    })
}

/// Writes `<out>/paper-plan.{json,md}` from the train-step and generate reports in `measured`
/// and the manifests in `experiments` (model shapes from `configs`).
pub fn paper_plan(
    experiments: &Path,
    configs: &Path,
    measured_dir: &Path,
    out: &Path,
) -> Result<PathBuf> {
    let train = measured(measured_dir, "train-step")?;
    let sample = measured(measured_dir, "generate")?;
    let mut rows = Vec::new();
    for exp in super::manifests(experiments)? {
        let cfg = model_config(&exp, configs)?;
        let params = memory::parameters(&cfg, false) as f64;
        let train_rate = train.tokens_per_second * train.parameters / params;
        let sample_rate = sample.tokens_per_second * sample.parameters / params;
        let n = exp.rollout.n as f64;
        let responses = exp.trainer.batch_size as f64 * n;
        let response = RESPONSE_SHARE * exp.data.max_response_length as f64;
        let prompt = RESPONSE_SHARE * exp.data.max_prompt_length as f64;
        let per_step_sample = responses * response;
        // The update passes (epochs), plus the old log-probs' forward (a third of a step); a
        // critic doubles both.
        let critic = if exp.critic.is_some() { 2.0 } else { 1.0 };
        let per_step_train =
            responses * (prompt + response) * (exp.actor.epochs as f64 + 1.0 / 3.0) * critic;
        let steps = exp.trainer.total_steps;
        // Every eval_every steps and at the start (0: at the start only).
        let evals = steps.checked_div(exp.trainer.eval_every).unwrap_or(0) + 1;
        let problems: usize = exp
            .eval
            .benchmarks
            .iter()
            .map(|b| exp.eval.limit.map_or(b.size(), |l| l.min(b.size())))
            .sum();
        let eval_tokens = evals as f64
            * problems as f64
            * exp.eval.sampling.n as f64
            * RESPONSE_SHARE
            * exp.eval.max_new_tokens as f64;
        let seconds = steps as f64 * (per_step_sample / sample_rate + per_step_train / train_rate)
            + eval_tokens / sample_rate;
        rows.push(RunCost {
            run: exp.name.clone(),
            steps,
            sample_tokens: steps as f64 * per_step_sample,
            train_tokens: steps as f64 * per_step_train,
            eval_tokens,
            gpu_hours: seconds / 3600.0,
            paper_gpus: paper_gpus(&exp.model.source.label()),
        });
    }
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the plan is JSON");
    write_report(out, "paper-plan.json", json.as_bytes())?;
    let mut md = format!(
        "Measured: train step {:.0} tokens/s ({}, {}), sampling {:.0} new tokens/s ({}, {}); other sizes scaled by parameters. Responses use {:.0} % of their limits (an assumption).\n\n| run | steps | sampled tokens | trained tokens | eval tokens | GPU-hours on one GPU (acpo) | GPUs the paper used |\n|---|---:|---:|---:|---:|---:|---:|\n",
        train.tokens_per_second,
        train.model,
        train.shape,
        sample.tokens_per_second,
        sample.model,
        sample.shape,
        100.0 * RESPONSE_SHARE,
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {:.2e} | {:.2e} | {:.2e} | {:.0} | {} |\n",
            r.run,
            r.steps,
            r.sample_tokens,
            r.train_tokens,
            r.eval_tokens,
            r.gpu_hours,
            r.paper_gpus
        ));
    }
    write_report(out, "paper-plan.md", md.as_bytes())
}

/// The model config of a manifest, from `configs` by its model's name (`qwen3-1.7b.json`).
pub(super) fn model_config(exp: &Experiment, configs: &Path) -> crate::model::Result<QwenConfig> {
    let file = exp.model.source.label().to_lowercase();
    QwenConfig::load(&configs.join(format!("{file}.json")))
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
fn step_seconds(exp: &Experiment, m: &super::pipeline::RunPhases, share: f64, scale: f64) -> f64 {
    let phase = |n: &str| m.phases.iter().find(|p| p.phase == n);
    let responses = (exp.trainer.batch_size * exp.rollout.n) as f64;
    let prompt = exp.data.max_prompt_length as f64;
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

/// Writes `<out>/pipeline-plan.{json,md}`: each paper run of `paper` costed from the measured
/// pipeline run of the same family (with or without a critic) and model, else of the nearest
/// size, scaled by parameters.
pub fn pipeline_plan(
    measured: &[super::pipeline::RunPhases],
    paper: &Path,
    configs: &Path,
    out: &Path,
) -> Result<PathBuf> {
    let exps = super::manifests(paper)?;
    let by_name = |name: &str| exps.iter().find(|e| e.name == name);
    let params_of = |exp: &Experiment| -> Result<f64> {
        Ok(memory::parameters(&model_config(exp, configs)?, false) as f64)
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
        let scale = params / p;
        let evals = exp
            .trainer
            .total_steps
            .checked_div(exp.trainer.eval_every)
            .unwrap_or(0)
            + 1;
        let problems: usize = exp
            .eval
            .benchmarks
            .iter()
            .map(|b| exp.eval.limit.map_or(b.size(), |l| l.min(b.size())))
            .sum();
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
        let step_tokens =
            responses * (exp.data.max_prompt_length + exp.data.max_response_length) as f64;
        let tps = step_tokens / step_seconds(exp, m, 1.0, scale).max(1e-9);
        rows.push(PipelineCost {
            run: exp.name.clone(),
            measured: m.run.clone(),
            scale,
            steps: exp.trainer.total_steps,
            gpu_hours_at_limit: hours(1.0),
            gpu_hours_at_half: hours(RESPONSE_SHARE),
            paper_gpus: paper_gpus(&exp.model.source.label()),
            step_tokens_per_s: tps,
            at_8b_tokens_per_s: tps * params / LLAMA_8B_PARAMETERS,
        });
    }
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the plan is JSON");
    write_report(out, "pipeline-plan.json", json.as_bytes())?;
    let mut md = format!(
        "Each paper run costed from the measured phases of a pipeline run (`acpo pipeline`: its model at its own shapes on random weights, batch sizes divided): per-token rates times the run's tokens, per-response costs times its responses, the evaluation's and the checkpoint's as measured; another size's rates scaled by parameters (the `scale` column). Random weights run every response to its limit: the first GPU-hours column is that worst case, the second assumes responses at {:.0} % of it. Throughput: a step's prompt + response tokens over its seconds at the limit, per GPU, and scaled to 8.03 B parameters beside NeMo-RL's {NEMO_RL_TOKENS_PER_S_PER_GPU:.0} tokens/s/GPU (Llama-3.1-8B, GRPO, H100).\n\n| run | measured on | scale | steps | GPU-hours, responses at the limit | at {:.0} % | GPUs the paper used | step tokens/s/GPU | at 8 B parameters |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        100.0 * RESPONSE_SHARE,
        100.0 * RESPONSE_SHARE,
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {:.2} | {} | {:.0} | {:.0} | {} | {:.0} | {:.0} |\n",
            r.run,
            r.measured,
            r.scale,
            r.steps,
            r.gpu_hours_at_limit,
            r.gpu_hours_at_half,
            r.paper_gpus,
            r.step_tokens_per_s,
            r.at_8b_tokens_per_s
        ));
    }
    write_report(out, "pipeline-plan.md", md.as_bytes())
}
