//! Memory: the high-water mark of a piece of work on its device, and the arithmetic of the
//! paper runs (issue #19).
//!
//! - On CUDA, the high-water mark is read from the allocator itself: candle allocates with
//!   `cuMemAllocAsync` from the device's default memory pool, whose `USED_MEM_HIGH` attribute is
//!   the most memory its allocations held at once. It is PyTorch's `max_memory_allocated`.
//! - On the CPU, it is the process's peak resident set (`VmHWM`), reset through
//!   `/proc/self/clear_refs`. It also counts what is not the model's: the binary, the allocator's
//!   caches.
//!
//! [`plan`] is the arithmetic behind docs/CUDA.md's table of the paper runs. It gives the bytes
//! per parameter of training with fp32 masters, and an activation model of the GPU path (flash
//! attention, per-layer checkpointing, vocabulary chunks). It is an estimate; `acpo bench
//! train-step` measures.

use std::path::Path;

use candle_core::Device;
use serde::Serialize;

use crate::manifest::Experiment;
use crate::model::QwenConfig;

/// The peak-memory meter of one device.
pub struct PeakMeter {
    device: Device,
}

impl PeakMeter {
    pub fn new(device: &Device) -> PeakMeter {
        PeakMeter {
            device: device.clone(),
        }
    }

    /// What the meter reads: `cuda allocator` or `cpu peak RSS`.
    pub fn source(&self) -> &'static str {
        if self.device.is_cuda() {
            "cuda allocator high-water mark"
        } else {
            "process peak resident set"
        }
    }

    /// Starts a measurement: the high-water mark is reset to what is in use now.
    pub fn reset(&self) {
        if self.device.is_cuda() {
            cuda::reset(&self.device);
        } else {
            // Writing 5 resets VmHWM to the current RSS (Linux ≥ 4.0); elsewhere the peak
            // is the process's since it started.
            let _ = std::fs::write("/proc/self/clear_refs", "5");
        }
    }

    /// Bytes in use now; None where the device cannot say.
    pub fn current(&self) -> Option<u64> {
        if self.device.is_cuda() {
            cuda::used(&self.device, false)
        } else {
            proc_status_kib("VmRSS:").map(|k| k * 1024)
        }
    }

    /// The most bytes in use at once since [`PeakMeter::reset`].
    pub fn peak(&self) -> Option<u64> {
        if self.device.is_cuda() {
            cuda::used(&self.device, true)
        } else {
            proc_status_kib("VmHWM:").map(|k| k * 1024)
        }
    }
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::Device;

    /// The default memory pool of the device `device` runs on.
    fn pool(device: &Device) -> Option<sys::CUmemoryPool> {
        let Device::Cuda(dev) = device else {
            return None;
        };
        let cu_device = dev.cuda_stream().context().cu_device();
        let mut pool = std::mem::MaybeUninit::uninit();
        // SAFETY: the out-pointer is valid; the driver writes a pool handle on success.
        let ok = unsafe { sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), cu_device) };
        // SAFETY: written on success.
        (ok == sys::CUresult::CUDA_SUCCESS).then(|| unsafe { pool.assume_init() })
    }

    pub(super) fn used(device: &Device, high: bool) -> Option<u64> {
        let pool = pool(device)?;
        device.synchronize().ok()?;
        let attr = if high {
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH
        } else {
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT
        };
        let mut value: u64 = 0;
        // SAFETY: the attribute is a cuuint64_t, written into `value`.
        let ok = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) };
        (ok == sys::CUresult::CUDA_SUCCESS).then_some(value)
    }

    pub(super) fn reset(device: &Device) {
        if let Some(pool) = pool(device) {
            let _ = device.synchronize();
            let mut zero: u64 = 0;
            // SAFETY: resetting USED_MEM_HIGH takes a cuuint64_t zero.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                );
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use candle_core::Device;

    pub(super) fn used(_: &Device, _: bool) -> Option<u64> {
        None
    }

    pub(super) fn reset(_: &Device) {}
}

/// Bytes per parameter of a trained model with fp32 masters and AdamW: master (4), the compute
/// copy the forward reads (2 in bf16, none in f32), the fp32 gradient (4), and the two fp32
/// moments (8).
pub fn state_bytes_per_param(bf16: bool) -> u64 {
    4 + if bf16 { 2 } else { 0 } + 4 + 8
}

/// The training memory of one model of one paper run on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct ModelMemory {
    pub parameters: u64,
    /// Weights, masters, gradients and optimizer state.
    pub state: u64,
    /// Activations of one micro-batch with flash attention, checkpointing and vocab chunks.
    pub activations: u64,
    /// The same without checkpointing (every layer's activations kept).
    pub activations_no_checkpointing: u64,
    /// The same without flash attention (scores and probabilities `(b, H, T, T)` per layer).
    pub activations_no_flash: u64,
}

/// A paper run's memory on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct RunMemory {
    pub run: String,
    pub micro_batch: usize,
    pub seq_len: usize,
    pub policy: ModelMemory,
    pub critic: Option<ModelMemory>,
    /// Policy + critic, with every memory saving on.
    pub total: u64,
}

