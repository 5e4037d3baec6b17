//! The costed paper plan (issue #20): from measured GPU rates of `acpo bench train-step` and
//! `acpo bench generate`, the GPU-hours each paper run would take on one GPU with acpo, beside
//! the GPUs the paper used.
//!
//! Measurements feed it: a train step and a sampling run of one model shape (the GPU suite
//! measures Qwen3-1.7B; of a file with several rows, its last, which for `acpo bench generate
//! --long-tail --paged-kv` is the paged engine's run), and where the suite measured it,
//! sampling at the evaluation's own shape (`generate-eval.json`; else the rollouts' rate
//! serves both, and the plan says so). Other
//! sizes are scaled by parameter count: a train step's FLOPs, and a decode step's weight reads,
//! both grow with it. Response lengths are a stated assumption, since the paper does not report
//! its mean response length. A response is taken to use half of `max_response_length`, and an
//! evaluation answer half of `eval.max_new_tokens`. Prompt lengths are the data's: the mean
//! prompt of DAPO-Math-17k and of the four benchmarks under the paper manifests' templates
//! ([`TRAIN_PROMPT_TOKENS`], [`EVAL_PROMPT_TOKENS`]).
//!
//! Beside each sampling rate the plan prints the bound the memory sets on it: at a large batch a
//! decode step's bytes are mostly the KV cache's, so new tokens/s cannot exceed the device's
//! copy rate over the KV bytes one token's attention reads at its mean context
//! ([`kv_bytes_per_token`]). The copy rate is the one the sampling measurement recorded beside
//! its roofline. The same bound with a cache of one byte an element (an FP8 KV cache, which
//! halves those bytes) says what the cache's precision alone could buy. And where the sampling
//! measurement recorded its roofline, the plan carries its decode steps to each run's own model
//! and mean contexts ([`carried_rate`]): the same rows a step, moving every weight once and each
//! row's KV cache at the same fraction of the copy rate, the rows a step at most what the GPU's
//! pool holds at the run's mean context where the GPU's memory is known (`device.txt` beside
//! the rates, the sampling call's suite header: a run measured at more rows than fit at a paper run's contexts would
//! otherwise be carried with rows it could not hold). The suite's sampling runs are shorter
//! than a paper run's, so their rates, read at fewer KV bytes a token, overstate a paper run's
//! sampling; the carried rate is a model of it, not a measurement.

use crate::files::AtPath;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{memory, write_report, PerfError, Result};
use crate::report::table::{Align::Left, Align::Right, Table};

/// The share of the length limits a response is taken to use.
pub const RESPONSE_SHARE: f64 = 0.5;

/// The mean training prompt in tokens: DAPO-Math-17k's 17,290 problems under the paper
/// manifests' DAPO template and Qwen3's chat template and tokenizer (153.4, a prompt past the
/// paper's `max_prompt_length` of 1,024 counted at it; a run with a shorter limit takes its
/// limit). A prompt's tokens are trained on and every response's attention reads them, so the
/// plan's training tokens and mean contexts count them. The test
/// `the_plan_s_prompt_lengths_are_the_data_s` recomputes it from the data.
pub const TRAIN_PROMPT_TOKENS: f64 = 153.0;

/// The mean evaluation prompt in tokens: the four benchmarks' 1,677 problems under the boxed
/// template and Qwen3's chat template and tokenizer (121.1), recomputed from the data by the
/// same test.
pub const EVAL_PROMPT_TOKENS: f64 = 121.0;

