//! `acpo bench train-step`: one policy-gradient training step as the trainer takes it (the
//! actor update, the global-norm clip and AdamW), its tokens per second, MFU and peak memory,
//! and with `--trace` the bytes in use and the seconds of each phase.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::{
    median_of, memory, peak_flops, train_flops, Measurement, PerfError, Result, SpeedOptions,
    StepMemory, StepSettings, StepShape, Subject,
};
use crate::algo::clip::PolicyClip;
use crate::algo::method::LossAggMode;
use crate::fused::FlashBackward;
use crate::model::init;
use crate::model::qwen::Kernels;
use crate::optim::{AdamW, LrSchedule, OptimSpec};
use crate::train::batch::Layout;
use crate::train::update::{self, UpdatePlan};

/// Rows per micro-batch in the train-step benchmark: the batch of 8 is two micro-batches, run
/// side by side as the trainer runs them (`crate::parallel`), their gradients summed.
pub const TRAIN_MICRO_BATCH: usize = 4;

/// One policy-gradient training step exactly as the trainer takes it: the trainer's own actor
/// update ([`crate::train::update::actor`]) on `shape.batch` sequences of `shape.seq_len`
/// tokens (`shape.prompt_len` prompt tokens, the rest response) with the GRPO-AC loss (α = 2,
/// token-mean), micro-batches of `shape.micro_batch` (side by side on the CPU, one after another
/// on a GPU, as the trainer runs them), the entropy computed as training does, then one
/// global-norm clip (1.0) and AdamW step. Median of `repeats` after a warm-up; the peak memory
/// over the timed steps. With `shape.trace`, one more step after them, traced and left out of
/// the timing, gives the phases and their parts.
pub fn bench_train_step(m: &Subject, opts: &SpeedOptions) -> Result<Measurement> {
    let (target, shape) = (&opts.target, &opts.step);
    let cfg = &m.cfg;
    let dev = target.device.clone();
    check_shape(shape)?;
    let (b, t, p) = (shape.batch, shape.seq_len, shape.prompt_len);
    let precision = crate::model::Precision::training(target.dtype);
    let kernels = shape.kernels.unwrap_or_else(|| Kernels::for_device(&dev));
    let need = step_bytes(cfg, shape, precision, kernels, dev.is_cpu());
    crate::model::budget::check(&dev, need, || {
        format!(
            "--batch {b} sequences of --seq-len {t} tokens, --micro-batch {} at once",
            shape.micro_batch
        )
    })?;
    let params =
        init::random_params(cfg, 0, precision.master, &dev)?.with_compute(precision.compute);
    let r = t - p;
    let (layout, adv) = random_batch(cfg.vocab_size, b, t, p, &dev)?;
    let mut opt = AdamW::new(&params, &bench_optim_spec())?;
    let plan = bench_plan(shape, r, kernels, dev.is_cpu());
    // The old log-probs from random numbers: computing them with the policy would cost a
    // second forward of the paper shape for nothing the step's speed depends on.
    let old = (Tensor::randn(0f32, 1.0, (b, r), &dev)?.abs()? * -1.0)?;
    let mut step = || -> Result<f64> {
        let start = Instant::now();
        update::actor(cfg, &params, &mut opt, &layout, &old, &adv, &plan, 1, None)?;
        target.sync()?;
        Ok(start.elapsed().as_secs_f64())
    };
    step()?;
    let meter = crate::device::PeakMeter::new(&dev);
    let before = meter.current();
    meter.reset();
    // The timed steps run untraced: a trace waits for the device at every part of every
    // layer, which would slow the very steps whose rate is reported.
    let secs = median_of(opts.repeats, &mut step)?;
    let peak = meter.peak();
    // The phases and parts come from one more step, traced and not timed.
    let trace = if shape.trace {
        Some(traced(&dev, &mut step)?)
    } else {
        None
    };
    let bf16 = precision.compute != precision.master;
    let tokens = b * t;
    Ok(Measurement {
        model: m.name.clone(),
        parameters: params.count(),
        what: "train-step",
        target: target.name(),
        tokens,
        seconds: secs,
        tokens_per_second: tokens as f64 / secs,
        repeats: opts.repeats,
        shape: Some(step_label(
            shape,
            kernels,
            kernels
                .flash_backward
                .runs_on(&dev, precision.compute, cfg.head_dim()),
        )),
        mfu: peak_flops(target).map(|peak| train_flops(cfg, b, t) / secs / peak),
        memory: Some(
            StepMemory::arithmetic(cfg, shape, params.count() as u64, bf16, kernels).measured(
                meter.source(),
                peak,
                before,
            ),
        ),
        roofline: None,
        trace,
        settings: Some(StepSettings::of(
            cfg,
            shape,
            kernels,
            crate::fused::flash_applies(&dev, precision.compute, cfg.head_dim()),
            precision.compute,
        )),
    })
}

