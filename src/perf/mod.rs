//! Speed benchmarks (`acpo bench generate|train-step`): tokens per second of the sampler and of
//! one policy-gradient training step, on random Qwen3 models of two sizes. The same
//! configurations and shapes are measured for PyTorch/transformers by `tools/bench_torch.py`.
//!
//! Targets live here, not in timed tests: a report states what was measured on which machine.

pub mod verifier;

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::manifest::{LossAggMode, LrSchedule, OptimSpec, PolicyClip};
use crate::model::qwen::Qwen;
use crate::model::{init, ModelError, QwenConfig};
use crate::optim::AdamW;
use crate::rollout::{self, SampleRequest, SamplingParams};
use crate::train::batch::Layout;
use crate::train::step::old_log_probs;
use crate::train::update::{self, UpdatePlan};

/// Why a benchmark could not run or write its report.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Boxed: a training error is large.
    #[error(transparent)]
    Train(Box<crate::train::TrainError>),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--repeats must be at least 1")]
    NoRepeats,
}

impl From<crate::train::TrainError> for PerfError {
    fn from(e: crate::train::TrainError) -> Self {
        PerfError::Train(Box::new(e))
    }
}

impl From<candle_core::Error> for PerfError {
    fn from(e: candle_core::Error) -> Self {
        PerfError::Model(e.into())
    }
}

pub type Result<T> = std::result::Result<T, PerfError>;

/// What `acpo bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchKind {
    /// Sampling throughput (tokens/s).
    Generate,
    /// One RL training step (tokens/s).
    TrainStep,
    /// Verifier throughput (answers/s).
    Verifier,
}

/// Writes `bytes` under `dir` atomically; returns the path.
pub(crate) fn write_report(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    crate::atomic::write_in(dir, name, bytes).map_err(|source| PerfError::Io {
        path: dir.join(name),
        source,
    })
}

/// Measures the speed benchmark `kind` on the model sizes (the tiny one only if asked), prints
/// a line per model and writes `<kind>.json` and `<kind>.md` under `out`. Returns the report.
pub fn speed(
    kind: BenchKind,
    out: &Path,
    repeats: usize,
    tiny_only: bool,
    target: &Target,
) -> Result<PathBuf> {
    if repeats == 0 {
        return Err(PerfError::NoRepeats);
    }
    let (name, run): (&str, BenchFn) = match kind {
        BenchKind::Generate => ("generate", bench_generate),
        BenchKind::TrainStep => ("train-step", bench_train_step),
        BenchKind::Verifier => unreachable!("the verifier benchmark is verifier::bench"),
    };
    let mut rows = Vec::new();
    for m in MODELS.iter().take(if tiny_only { 1 } else { MODELS.len() }) {
        let r = run(m, repeats, target)?;
        println!(
            "{:<12} {:>11} params  {:<10} {:<9} {:>8.1} tokens/s  ({:.3} s for {} tokens)",
            r.model, r.parameters, r.what, r.target, r.tokens_per_second, r.seconds, r.tokens
        );
        rows.push(r);
    }
    let json = serde_json::to_string_pretty(&rows).expect("invariant: measurements are JSON");
    write_report(out, &format!("{name}.json"), json.as_bytes())?;
    let md = markdown(&format!("acpo bench {name}"), &rows);
    write_report(out, &format!("{name}.md"), md.as_bytes())
}

/// A benchmarked model size.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BenchModel {
    pub name: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
}

/// The two sizes of issue #4: a tiny model and a ~100M-parameter Qwen3 (tied embeddings).
pub const MODELS: [BenchModel; 2] = [
    BenchModel {
        name: "tiny",
        vocab_size: 1024,
        hidden_size: 64,
        intermediate_size: 192,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
    },
    BenchModel {
        name: "qwen3-100m",
        vocab_size: 32000,
        hidden_size: 768,
        intermediate_size: 2048,
        num_hidden_layers: 12,
        num_attention_heads: 12,
        num_key_value_heads: 4,
        head_dim: 64,
    },
];