/// A paper run's mean training prompt in tokens: [`TRAIN_PROMPT_TOKENS`], or its own
/// `max_prompt_length` where that is shorter.
pub fn train_prompt(exp: &crate::manifest::Experiment) -> f64 {
    TRAIN_PROMPT_TOKENS.min(exp.data.max_prompt_length as f64)
}

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
    /// The three parts of `gpu_hours`: sampling the rollouts, the evaluations, training.
    pub rollout_hours: f64,
    pub eval_hours: f64,
    pub train_hours: f64,
    pub gpu_hours: f64,
    /// The KV-bandwidth bound on new tokens/s for the rollouts and for the evaluations at their
    /// mean contexts (None without a measured copy rate), and the GPU-hours the run would take
    /// if both sampled at it.
    pub rollout_kv_bound_tps: Option<f64>,
    pub eval_kv_bound_tps: Option<f64>,
    pub gpu_hours_at_kv_bound: Option<f64>,
    /// The same with a KV cache of one byte an element (FP8): both bounds doubled.
    pub gpu_hours_at_fp8_kv_bound: Option<f64>,
    /// The GPU-hours with each sampler's measured decode steps carried to the run's own model and
    /// mean contexts ([`carried_rate`]; None without the measurement's roofline). A sampling rate
    /// measured at shorter contexts than a paper run's reads fewer KV bytes a token than the run
    /// would, so the rate itself overstates the run's sampling; this models it instead.
    pub gpu_hours_at_paper_contexts: Option<f64>,
    /// The rows a decode step those hours carry, rollouts and evaluations: the measured rows,
    /// at most what the GPU's pool holds at the run's mean context ([`rows_at`]).
    pub rollout_rows_at_paper_contexts: Option<f64>,
    pub eval_rows_at_paper_contexts: Option<f64>,
    pub paper_gpus: usize,
}

/// A measured rate: what the plan scales from.
struct Rate {
    model: String,
    parameters: f64,
    tokens_per_second: f64,
    shape: String,
    /// The device copy rate the measurement recorded beside its roofline, GB/s.
    copy_gb_per_s: Option<f64>,
    /// Its decode steps, where it recorded their roofline: the fraction of the copy rate they
    /// reached (every weight once a step and each row's KV cache) and the rows a step (tokens
    /// drawn a second × seconds a step).
    decode: Option<DecodeSteps>,
}

/// A sampling measurement's decode steps ([`Rate::decode`]).
#[derive(Debug, Clone, Copy)]
struct DecodeSteps {
    fraction: f64,
    rows: f64,
    /// Bytes an element of the KV cache it read (1: FP8), as its fraction counts them; 2
    /// where the roofline does not say (runs before FP8 caches were measured, all bf16).
    kv_elem_bytes: usize,
}

/// New tokens/s of decode steps like `measured`'s (`rows` a step, moving every weight once and
/// each row's KV cache at `fraction` of `copy_bytes_per_s`) for a model of `weight_bytes` at
/// `context` positions of `kv_bytes_per_position`: rows ÷ the step's bytes at that rate. At the
/// measurement's own model and mean context it is the measured decode rate.
pub fn carried_rate(
    fraction: f64,
    rows: f64,
    copy_bytes_per_s: f64,
    weight_bytes: f64,
    context: f64,
    kv_bytes_per_position: f64,
) -> f64 {
    fraction * copy_bytes_per_s * rows / (weight_bytes + rows * context * kv_bytes_per_position)
}

/// The rows a decode step carried to `context` positions keeps of the `measured` ones: all of
/// them, or where the GPU's memory is known, at most as many as its sampler's pool holds at that
/// context (the engine's pool, [`super::sampling::pool_blocks`], beside `resident` bytes, what
/// the run's trainer holds while it samples, and a cache of `kv_elem` bytes an element; a row
/// holding ⌈context / BLOCK⌉ blocks; block 0 is the pool's own). Zero: the pool holds no row
/// at that context.
pub fn rows_at(
    measured: f64,
    memory: Option<u64>,
    cfg: &crate::model::QwenConfig,
    resident: u64,
    context: f64,
    kv_elem: usize,
) -> f64 {
    use crate::model::paged::{PagedKv, BLOCK};
    let Some(memory) = memory else {
        return measured;
    };
    let pool =
        super::sampling::pool_blocks(memory, resident, PagedKv::block_bytes(cfg, kv_elem, BLOCK));
    let per_row = (context / BLOCK as f64).ceil().max(1.0);
    measured.min((pool.saturating_sub(1) as f64 / per_row).floor())
}

/// The bytes of KV cache one new token's attention reads at `context` positions, each element
/// `elem_size` bytes (2 for bf16, 1 for FP8).
pub fn kv_bytes_per_token(cfg: &crate::model::QwenConfig, context: f64, elem_size: usize) -> f64 {
    cfg.kv_bytes_per_position(elem_size) as f64 * context
}

/// A JSON number that is finite and above zero, or None.
fn positive(v: &serde_json::Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite() && *x > 0.0)
}