/// The train-step benchmark's shape refused before anything is allocated: a prompt of at least
/// one token with a response after it, a batch and micro-batches of at least one sequence.
fn check_shape(shape: &StepShape) -> Result<()> {
    let (b, t, p) = (shape.batch, shape.seq_len, shape.prompt_len);
    if p == 0 || p >= t || b == 0 || shape.micro_batch == 0 {
        return Err(PerfError::Shape(format!(
            "--prompt-len {p} must be at least 1 and below --seq-len {t}; --batch {b} and --micro-batch {} at least 1",
            shape.micro_batch
        )));
    }
    Ok(())
}

/// One more `step`, traced: the device's memory and seconds at each phase and part.
fn traced(
    dev: &Device,
    step: &mut impl FnMut() -> Result<f64>,
) -> Result<Vec<crate::device::Mark>> {
    crate::device::start(dev);
    crate::device::mark(|| "before the step: masters and optimizer state".into());
    let ran = step();
    let marks = crate::device::finish();
    ran?;
    Ok(marks)
}

impl StepMemory {
    /// What arithmetic says of a train step's memory, `n` parameters with fp32 masters,
    /// gradients and AdamW's two moments, a bf16 compute copy where `bf16`, and the tensors
    /// named at the shape ([`memory::step_tensors`]); nothing measured.
    fn arithmetic(
        cfg: &crate::model::QwenConfig,
        shape: &StepShape,
        n: u64,
        bf16: bool,
        kernels: Kernels,
    ) -> StepMemory {
        StepMemory {
            source: "",
            peak: None,
            before_step: None,
            weights: if bf16 { 2 * n } else { 0 },
            masters: 4 * n,
            grads: 4 * n,
            optimizer: 8 * n,
            activations: None,
            named: memory::step_tensors(
                cfg,
                shape.micro_batch as u64,
                shape.seq_len as u64,
                bf16,
                shape.checkpointing,
                kernels.flash_attention,
                kernels.vocab_chunk.is_some(),
            ),
        }
    }

    /// The same with what `source` measured: the `peak` of the timed steps and the bytes in use
    /// `before` them; the activations and temporaries are what the peak holds beyond those and
    /// the gradients.
    fn measured(self, source: &'static str, peak: Option<u64>, before: Option<u64>) -> StepMemory {
        StepMemory {
            source,
            peak,
            before_step: before,
            activations: peak
                .zip(before)
                .map(|(p, b)| p.saturating_sub(b + self.grads)),
            ..self
        }
    }
}

/// Bytes a train step of `shape` holds at least, computed from the flags before anything is
/// allocated: the f32 masters, gradients and AdamW's two moments; side by side (the CPU) the
/// gradient sums of every micro-batch, alive until all are done (`train::update`); the batch
/// (ids, positions, validity, mask, old log-probs and advantages: 9 bytes a position and 12 a
/// response token) and each response token's ratio and r·Â (8 bytes); and one micro-batch's
/// forward without its graph (its graph holds more).
fn step_bytes(
    cfg: &crate::model::QwenConfig,
    shape: &StepShape,
    precision: crate::model::Precision,
    kernels: Kernels,
    side_by_side: bool,
) -> u128 {
    let (b, t) = (shape.batch as u128, shape.seq_len as u128);
    let r = t.saturating_sub(shape.prompt_len as u128);
    let params = cfg.parameter_count();
    let sums = if side_by_side {
        b.div_ceil(shape.micro_batch.max(1) as u128) * 4 * params
    } else {
        0
    };
    16 * params
        + sums
        + b * (9 * t + 20 * r)
        + cfg.forward_bytes(
            shape.micro_batch.min(shape.batch),
            shape.seq_len,
            0,
            precision.compute.size_in_bytes(),
            !kernels.flash_attention,
        )
}