/// Shapes shared with tools/bench_torch.py.
pub const BATCH: usize = 8;
pub const PROMPT_LEN: usize = 32;
pub const NEW_TOKENS: usize = 64;
pub const TRAIN_SEQ_LEN: usize = 128;

impl BenchModel {
    pub fn config(&self) -> Result<QwenConfig> {
        let json = serde_json::json!({
            "model_type": "qwen3", "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": true, "max_position_embeddings": 4096, "hidden_act": "silu",
        });
        Ok(QwenConfig::from_json(
            &json.to_string(),
            std::path::Path::new("<bench>"),
        )?)
    }
}

/// A benchmark: measure one model size, `repeats` timed runs.
pub type BenchFn = fn(&BenchModel, usize, &Target) -> Result<Measurement>;

/// Where a speed benchmark runs: the device, and the dtypes of weights and arithmetic (training
/// keeps fp32 masters, [`crate::model::Precision`]).
#[derive(Debug, Clone)]
pub struct Target {
    pub device: Device,
    pub dtype: crate::manifest::DType,
}

impl Target {
    /// The CPU in f32 (the benchmarks of issue #4).
    pub fn cpu() -> Target {
        Target {
            device: Device::Cpu,
            dtype: crate::manifest::DType::F32,
        }
    }

    fn name(&self) -> String {
        let dev = if self.device.is_cuda() { "cuda" } else { "cpu" };
        format!("{dev}/{}", format!("{:?}", self.dtype).to_lowercase())
    }