/// The first measurement in `dir/<name>.json` on CUDA in bf16.
fn measured(dir: &Path, name: &str) -> Result<Rate> {
    let path = dir.join(format!("{name}.json"));
    let text = crate::files::read_to_string(&path).at(&path)?;
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| PerfError::Shape(format!("{}: {e}", path.display())))?;
    // The file's last GPU row: a long-tail run's last is its paged engine's (after waves and
    // continuous batching over the dense cache), the way a paper run samples.
    let row = rows
        .into_iter()
        .rfind(|r| r["target"] == "cuda/bf16")
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
        copy_gb_per_s: positive(&row["roofline"]["copy_gb_per_s"]),
        decode: match (
            positive(&row["roofline"]["fraction"]).filter(|f| *f <= 1.0),
            positive(&row["roofline"]["decode_tokens_per_second"]),
            positive(&row["roofline"]["step_seconds"]),
        ) {
            (Some(fraction), Some(tps), Some(step)) => Some(DecodeSteps {
                fraction,
                rows: tps * step,
                kv_elem_bytes: match row["roofline"]["kv_elem_bytes"].as_u64() {
                    None => 2,
                    Some(b @ (1 | 2 | 4)) => b as usize,
                    Some(b) => {
                        return Err(PerfError::Shape(format!(
                            "{}: `roofline.kv_elem_bytes` is {b}, not 1, 2 or 4",
                            path.display()
                        )))
                    }
                },
            }),
            _ => None,
        },
    })
}

/// The measured rates a plan scales from: the train step, sampling at the rollouts' shape, and
/// sampling at the evaluations' own shape where the suite measured it (`generate-eval.json`).
struct Rates {
    train: Rate,
    rollouts: Rate,
    evaluations: Option<Rate>,
    /// The GPU's memory, where `device.txt` beside the rates gives the sampling call's suite
    /// header (tools/gpu/plan.sh copies it from the call's `summary.txt`).
    memory_bytes: Option<u64>,
}

impl Rates {
    fn read(dir: &Path) -> Result<Rates> {
        Ok(Rates {
            train: measured(dir, "train-step")?,
            rollouts: measured(dir, "generate")?,
            evaluations: if dir.join("generate-eval.json").exists() {
                Some(measured(dir, "generate-eval")?)
            } else {
                None
            },
            memory_bytes: {
                let path = dir.join("device.txt");
                if path.exists() {
                    let text = crate::files::read_to_string(&path).at(&path)?;
                    Some(super::decode::memory_in(&text).ok_or_else(|| {
                        PerfError::Shape(format!(
                            "{}: no suite header line `== suite on NAME, DRIVER, N MiB`",
                            path.display()
                        ))
                    })?)
                } else {
                    None
                }
            },
        })
    }

    /// The rate the evaluations sample at: their own where measured, else the rollouts'.
    fn evaluation(&self) -> &Rate {
        self.evaluations.as_ref().unwrap_or(&self.rollouts)
    }

    /// The sampling measurement whose decode steps the evaluations' are carried from
    /// ([`carried_rate`]): their own where it recorded its roofline, else the rollouts'.
    fn evaluation_steps(&self) -> &Rate {
        let own = self.evaluation();
        if own.decode.is_some() {
            own
        } else {
            &self.rollouts
        }
    }

    /// The device copy rate recorded beside either sampling measurement, GB/s.
    fn copy(&self) -> Option<f64> {
        self.rollouts
            .copy_gb_per_s
            .or(self.evaluation().copy_gb_per_s)
    }
}

/// The model a paper run samples with, on the GPU a measurement ran on: what
/// [`CarriedTo::carry`] carries a sampling measurement's decode steps to.
struct CarriedTo<'a> {
    cfg: &'a crate::model::QwenConfig,
    /// The bytes of weights a decode step reads (bf16).
    weight_bytes: f64,
    /// What the run's trainer keeps on the device while it samples
    /// ([`memory::resident_while_sampling`]).
    resident: u64,
    /// The GPU's memory, where known.
    memory: Option<u64>,
}