/// The train-step benchmark's optimizer: AdamW, a constant learning rate, the global-norm clip
/// at 1.0.
fn bench_optim_spec() -> OptimSpec {
    OptimSpec {
        lr: 1e-6,
        lr_schedule: LrSchedule::Constant,
        warmup_steps: 0,
        grad_clip: 1.0,
        weight_decay: 0.01,
        betas: [0.9, 0.999],
        eps: 1e-8,
    }
}

/// The train-step benchmark's update: one mini-batch of the whole batch, one epoch, GRPO-AC
/// (α = 2, token-mean) over `horizon` response tokens, micro-batches side by side on the CPU.
fn bench_plan(shape: &StepShape, horizon: usize, kernels: Kernels, cpu: bool) -> UpdatePlan {
    let clip = PolicyClip::Advantage { alpha: 2.0 };
    UpdatePlan {
        mini_rows: shape.batch,
        micro: shape.micro_batch,
        epochs: 1,
        agg_mode: LossAggMode::TokenMean,
        horizon,
        clip,
        compared: crate::algo::clip::compared_rules(
            crate::algo::method::AlgorithmKind::GrpoAc,
            &clip,
        ),
        temperature: 1.0,
        entropy_coeff: 0.0,
        side_by_side: cpu,
        kernels,
        checkpointing: shape.checkpointing,
    }
}

/// A train step's shape and memory settings in words, for the report's table; `backward` is the
/// attention backward that ran ([`FlashBackward::runs_on`]), not the one asked.
fn step_label(shape: &StepShape, kernels: Kernels, backward: FlashBackward) -> String {
    format!(
        "{}×{} (prompt {}), micro-batch {}, {}{}{}{}{}",
        shape.batch,
        shape.seq_len,
        shape.prompt_len,
        shape.micro_batch,
        if kernels.flash_attention {
            "flash attention"
        } else {
            "composed attention"
        },
        kernels.vocab_chunk.map_or_else(
            || ", logits by positions".to_string(),
            |c| format!(", vocab chunks of {c}")
        ),
        if shape.checkpointing {
            ", checkpointing"
        } else {
            ""
        },
        if kernels.layer_by_hand {
            ", layer backward by hand"
        } else {
            ""
        },
        if kernels.flash_attention && backward == FlashBackward::FiveProducts {
            ", attention backward in 5 products"
        } else {
            ""
        },
    )
}

/// `b` random sequences of `t` tokens, the first `p` of them prompt, unpadded, and a random
/// advantage per response token.
fn random_batch(
    vocab: usize,
    b: usize,
    t: usize,
    p: usize,
    dev: &Device,
) -> Result<(Layout, Tensor)> {
    let mut rng = crate::rng::SplitMix64::new(12);
    let ids: Vec<u32> = (0..b * t)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (b, t), dev)?;
    let r = t - p;
    let layout = Layout {
        positions: Tensor::arange(0u32, t as u32, dev)?
            .unsqueeze(0)?
            .repeat((b, 1))?,
        valid: Tensor::ones((b, t), DType::U8, dev)?,
        targets: ids.narrow(1, p, r)?,
        mask: Tensor::ones((b, r), DType::F32, dev)?,
        ids,
        prompt_len: p,
    };
    let adv: Vec<f32> = (0..b * r).map(|_| rng.next_normal() as f32).collect();
    Ok((layout, Tensor::from_vec(adv, (b, r), dev)?))
}
