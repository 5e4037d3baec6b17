//! Speed benchmarks (`acpo bench generate|train-step`): tokens per second of the sampler and of
//! one policy-gradient training step, on random Qwen3 models of two sizes. The same
//! configurations and shapes are measured for PyTorch/transformers by `tools/bench_torch.py`.
//!
//! Targets live here, not in timed tests: a report states what was measured on which machine.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::algo::loss::{self, Aggregation};
use crate::manifest::{LossAggMode, LrSchedule, OptimSpec, PolicyClip};
use crate::model::qwen::Qwen;
use crate::model::{init, QwenConfig, Result};
use crate::optim::{AdamW, Gradients};
use crate::rollout::{self, SamplingParams, StopCriteria};

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
        QwenConfig::from_json(&json.to_string(), std::path::Path::new("<bench>"))
    }
}

/// A benchmark: measure one model size, `repeats` timed runs.
pub type BenchFn = fn(&BenchModel, usize) -> Result<Measurement>;

#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub model: &'static str,
    pub parameters: usize,
    pub what: &'static str,
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
pub fn bench_generate(m: &BenchModel, repeats: usize) -> Result<Measurement> {
    let cfg = m.config()?;
    let params = init::random_params(&cfg, 0, DType::F32, &Device::Cpu)?;
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
        let out = rollout::generate(&model, &prompts, &keys, &p, &StopCriteria::default(), 0)?;
        debug_assert!(out.iter().all(|c| c.tokens.len() == NEW_TOKENS));
        Ok(t.elapsed().as_secs_f64())
    };
    run()?;
    let secs = median((0..repeats).map(|_| run()).collect::<Result<Vec<_>>>()?);
    let tokens = BATCH * NEW_TOKENS;
    Ok(Measurement {
        model: m.name,
        parameters: params.count(),
        what: "generate",
        tokens,
        seconds: secs,
        tokens_per_second: tokens as f64 / secs,
        repeats,
    })
}

/// Rows per micro-batch in the train-step benchmark: the batch of 8 is two micro-batches, run
/// side by side as the trainer runs them (`crate::parallel`), their gradients summed.
pub const TRAIN_MICRO_BATCH: usize = 4;

/// One policy-gradient step as the trainer takes it: per micro-batch a forward over its rows ×
/// TRAIN_SEQ_LEN tokens, log-probs, the ACPO loss (token-mean over the whole batch) and backward,
/// micro-batches side by side on the CPU; then the summed gradients' norm clipped to 1 and an
/// AdamW update ([`crate::optim::AdamW`]). Median of `repeats` after a warm-up.
pub fn bench_train_step(m: &BenchModel, repeats: usize) -> Result<Measurement> {
    let cfg = m.config()?;
    let params = init::random_params(&cfg, 0, DType::F32, &Device::Cpu)?;
    let dev = Device::Cpu;
    let mut rng = crate::rng::SplitMix64::new(12);
    let (b, t) = (BATCH, TRAIN_SEQ_LEN);
    let ids: Vec<u32> = (0..b * t)
        .map(|_| (rng.next_u64() % m.vocab_size as u64) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (b, t), &dev)?;
    let pos = Tensor::arange(0u32, t as u32, &dev)?
        .unsqueeze(0)?
        .repeat((b, 1))?;
    let valid = Tensor::ones((b, t), DType::U8, &dev)?;
    let targets = ids.narrow(1, 1, t - 1)?;
    let adv: Vec<f32> = (0..b * (t - 1)).map(|_| rng.next_normal() as f32).collect();
    let adv = Tensor::from_vec(adv, (b, t - 1), &dev)?;
    let mask = Tensor::ones((b, t - 1), DType::F32, &dev)?;
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
    let agg = Aggregation::new(
        LossAggMode::TokenMean,
        &mask,
        b.div_ceil(TRAIN_MICRO_BATCH),
        t,
    )?;
    let clip = PolicyClip::Advantage { alpha: 2.0 };
    let old = {
        let model = Qwen::new(&cfg, &params, true)?;
        let (hidden, _) = model.forward_hidden(&ids, &pos, &valid, None)?;
        let h = hidden.narrow(1, 0, t - 1)?;
        model.token_log_probs(&h, &targets, 1.0, 64, false)?.0
    };
    let mut step = || -> Result<f64> {
        let start = Instant::now();
        let model = Qwen::new(&cfg, &params, false)?;
        let outs = crate::parallel::map_micro_batches(
            0..b,
            TRAIN_MICRO_BATCH,
            true,
            |s, len| -> Result<Gradients> {
                let rows = |x: &Tensor| x.narrow(0, s, len);
                let (hidden, _) =
                    model.forward_hidden(&rows(&ids)?, &rows(&pos)?, &rows(&valid)?, None)?;
                let h = hidden.narrow(1, 0, t - 1)?;
                let (lp, _) = model.token_log_probs(&h, &rows(&targets)?, 1.0, 64, false)?;
                let out =
                    loss::policy_loss(&clip, &lp, &rows(&old)?, &rows(&adv)?, &rows(&mask)?, &agg)?;
                Gradients::from_store(&params, &out.loss.backward()?)
            },
        );
        let mut grads = Gradients::default();
        for g in outs {
            grads.accumulate(g?)?;
        }
        opt.step(&grads)?;
        Ok(start.elapsed().as_secs_f64())
    };
    step()?;
    let secs = median((0..repeats).map(|_| step()).collect::<Result<Vec<_>>>()?);
    let tokens = b * t;
    Ok(Measurement {
        model: m.name,
        parameters: params.count(),
        what: "train-step",
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