impl CarriedTo<'_> {
    /// `rate`'s decode steps at mean `context`: at most the rows the pool holds there
    /// ([`rows_at`]), each moving the weights and its cache at the measured fraction of the copy
    /// rate ([`carried_rate`]). (rows a step, new tokens/s); None without the measurement's
    /// roofline, or where the pool holds no row.
    fn carry(&self, rate: &Rate, context: f64) -> Option<(f64, f64)> {
        let (d, copy) = (rate.decode?, rate.copy_gb_per_s?);
        let rows = rows_at(
            d.rows,
            self.memory,
            self.cfg,
            self.resident,
            context,
            d.kv_elem_bytes,
        );
        (rows >= 1.0).then(|| {
            let tps = carried_rate(
                d.fraction,
                rows,
                copy * 1e9,
                self.weight_bytes,
                context,
                self.cfg.kv_bytes_per_position(d.kv_elem_bytes) as f64,
            );
            (rows, tps)
        })
    }
}

/// One run's cost on one GPU: its tokens from the manifest at the assumed lengths, each part's
/// hours at the measured rates scaled to its model's parameters, and the KV-bandwidth bound.
fn run_cost(exp: &crate::manifest::Experiment, configs: &Path, rates: &Rates) -> Result<RunCost> {
    let cfg = memory::model_config(exp, configs)?;
    let params = memory::parameters(&cfg, false) as f64;
    let scaled = |r: &Rate| r.tokens_per_second * r.parameters / params;
    let (train_rate, sample_rate, eval_rate) = (
        scaled(&rates.train),
        scaled(&rates.rollouts),
        scaled(rates.evaluation()),
    );
    let responses = exp.trainer.batch_size as f64 * exp.rollout.n as f64;
    let response = RESPONSE_SHARE * exp.data.max_response_length as f64;
    let prompt = train_prompt(exp);
    let per_step_sample = responses * response;
    // The update passes (epochs), plus the old log-probs' forward (a third of a step); a
    // critic doubles both.
    let critic = if exp.critic.is_some() { 2.0 } else { 1.0 };
    let per_step_train =
        responses * (prompt + response) * (exp.actor.epochs as f64 + 1.0 / 3.0) * critic;
    let steps = exp.trainer.total_steps as f64;
    let answer = RESPONSE_SHARE * exp.eval.max_new_tokens as f64;
    let eval_tokens = exp.trainer.evaluations() as f64
        * exp.eval.problems() as f64
        * exp.eval.sampling.n as f64
        * answer;
    let rollout_seconds = steps * per_step_sample / sample_rate;
    let train_seconds = steps * per_step_train / train_rate;
    let eval_seconds = eval_tokens / eval_rate;
    // A token generated half-way through its response attends to the prompt and half the
    // response: the mean context over a response.
    let bound = |context: f64, elem_size: usize| {
        rates
            .copy()
            .map(|gbps| gbps * 1e9 / kv_bytes_per_token(&cfg, context, elem_size))
    };
    let (rollout_context, eval_context) =
        (prompt + response / 2.0, EVAL_PROMPT_TOKENS + answer / 2.0);
    // GPU-hours with the rollouts sampled at `rollout_tps` new tokens/s and the evaluations at
    // `eval_tps`, training at its measured rate.
    let hours = |rollout_tps: f64, eval_tps: f64| {
        (steps * per_step_sample / rollout_tps + eval_tokens / eval_tps + train_seconds) / 3600.0
    };
    // GPU-hours had both samplers run at the bound of a cache of `elem_size` bytes an element.
    let hours_at = |elem_size: usize| {
        bound(rollout_context, elem_size)
            .zip(bound(eval_context, elem_size))
            .map(|(r, e)| hours(r, e))
    };
    let (bf16, fp8) = (2, 1);
    // Each sampler's measured decode steps carried to this run's model and mean contexts, at
    // the rows its pool holds there beside what the trainer keeps on the device while it samples.
    let model = CarriedTo {
        cfg: &cfg,
        weight_bytes: params * 2.0,
        resident: memory::resident_while_sampling(&cfg, exp.critic.is_some()),
        memory: rates.memory_bytes,
    };
    let (rollouts_carried, eval_carried) = (
        model.carry(&rates.rollouts, rollout_context),
        model.carry(rates.evaluation_steps(), eval_context),
    );
    let at_paper_contexts = rollouts_carried
        .zip(eval_carried)
        .map(|((_, r), (_, e))| hours(r, e));
    Ok(RunCost {
        run: exp.name.clone(),
        steps: exp.trainer.total_steps,
        sample_tokens: steps * per_step_sample,
        train_tokens: steps * per_step_train,
        eval_tokens,
        rollout_hours: rollout_seconds / 3600.0,
        eval_hours: eval_seconds / 3600.0,
        train_hours: train_seconds / 3600.0,
        gpu_hours: (rollout_seconds + eval_seconds + train_seconds) / 3600.0,
        rollout_kv_bound_tps: bound(rollout_context, bf16),
        eval_kv_bound_tps: bound(eval_context, bf16),
        gpu_hours_at_kv_bound: hours_at(bf16),
        gpu_hours_at_fp8_kv_bound: hours_at(fp8),
        gpu_hours_at_paper_contexts: at_paper_contexts,
        rollout_rows_at_paper_contexts: rollouts_carried.map(|(rows, _)| rows),
        eval_rows_at_paper_contexts: eval_carried.map(|(rows, _)| rows),
        paper_gpus: paper_gpus(&exp.model.source.label()),
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
    let rates = Rates::read(measured_dir)?;
    let rows = super::manifests(experiments)?
        .iter()
        .map(|exp| run_cost(exp, configs, &rates))
        .collect::<Result<Vec<_>>>()?;
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the plan is JSON");
    write_report(out, "paper-plan.json", json.as_bytes())?;
    write_report(
        out,
        "paper-plan.md",
        plan_markdown(&rates, &rows).as_bytes(),
    )
}

/// A table cell of the rollouts' and the evaluations' numbers, `a / b`, or "—" without both.
fn pair(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
        _ => "—".into(),
    }
}

/// paper-plan.md: the rates it stands on, the bound's definition, and a row per run.
fn plan_markdown(rates: &Rates, rows: &[RunCost]) -> String {
    let (train, sample, eval_sample) = (&rates.train, &rates.rollouts, rates.evaluation());
    let mut md = format!(
        "Measured: train step {:.0} tokens/s ({}, {}); sampling {:.0} new tokens/s for the rollouts ({}, {}) and {:.0} for the evaluations ({}); other sizes scaled by parameters. Prompts are the data's mean, {:.0} tokens for training (DAPO-Math-17k) and {:.0} for the evaluations (the four benchmarks), under the manifests' templates with Qwen3's tokenizer; responses use {:.0} % of their limits (an assumption).\n\n",
        train.tokens_per_second,
        train.model,
        train.shape,
        sample.tokens_per_second,
        sample.model,
        sample.shape,
        eval_sample.tokens_per_second,
        if rates.evaluations.is_some() {
            format!("{}, {}", eval_sample.model, eval_sample.shape)
        } else {
            "not measured at their own shape: the rollouts' rate".to_string()
        },
        TRAIN_PROMPT_TOKENS,
        EVAL_PROMPT_TOKENS,
        100.0 * RESPONSE_SHARE,
    );
    md.push_str(&match rates.copy() {
        Some(gbps) => format!("The KV-bandwidth bound: new tokens/s ≤ the measured copy rate ({gbps:.0} GB/s) ÷ the bf16 KV bytes a token's attention reads at its mean context (prompt + half the response), per run below; two columns are the run's GPU-hours had both samplers run at it, with this bf16 cache and with an FP8 cache (one byte an element, the bound doubled; training at its measured rate in both). {}\n\n", match rates.rollouts.decode.zip(rates.evaluation_steps().decode) {
            Some((r, e)) => format!("The sampling measurements' decode steps drew {:.0} (rollouts) and {:.0} (evaluations) rows a step and moved their bytes (every weight once, each row's KV cache) at {:.1} % and {:.1} % of the copy rate, at their own contexts, shorter than a paper run's, whose rates, read at fewer KV bytes a token, overstate a paper run's sampling. The column \"at the paper's contexts\" models it instead: the same fraction of the copy rate, with each run's own weights and mean contexts, the rollouts' KV cache at {} and the evaluations' at {} bytes an element, as measured, and the same rows a step {} (new tokens/s = rows ÷ the step's bytes at that rate; a model, not a measurement).{}", r.rows, e.rows, 100.0 * r.fraction, 100.0 * e.fraction, r.kv_elem_bytes, e.kv_elem_bytes, match rates.memory_bytes {
                Some(memory) => format!("up to as many as the GPU's sampler pool holds at the run's mean context: the paged engine's pool, half of what is left of the {} MiB the sampling run recorded after what the run's trainer keeps on the device while it samples ({} bytes a trained parameter, the policy's and a critic's: the fp32 master, the bf16 copy, AdamW's two moments) and {:.0} GiB, in blocks of {} positions (the column \"rows a step\"; a run whose pool holds no row there, its trainer's state filling the GPU, has none)", memory >> 20, memory::resident_bytes_per_param(true), super::sampling::RESERVED_BYTES as f64 / (1u64 << 30) as f64, crate::model::paged::BLOCK),
                None => "(no GPU memory beside the rates, device.txt, so the rows are not capped at what a pool holds at those contexts)".to_string(),
            }, if rates.evaluations.as_ref().is_some_and(|own| own.decode.is_none()) { " The evaluations' measurement recorded no roofline: their decode steps are the rollouts'." } else { "" }),
            None => "The sampling measurements recorded no roofline: their rates are not carried to a paper run's contexts.".to_string(),
        }),
        None => "No copy rate was recorded beside the sampling measurement: no KV-bandwidth bound.\n\n".to_string(),
    });
    let mut t = Table::new([
        ("run", Left),
        ("steps", Right),
        ("sampled tokens", Right),
        ("trained tokens", Right),
        ("eval tokens", Right),
        ("rollouts h", Right),
        ("evaluation h", Right),
        ("training h", Right),
        ("GPU-hours on one GPU (acpo)", Right),
        ("KV bound, rollouts / eval tokens/s", Right),
        ("GPU-hours at the KV bound", Right),
        ("GPU-hours at the FP8 KV bound", Right),
        ("GPU-hours at the paper's contexts", Right),
        ("rows a step there, rollouts / eval", Right),
        ("GPUs the paper used", Right),
    ]);
    for r in rows {
        t.row([
            r.run.clone(),
            r.steps.to_string(),
            format!("{:.2e}", r.sample_tokens),
            format!("{:.2e}", r.train_tokens),
            format!("{:.2e}", r.eval_tokens),
            format!("{:.1}", r.rollout_hours),
            format!("{:.1}", r.eval_hours),
            format!("{:.1}", r.train_hours),
            format!("{:.0}", r.gpu_hours),
            pair(r.rollout_kv_bound_tps, r.eval_kv_bound_tps),
            r.gpu_hours_at_kv_bound
                .map_or("—".into(), |h| format!("{h:.0}")),
            r.gpu_hours_at_fp8_kv_bound
                .map_or("—".into(), |h| format!("{h:.0}")),
            r.gpu_hours_at_paper_contexts
                .map_or("—".into(), |h| format!("{h:.0}")),
            pair(
                r.rollout_rows_at_paper_contexts,
                r.eval_rows_at_paper_contexts,
            ),
            r.paper_gpus.to_string(),
        ]);
    }
    md.push_str(&t.to_string());
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carried to its own model and mean context, the H200 run's sampling measurement gives back
    /// its measured decode rate; at twice the context, less (more KV bytes a row), and for a
    /// model of twice the weights, less.
    #[test]
    fn the_carried_rate_is_the_measured_one_at_the_measured_shape() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = repo.join("results/gpu/NVIDIA-H200-20261126/2-decode/gpu-suite/generate-paper");
        let rate = measured(&dir, "generate").expect("the committed measurement");
        let d = rate.decode.expect("its roofline");
        let cfg =
            crate::model::QwenConfig::load(&repo.join("experiments/paper/configs/qwen3-1.7b.json"))
                .expect("config");
        // 64 prompts of 1,024 + 512 new tokens: the mean context 1,024 + 256
        let carry = |weights: f64, context: f64| {
            carried_rate(
                d.fraction,
                d.rows,
                rate.copy_gb_per_s.expect("copy") * 1e9,
                weights,
                context,
                cfg.kv_bytes_per_position(2) as f64,
            )
        };
        let weights = rate.parameters * 2.0;
        let measured_tps = 4851.361032664127;
        assert!((d.rows - 64.0).abs() < 1e-6, "{}", d.rows);
        assert!((carry(weights, 1280.0) / measured_tps - 1.0).abs() < 1e-9);
        assert!(carry(weights, 2560.0) < measured_tps);
        assert!(carry(2.0 * weights, 1280.0) < measured_tps);
    }
}