    /// Waits for the device's queued work, so that a host clock read after it is the truth.
    fn sync(&self) -> Result<()> {
        Ok(self.device.synchronize()?)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub model: &'static str,
    pub parameters: usize,
    pub what: &'static str,
    /// Device and dtype, e.g. `cpu/f32`, `cuda/bf16`.
    pub target: String,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub repeats: usize,
}

fn prompt_ids(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = crate::rng::SplitMix64::new(11);
    (0..BATCH)
        .map(|_| {
            (0..PROMPT_LEN)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect()
        })
        .collect()
}

/// Sampling throughput: BATCH prompts of PROMPT_LEN tokens, NEW_TOKENS new tokens each at T = 1
/// (no early stop), median of `repeats` runs after a warm-up.
pub fn bench_generate(m: &BenchModel, repeats: usize, target: &Target) -> Result<Measurement> {
    let cfg = m.config()?;
    let precision = crate::model::Precision::inference(target.dtype);
    let params = init::random_params(&cfg, 0, precision.master, &target.device)?;
    let model = Qwen::new(&cfg, &params, true)?;
    let prompts = prompt_ids(m.vocab_size);
    let keys: Vec<[u64; 4]> = (0..BATCH as u64).map(|i| [0, 0, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: NEW_TOKENS,
    };
    let run = || -> Result<f64> {
        let t = Instant::now();
        let out = rollout::generate(&model, &prompts, &keys, &SampleRequest::new(p))?;
        debug_assert!(out.iter().all(|c| c.tokens.len() == NEW_TOKENS));
        target.sync()?;
        Ok(t.elapsed().as_secs_f64())
    };
    run()?;
    let secs = median((0..repeats).map(|_| run()).collect::<Result<Vec<_>>>()?);
    let tokens = BATCH * NEW_TOKENS;
    Ok(Measurement {
        model: m.name,
        parameters: params.count(),
        what: "generate",
        target: target.name(),
        tokens,
        seconds: secs,
        tokens_per_second: tokens as f64 / secs,
        repeats,
    })
}

/// Rows per micro-batch in the train-step benchmark: the batch of 8 is two micro-batches, run
/// side by side as the trainer runs them (`crate::parallel`), their gradients summed.
pub const TRAIN_MICRO_BATCH: usize = 4;

/// One policy-gradient training step exactly as the trainer takes it: the trainer's own actor
/// update ([`crate::train::update::actor`]) on BATCH sequences of TRAIN_SEQ_LEN tokens (one
/// prompt token, the rest response) with the GRPO-AC loss (α = 2, token-mean), micro-batches
/// of TRAIN_MICRO_BATCH side by side on the CPU, the entropy computed as training does, then
/// one global-norm clip (1.0) and AdamW step. Median of `repeats` after a warm-up.
pub fn bench_train_step(m: &BenchModel, repeats: usize, target: &Target) -> Result<Measurement> {
    let cfg = m.config()?;
    let dev = target.device.clone();
    let precision = crate::model::Precision::training(target.dtype);
    let params =
        init::random_params(&cfg, 0, precision.master, &dev)?.with_compute(precision.compute);
    let mut rng = crate::rng::SplitMix64::new(12);
    let (b, t) = (BATCH, TRAIN_SEQ_LEN);
    let ids: Vec<u32> = (0..b * t)
        .map(|_| (rng.next_u64() % m.vocab_size as u64) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (b, t), &dev)?;
    let layout = Layout {
        positions: Tensor::arange(0u32, t as u32, &dev)?
            .unsqueeze(0)?
            .repeat((b, 1))?,
        valid: Tensor::ones((b, t), DType::U8, &dev)?,
        targets: ids.narrow(1, 1, t - 1)?,
        mask: Tensor::ones((b, t - 1), DType::F32, &dev)?,
        ids,
        prompt_len: 1,
    };
    let adv: Vec<f32> = (0..b * (t - 1)).map(|_| rng.next_normal() as f32).collect();
    let adv = Tensor::from_vec(adv, (b, t - 1), &dev)?;
    let spec = OptimSpec {
        lr: 1e-6,
        lr_schedule: LrSchedule::Constant,
        warmup_steps: 0,
        grad_clip: 1.0,
        weight_decay: 0.01,
        betas: [0.9, 0.999],
        eps: 1e-8,
    };
    let mut opt = AdamW::new(&params, &spec)?;
    let clip = PolicyClip::Advantage { alpha: 2.0 };
    let plan = UpdatePlan {
        mini_rows: b,
        micro: TRAIN_MICRO_BATCH,
        epochs: 1,
        agg_mode: LossAggMode::TokenMean,
        horizon: t,
        clip,
        temperature: 1.0,
        entropy_coeff: 0.0,
        side_by_side: true,
    };
    let sampler = Qwen::new(&cfg, &params, true)?;
    let (old, _) = old_log_probs(&sampler, None, &layout, &plan)?;
    let mut step = || -> Result<f64> {
        let start = Instant::now();
        update::actor(&cfg, &params, &mut opt, &layout, &old, &adv, &plan, 1, None)?;
        target.sync()?;
        Ok(start.elapsed().as_secs_f64())
    };
    step()?;
    let secs = median((0..repeats).map(|_| step()).collect::<Result<Vec<_>>>()?);
    let tokens = b * t;
    Ok(Measurement {
        model: m.name,
        parameters: params.count(),
        what: "train-step",
        target: target.name(),
        tokens,
        seconds: secs,
        tokens_per_second: tokens as f64 / secs,
        repeats,
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Markdown table of measurements.
pub fn markdown(title: &str, rows: &[Measurement]) -> String {
    let mut s = format!(
        "# {title}\n\nMachine: {} CPU threads available. Shapes: batch {BATCH}, prompt {PROMPT_LEN}, new tokens {NEW_TOKENS}, train sequence {TRAIN_SEQ_LEN}.\n\n| model | parameters | what | tokens | seconds (median) | tokens/s |\n|---|---:|---|---:|---:|---:|\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.4} | {:.1} |\n",
            r.model, r.parameters, r.what, r.tokens, r.seconds, r.tokens_per_second
        ));
    }
    s
}
