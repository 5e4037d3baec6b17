//! The costed paper plan (issue #20): from measured GPU rates of `acpo bench train-step` and
//! `acpo bench generate`, the GPU-hours each paper run would take on one GPU with acpo, beside
//! the GPUs the paper used.
//!
//! Two measurements feed it: a train step and a sampling run of one model shape (the GPU suite
//! measures Qwen3-1.7B). Other sizes are scaled by parameter count: a train step's FLOPs, and a
//! decode step's weight reads, both grow with it. Lengths are a stated assumption, since the
//! paper does not report its mean response length. A response is taken to use half of
//! `max_response_length`, and an evaluation answer half of `eval.max_new_tokens`.

use crate::files::AtPath;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{memory, write_report, PerfError, Result};
use crate::report::table::{Align::Left, Align::Right, Table};

/// The share of the length limits a response is taken to use.
pub const RESPONSE_SHARE: f64 = 0.5;

/// The GPUs per run the paper used (its appendix: 8 for Qwen2.5-Math-7B and Qwen3-8B, 4 for
/// Qwen3-4B, 2 for Qwen3-1.7B).
pub(super) fn paper_gpus(model: &str) -> usize {
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
    let text = crate::files::read_to_string(&path).at(&path)?;
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
        let cfg = memory::model_config(&exp, configs)?;
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
        let evals = exp.trainer.evaluations();
        let problems = exp.eval.problems();
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
        "Measured: train step {:.0} tokens/s ({}, {}), sampling {:.0} new tokens/s ({}, {}); other sizes scaled by parameters. Responses use {:.0} % of their limits (an assumption).\n\n",
        train.tokens_per_second,
        train.model,
        train.shape,
        sample.tokens_per_second,
        sample.model,
        sample.shape,
        100.0 * RESPONSE_SHARE,
    );
    let mut t = Table::new([
        ("run", Left),
        ("steps", Right),
        ("sampled tokens", Right),
        ("trained tokens", Right),
        ("eval tokens", Right),
        ("GPU-hours on one GPU (acpo)", Right),
        ("GPUs the paper used", Right),
    ]);
    for r in &rows {
        t.row([
            r.run.clone(),
            r.steps.to_string(),
            format!("{:.2e}", r.sample_tokens),
            format!("{:.2e}", r.train_tokens),
            format!("{:.2e}", r.eval_tokens),
            format!("{:.0}", r.gpu_hours),
            r.paper_gpus.to_string(),
        ]);
    }
    md.push_str(&t.to_string());
    write_report(out, "paper-plan.md", md.as_bytes())
}