/// Parameters of a Qwen2/Qwen3 config (the shapes `model::init` writes). With a value head:
/// the backbone and `score` (H + 1), no lm_head (a token-classification model, as verl's
/// critic is).
pub fn parameters(cfg: &QwenConfig, value_head: bool) -> u64 {
    let h = cfg.hidden_size as u64;
    crate::model::init::layout(cfg)
        .iter()
        .filter(|(name, _, _)| !(value_head && name == "lm_head.weight"))
        .map(|(_, shape, _)| shape.iter().product::<usize>() as u64)
        .sum::<u64>()
        + if value_head { h + 1 } else { 0 }
}

/// Activation bytes of one micro-batch of `b` sequences of `t` tokens in bf16, the model this
/// crate's GPU path follows:
/// - checkpointing keeps each layer's input (b·t·H) and recomputes one layer at a time. A layer
///   holds about 6·H + 4·I values per token: the normed inputs, q/k/v and the attention output,
///   gate, up and their SwiGLU product, and the residual sums.
/// - without flash attention, a layer also keeps its scores and probabilities `(b, nh, t, t)`.
/// - the vocabulary end holds about four `(b·t, chunk)` f32 temporaries (logits, exponentials,
///   probabilities, their gradient); a critic's value head holds nothing of that size.
fn activations(
    cfg: &QwenConfig,
    b: u64,
    t: u64,
    checkpointing: bool,
    flash: bool,
    lm: bool,
) -> u64 {
    let (h, i, l) = (
        cfg.hidden_size as u64,
        cfg.intermediate_size as u64,
        cfg.num_hidden_layers as u64,
    );
    let tokens = b * t;
    let layer = 2 * tokens * (6 * h + 4 * i)
        + if flash {
            0
        } else {
            2 * 2 * b * cfg.num_attention_heads as u64 * t * t
        };
    let layers = if checkpointing {
        2 * tokens * h * l + layer
    } else {
        layer * l
    };
    let vocab = if lm {
        4 * 4 * tokens * crate::model::qwen::VOCAB_CHUNK as u64
    } else {
        0
    };
    layers + vocab
}

fn model_memory(cfg: &QwenConfig, b: u64, t: u64, bf16: bool, critic: bool) -> ModelMemory {
    let parameters = parameters(cfg, critic);
    ModelMemory {
        parameters,
        state: parameters * state_bytes_per_param(bf16),
        activations: activations(cfg, b, t, true, true, !critic),
        activations_no_checkpointing: activations(cfg, b, t, false, true, !critic),
        activations_no_flash: activations(cfg, b, t, true, false, !critic),
    }
}

/// The memory of each run of `manifests` (their model configs read from `configs`, named by the
/// manifest's hub repo: `Qwen/Qwen3-1.7B` → `qwen3-1.7b.json`).
pub fn plan(manifests: &[Experiment], configs: &Path) -> crate::model::Result<Vec<RunMemory>> {
    let mut out = Vec::new();
    for exp in manifests {
        let cfg = super::plan::model_config(exp, configs)?;
        let bf16 = exp.model.dtype == crate::manifest::DType::Bf16;
        let t = (exp.data.max_prompt_length + exp.data.max_response_length) as u64;
        let b = exp.actor.micro_batch_size as u64;
        let policy = model_memory(&cfg, b, t, bf16, false);
        // The critic trains with the actor's micro-batches (`UpdatePlan`).
        let critic = exp
            .critic
            .as_ref()
            .map(|_| model_memory(&cfg, b, t, bf16, true));
        // The actor's and the critic's passes run one after the other: their activations are
        // never alive together, their states always are.
        let total = policy.state
            + critic.as_ref().map_or(0, |c| c.state)
            + policy
                .activations
                .max(critic.as_ref().map_or(0, |c| c.activations));
        out.push(RunMemory {
            run: exp.name.clone(),
            micro_batch: b as usize,
            seq_len: t as usize,
            policy,
            critic,
            total,
        });
    }
    Ok(out)
}

/// GiB with one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The usable memory of one 80 GB H100 (what the device reports free to a process).
pub const H100_USABLE_GIB: f64 = 78.0;

/// The plan as a Markdown table.
pub fn plan_markdown(rows: &[RunMemory]) -> String {
    let mut s = String::from(
        "| run | micro-batch × tokens | policy params | policy state | critic state | activations (all savings) | no checkpointing | no flash | total | fits one 80 GB H100 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let critic = r.critic.as_ref();
        let act = |f: fn(&ModelMemory) -> u64| gib(f(&r.policy).max(critic.map_or(0, f)));
        let fits = r.total as f64 / (1u64 << 30) as f64 <= H100_USABLE_GIB;
        s.push_str(&format!(
            "| {} | {} × {} | {:.2} B | {} | {} | {} | {} | {} | {} | {} |\n",
            r.run,
            r.micro_batch,
            r.seq_len,
            r.policy.parameters as f64 / 1e9,
            gib(r.policy.state),
            critic.map_or_else(|| "—".into(), |c| gib(c.state)),
            act(|m| m.activations),
            act(|m| m.activations_no_checkpointing),
            act(|m| m.activations_no_flash),
            gib(r.total),
            if fits { "yes" } else { "no: verl (FSDP)" },
        ));
    }
    s.push_str(&format!(
        "\nGiB = 2^30 bytes. State = {} bytes per parameter (fp32 master, bf16 compute copy, fp32 gradient, two fp32 AdamW moments). Activations are estimates for one micro-batch (`perf::memory`); the larger of the actor's and the critic's, which never run together. An H100 offers about {H100_USABLE_GIB} GiB to a process.\n",
        state_bytes_per_param(true)
    ));
    s
}
