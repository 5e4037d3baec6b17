//! The benchmarks (`acpo bench KIND`), one file each: `generate` (the sampler, waves and
//! continuous batching), `train_step` (one policy-gradient step, its peak memory and trace),
//! `attention` (one layer's attention alone), [`verifier`], [`memory`] (the paper runs' memory
//! arithmetic), [`plan`] (their GPU-hours), [`predict`] (GPU memory from CPU traces), [`decode`]
//! (the decode attention's time from its bytes), [`flash_predict`] (the tensor-core
//! attention's time from a model of its timed kernels) and
//! [`pipeline`]. Here: what they share (the models and shapes measured, the target device, a
//! measurement and its Markdown, the FLOP counts), and the dispatch of the speed benchmarks. The
//! same configurations and shapes are measured for PyTorch/transformers by
//! `tools/twins/bench_torch.py`.
//!
//! Targets live here, not in timed tests: a report states what was measured on which machine.

mod attention;
pub mod decode;
pub mod flash_predict;
mod generate;
pub mod kernels_load;
pub mod memory;
pub mod pipeline;
pub mod plan;
pub mod predict;
pub mod sampling;
mod train_step;
pub mod verifier;

pub use attention::bench_attention;
pub use generate::{
    bench_generate, bench_long_tail, continuous_reads, kv_reads, long_tail_lengths, DecodeReads,
};
pub use train_step::{bench_train_step, TRAIN_MICRO_BATCH};

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::files::{AtPath, PathIoError};

use crate::model::qwen::Kernels;
use crate::model::{ModelError, QwenConfig};
use crate::report::table::{Align::Left, Align::Right, Table};

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
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("--repeats must be at least 1")]
    NoRepeats,
    #[error("{0}")]
    Shape(String),
    /// A call into the GPU's driver failed (not the shape asked for).
    #[error("{0}")]
    Driver(String),
    #[error(
        "bench {0}: needs a CUDA GPU (--device cuda, from a binary built with --features cuda)"
    )]
    NeedsCuda(&'static str),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    /// Boxed: it carries a training error.
    #[error(transparent)]
    Reproduce(Box<crate::reproduce::ReproduceError>),
}

impl From<crate::reproduce::ReproduceError> for PerfError {
    fn from(e: crate::reproduce::ReproduceError) -> Self {
        PerfError::Reproduce(Box::new(e))
    }
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

/// What a speed benchmark ([`speed`]) measures, per model size; the other benchmarks have
/// their own functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeedKind {
    /// Sampling throughput (tokens/s).
    Generate,
    /// One RL training step (tokens/s, peak memory).
    TrainStep,
    /// The attention alone, forward and forward + backward (flash or composed).
    Attention,
}

/// Writes `bytes` under `dir` atomically; returns the path.
pub(crate) fn write_report(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    Ok(crate::atomic::write_in(dir, name, bytes)?)
}

/// `acpo bench decode-predict`: from the GPU runs under `measured` (their copy rates, memory
/// and split-K timings) and the model config `target`, the decode attention's predicted times
/// ([`decode`]) and the GPU suite's paged sampling runs at each GPU's pool ([`sampling`]),
/// written under `out`; returns the decode report.
pub fn decode_predict(measured: &Path, target: &Path, out: &Path) -> Result<PathBuf> {
    let rates = decode::copy_rates(measured)?;
    let cfg = crate::model::QwenConfig::load(target)?;
    let model = target
        .file_stem()
        .map_or("the model".into(), |s| s.to_string_lossy().into_owned());
    sampling::write(&cfg, &model, &rates, out)?;
    decode::write(&cfg, &model, &rates, out)
}

/// What a speed benchmark measures, beyond its kind.
#[derive(Debug, Clone)]
pub struct SpeedOptions {
    /// Timed repetitions (the median is reported).
    pub repeats: usize,
    /// Only the tiny built-in model.
    pub tiny_only: bool,
    pub target: Target,
    /// An HF config.json measured on random weights instead of the built-in sizes.
    pub config: Option<PathBuf>,
    pub step: StepShape,
    pub sample: SampleShape,
}

/// The shape of the generate benchmark.
#[derive(Debug, Clone, Copy)]
pub struct SampleShape {
    /// Rows sampled: prompts × `group`.
    pub batch: usize,
    pub prompt_len: usize,
    /// New tokens per prompt (no early stop).
    pub new_tokens: usize,
    /// Sequences decoded at once (continuous batching); None: all.
    pub max_batch: Option<usize>,
    /// Responses per prompt (a GRPO group, Avg@k's k): `batch / group` distinct prompts, each
    /// `group` times in a row, every row its own key; the paged engine prefills a group once.
    pub group: usize,
    /// Response lengths from a long-tailed distribution instead of `new_tokens` for all: the
    /// benchmark then compares waves of `max_batch` prompts with continuous batching.
    pub long_tail: bool,
    /// Decode over the paged KV cache (`rollout::PagedOptions`): `generate` samples through
    /// it; the long-tail benchmark adds a third run, continuous batching with as many rows as
    /// the pool holds (`max_batch`, when given, still caps them).
    pub paged: bool,
    /// The long-tail benchmark's paged run alone (with `long_tail` and `paged`): no waves and no
    /// continuous batching over the dense cache.
    pub paged_only: bool,
    /// How the KV cache holds keys and values ([`crate::model::qwen::KvCacheDtype`]): an FP8
    /// cache on a GPU reads half the bytes a decode step moves (the roofline counts them so).
    pub kv_cache: crate::model::qwen::KvCacheDtype,
}

impl Default for SampleShape {
    fn default() -> SampleShape {
        SampleShape {
            batch: BATCH,
            prompt_len: PROMPT_LEN,
            new_tokens: NEW_TOKENS,
            max_batch: None,
            group: 1,
            long_tail: false,
            paged: false,
            paged_only: false,
            kv_cache: crate::model::qwen::KvCacheDtype::Model,
        }
    }
}

/// The shape and the memory settings of the train-step benchmark.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    /// Tokens per sequence, prompt included.
    pub seq_len: usize,
    /// Prompt tokens (no loss on them).
    pub prompt_len: usize,
    /// Sequences in the step.
    pub batch: usize,
    /// Sequences per micro-batch (forward + backward at once).
    pub micro_batch: usize,
    /// None: the device's default kernels ([`Kernels::for_device`]).
    pub kernels: Option<Kernels>,
    pub checkpointing: bool,
    /// Trace the device's memory by phase through the timed steps ([`crate::device::mark`]).
    pub trace: bool,
}

impl Default for StepShape {
    /// The built-in shape (issue #4): BATCH sequences of TRAIN_SEQ_LEN tokens, one prompt token,
    /// micro-batches of TRAIN_MICRO_BATCH.
    fn default() -> StepShape {
        StepShape {
            seq_len: TRAIN_SEQ_LEN,
            prompt_len: 1,
            batch: BATCH,
            micro_batch: TRAIN_MICRO_BATCH,
            kernels: None,
            checkpointing: false,
            trace: false,
        }
    }
}

/// A model to benchmark: a name and its config.
#[derive(Debug, Clone)]
pub struct Subject {
    pub name: String,
    pub cfg: QwenConfig,
}

impl SpeedOptions {
    fn subjects(&self) -> Result<Vec<Subject>> {
        if let Some(path) = &self.config {
            let cfg = QwenConfig::load(path)?;
            let name = path
                .parent()
                .and_then(|d| d.file_name())
                .filter(|_| path.file_name().is_some_and(|f| f == "config.json"))
                .or_else(|| path.file_stem())
                .map_or_else(|| "config".into(), |s| s.to_string_lossy().into_owned());
            return Ok(vec![Subject { name, cfg }]);
        }
        MODELS
            .iter()
            .take(if self.tiny_only { 1 } else { MODELS.len() })
            .map(|m| {
                Ok(Subject {
                    name: m.name.into(),
                    cfg: m.config()?,
                })
            })
            .collect()
    }
}

/// Measures the speed benchmark `kind` on the model sizes (the tiny one only if asked, or the
/// one config given), prints a line per model and writes `<kind>.json` and `<kind>.md` under
/// `out`. Returns the report.
pub fn speed(kind: SpeedKind, out: &Path, opts: &SpeedOptions) -> Result<PathBuf> {
    if opts.repeats == 0 {
        return Err(PerfError::NoRepeats);
    }
    let name = match kind {
        SpeedKind::Generate => "generate",
        SpeedKind::TrainStep => "train-step",
        SpeedKind::Attention => "attention",
    };
    let mut rows = Vec::new();
    for m in opts.subjects()? {
        let measured = match kind {
            SpeedKind::Generate if opts.sample.long_tail => bench_long_tail(&m, opts)?,
            SpeedKind::Generate => vec![bench_generate(&m, opts)?],
            SpeedKind::Attention => vec![bench_attention(&m, opts)?],
            SpeedKind::TrainStep => vec![bench_train_step(&m, opts)?],
        };
        for r in measured {
            let peak = r
                .memory
                .as_ref()
                .and_then(|mm| mm.peak)
                .map_or_else(String::new, |p| format!(", peak {} GiB", memory::gib(p)));
            println!(
                "{:<12} {:>11} params  {:<10} {:<9} {:>8.1} tokens/s  ({:.3} s for {} tokens{peak})",
                r.model, r.parameters, r.what, r.target, r.tokens_per_second, r.seconds, r.tokens
            );
            rows.push(r);
        }
    }
    let json = serde_json::to_string_pretty(&rows).expect("invariant: measurements are JSON");
    write_report(out, &format!("{name}.json"), json.as_bytes())?;
    let md = markdown(&format!("acpo bench {name}"), &rows);
    write_report(out, &format!("{name}.md"), md.as_bytes())
}

/// The manifests (`*.yaml`) directly under `dir`, in name order.
fn manifests(dir: &Path) -> Result<Vec<crate::manifest::Experiment>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .at(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    entries
        .iter()
        .map(|path| {
            crate::manifest::Experiment::load(path).map_err(|e| PerfError::Shape(e.to_string()))
        })
        .collect()
}

/// docs/CUDA.md's memory table: the paper manifests under `experiments` and the model
/// configs under `configs`, written to `<out>/memory-plan.{json,md}`.
pub fn memory_plan(experiments: &Path, configs: &Path, out: &Path) -> Result<PathBuf> {
    let manifests = manifests(experiments)?;
    let rows = memory::plan(&manifests, configs)?;
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the plan is JSON");
    write_report(out, "memory-plan.json", json.as_bytes())?;
    write_report(
        out,
        "memory-plan.md",
        memory::plan_markdown(&rows).as_bytes(),
    )
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

/// Shapes shared with tools/twins/bench_torch.py.
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

/// Where a speed benchmark runs: the device, and the dtypes of weights and arithmetic (training
/// keeps fp32 masters, [`crate::model::Precision`]).
#[derive(Debug, Clone)]
pub struct Target {
    pub device: Device,
    pub dtype: crate::model::spec::DType,
}

impl Target {
    /// The CPU in f32 (the benchmarks of issue #4).
    pub fn cpu() -> Target {
        Target {
            device: Device::Cpu,
            dtype: crate::model::spec::DType::F32,
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
    pub model: String,
    pub parameters: usize,
    pub what: &'static str,
    /// Device and dtype, e.g. `cpu/f32`, `cuda/bf16`.
    pub target: String,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub repeats: usize,
    /// Train step: sequences × tokens, micro-batch, and the memory settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    /// Train step: model FLOPs per second over the device's peak, where the peak is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<StepMemory>,
    /// Generate: the decode steps' memory traffic against the device's copy bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline: Option<Roofline>,
    /// Train step with `--trace`: the device's memory at the end of each phase of one step
    /// traced after the timed ones (which run untraced), and its peak during the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Vec<crate::device::Mark>>,
    /// Train step: what ran, as data (`shape` says it in words), for the memory prediction
    /// ([`predict`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<StepSettings>,
}

/// A train step's shape and memory settings as they ran.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StepSettings {
    pub batch: usize,
    pub seq_len: usize,
    pub prompt_len: usize,
    pub micro_batch: usize,
    /// Flash attention ran (asked for, and it applies to the device and dtype).
    pub flash_attention: bool,
    pub vocab_chunk: Option<usize>,
    pub checkpointing: bool,
    /// The compute dtype (the masters are f32).
    pub compute: String,
    pub layers: usize,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub tied: bool,
    /// Each layer's backward by hand (`--layer-by-hand`, `Kernels::layer_by_hand`); absent in
    /// the reports made before it was recorded, and written only when set, so a report of the
    /// autograd step reads as it did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layer_by_hand: bool,
}

impl StepSettings {
    /// The settings of a step of `shape` on model `cfg` with `kernels`; `flash_applies`: the
    /// flash kernels exist for the device, dtype and head dim (`fused::flash_applies`).
    pub fn of(
        cfg: &QwenConfig,
        shape: &StepShape,
        kernels: Kernels,
        flash_applies: bool,
        compute: DType,
    ) -> StepSettings {
        StepSettings {
            batch: shape.batch,
            seq_len: shape.seq_len,
            prompt_len: shape.prompt_len,
            micro_batch: shape.micro_batch,
            flash_attention: kernels.flash_attention && flash_applies,
            vocab_chunk: kernels.vocab_chunk,
            checkpointing: shape.checkpointing,
            compute: format!("{compute:?}").to_lowercase(),
            layer_by_hand: kernels.layer_by_hand,
            layers: cfg.num_hidden_layers,
            vocab: cfg.vocab_size,
            hidden: cfg.hidden_size,
            intermediate: cfg.intermediate_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
            tied: cfg.tie_word_embeddings,
        }
    }
}

/// How close decoding runs to the memory roofline: each decode step must read every weight
/// once and each sequence's keys and values so far.
#[derive(Debug, Clone, Serialize)]
pub struct Roofline {
    /// Weights + the mean KV cache read per decode step.
    pub bytes_per_step: f64,
    /// Seconds per decode step: the run's time less its prefill's, over the decode steps (the
    /// new tokens but the first, which the prefill's logits give).
    pub step_seconds: f64,
    /// The prefill alone: the same prompts sampled for one new token (median of the repeats).
    pub prefill_seconds: f64,
    /// New tokens per second of the decode steps alone: batch × (N − 1) over the run's time
    /// less its prefill's.
    pub decode_tokens_per_second: f64,
    pub achieved_gb_per_s: f64,
    /// A device-to-device copy's bandwidth (bytes read + written per second), measured.
    pub copy_gb_per_s: f64,
    /// achieved / copy.
    pub fraction: f64,
    /// The share of the decode time the host spent issuing and keeping the books rather than
    /// waiting for the device's draws ([`crate::rollout::GenStats::host_share`]): near 1 on a
    /// GPU, the host's launches bound a step, not the bytes.
    pub host_share: Option<f64>,
    /// Bytes an element of the KV cache the run read, as `bytes_per_step` counts them: 1 for
    /// an FP8 cache holding bytes, else the compute dtype's (a plan carries the fraction at
    /// the same element size).
    pub kv_elem_bytes: usize,
}

/// Bytes read + written per second by a copy of a 1 GiB buffer on the device (median of 5),
/// the bandwidth a memory-bound kernel can hope for.
pub fn copy_bandwidth(target: &Target) -> Result<f64> {
    let n = (1usize << 30) / 4;
    let src = Tensor::zeros(n, DType::F32, &target.device)?;
    let time = || -> Result<f64> {
        let t = Instant::now();
        let dst = src.copy()?;
        target.sync()?;
        drop(dst);
        Ok(t.elapsed().as_secs_f64())
    };
    time()?;
    let secs = median_of(5, time)?;
    Ok(2.0 * (n * 4) as f64 / secs)
}

/// The memory of a train step: the measured peak and its parts.
#[derive(Debug, Clone, Serialize)]
pub struct StepMemory {
    /// What `peak` reads ([`crate::device::PeakMeter::source`]).
    pub source: &'static str,
    /// The most bytes in use at once during the timed steps.
    pub peak: Option<u64>,
    /// In use before the step: weights, masters, optimizer state (and, on the CPU, the process).
    pub before_step: Option<u64>,
    /// The parts by arithmetic: the compute copy of the weights, fp32 masters, fp32 gradients,
    /// AdamW's two fp32 moments.
    pub weights: u64,
    pub masters: u64,
    pub grads: u64,
    pub optimizer: u64,
    /// Peak − before − gradients: activations and temporaries.
    pub activations: Option<u64>,
    /// What the step holds at its peak by arithmetic ([`memory::step_tensors`]), in bytes.
    pub named: Vec<(&'static str, u64)>,
}

/// Model FLOPs of one training step (forward + backward, no recomputation counted): 6 per
/// parameter of the matmuls per token (the input embedding is a lookup; the lm_head is a
/// matmul), and causal attention's 6·2·L·(nh·hd)·t/2 per token (QKᵀ and PV, half the square).
pub fn train_flops(cfg: &QwenConfig, b: usize, t: usize) -> f64 {
    let lookup = (cfg.vocab_size * cfg.hidden_size) as f64;
    let matmul = memory::parameters(cfg, false) as f64 - lookup
        + if cfg.tie_word_embeddings { lookup } else { 0.0 };
    let attn = 6.0
        * 2.0
        * cfg.num_hidden_layers as f64
        * (cfg.num_attention_heads * cfg.head_dim()) as f64
        * t as f64
        / 2.0;
    (b * t) as f64 * (6.0 * matmul + attn)
}

/// The dense peak FLOP/s of the device in the target's arithmetic, where it is known: an
/// H100/H200 SXM does 989.4 TFLOP/s in bf16 on its tensor cores and 66.9 TFLOP/s in fp32 on its
/// CUDA cores (NVIDIA's datasheet). None on the CPU.
fn peak_flops(target: &Target) -> Option<f64> {
    if !target.device.is_cuda() {
        return None;
    }
    Some(match target.dtype {
        crate::model::spec::DType::Bf16 => 989.4e12,
        _ => 66.9e12,
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The files called `name` under `dir`, at any depth (a GPU run's raw results:
/// `results/gpu/<device>-<date>/<call>/…`), in no order.
fn files_named(dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let path = entry.at(&dir)?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == name) {
                found.push(path);
            }
        }
    }
    Ok(found)
}

/// A results path's sort key in the order its calls ran: the runs of digits in it compared as
/// numbers, so that call `10-…` comes after `2-…` (tools/gpu/report.py's `call_order`). Text
/// and numbers alternate from the start, so a text is only ever compared with a text.
fn call_order(path: &Path) -> Vec<(usize, String)> {
    let text = path.to_string_lossy();
    let mut key = Vec::new();
    let mut rest = text.as_ref();
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let (number, after) = rest.split_at(digits);
        let words = after.len()
            - after
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .len();
        let (word, after) = after.split_at(words);
        // a number as (its digits without leading zeros, counted; then those digits): no
        // overflow, and 9 < 10
        let number = number.trim_start_matches('0');
        key.push((number.len(), number.to_owned()));
        key.push((0, word.to_owned()));
        rest = after;
    }
    key
}

/// The median of `repeats` (at least one) runs of `run`, each its seconds.
fn median_of(repeats: usize, mut run: impl FnMut() -> Result<f64>) -> Result<f64> {
    let runs = (0..repeats.max(1))
        .map(|_| run())
        .collect::<Result<Vec<_>>>()?;
    Ok(median(runs))
}

/// Markdown table of measurements.
pub fn markdown(title: &str, rows: &[Measurement]) -> String {
    let mut s = format!(
        "# {title}\n\nMachine: {} CPU threads available. Built-in shapes: batch {BATCH}, prompt {PROMPT_LEN}, new tokens {NEW_TOKENS}, train sequence {TRAIN_SEQ_LEN}.\n\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut t = Table::new([
        ("model", Left),
        ("parameters", Right),
        ("what", Left),
        ("target", Left),
        ("shape", Left),
        ("tokens", Right),
        ("seconds (median)", Right),
        ("tokens/s", Right),
        ("MFU", Right),
        ("peak memory (GiB)", Right),
        ("activations (GiB)", Right),
        ("of the memory roofline", Right),
    ]);
    for r in rows {
        let mem = r.memory.as_ref();
        let gib = |b: Option<u64>| b.map_or_else(|| "—".into(), memory::gib);
        t.row([
            r.model.clone(),
            r.parameters.to_string(),
            r.what.to_string(),
            r.target.to_string(),
            r.shape.as_deref().unwrap_or("built-in").to_string(),
            r.tokens.to_string(),
            format!("{:.4}", r.seconds),
            format!("{:.1}", r.tokens_per_second),
            r.mfu
                .map_or_else(|| "—".into(), |m| format!("{:.1} %", 100.0 * m)),
            gib(mem.and_then(|m| m.peak)),
            gib(mem.and_then(|m| m.activations)),
            r.roofline.as_ref().map_or_else(
                || "—".into(),
                |f| format!(
                    "{:.0} % ({:.1} of {:.1} GB/s; decode {:.1} tokens/s, {:.1} ms a step; prefill {:.3} s)",
                    100.0 * f.fraction,
                    f.achieved_gb_per_s,
                    f.copy_gb_per_s,
                    f.decode_tokens_per_second,
                    1e3 * f.step_seconds,
                    f.prefill_seconds
                )
            ),
        ]);
    }
    s.push_str(&t.to_string());
    if let Some(m) = rows.iter().find_map(|r| r.memory.as_ref()) {
        s.push_str(&format!(
            "\nPeak memory: the {} over the timed steps.\n",
            m.source
        ));
    }
    for r in rows {
        if let (Some(trace), Some(mem)) = (&r.trace, &r.memory) {
            s.push_str(&trace_markdown(&r.model, trace, mem));
        }
    }
    s
}

/// The parts of the traced phases ([`crate::device::part`]), the decoder layers' summed; empty
/// where no phase has parts.
fn parts_markdown(trace: &[crate::device::Mark]) -> String {
    let mut groups: Vec<(String, Vec<(String, f64)>)> = Vec::new();
    for m in trace.iter().filter(|m| !m.parts.is_empty()) {
        let group = if m.phase.starts_with("layer ") {
            "the decoder layers (summed)".to_string()
        } else {
            m.phase.clone()
        };
        let at = match groups.iter().position(|(g, _)| *g == group) {
            Some(i) => i,
            None => {
                groups.push((group, Vec::new()));
                groups.len() - 1
            }
        };
        let parts = &mut groups[at].1;
        let mut add = |name: &str, secs: f64| match parts.iter_mut().find(|(n, _)| n == name) {
            Some(p) => p.1 += secs,
            None => parts.push((name.to_string(), secs)),
        };
        for p in &m.parts {
            add(&p.name, p.seconds);
        }
        let rest = m.seconds.unwrap_or(0.0) - m.parts.iter().map(|p| p.seconds).sum::<f64>();
        add("after the last part", rest);
    }
    if groups.is_empty() {
        return String::new();
    }
    let mut t = Table::new([("phase", Left), ("part", Left), ("seconds", Right)]);
    for (group, parts) in groups {
        for (name, secs) in parts {
            t.row([group.clone(), name, format!("{secs:.4}")]);
        }
    }
    format!(
        "\nThe phases by part (each part's time once the device has finished it; a layer's time after its last part is its gradients joining the sums):\n\n{t}"
    )
}

/// A train step's memory trace: each phase's bytes in use at its end and its peak, then the
/// named tensors the step holds by arithmetic and how much of the measured peak they explain.
fn trace_markdown(model: &str, trace: &[crate::device::Mark], mem: &StepMemory) -> String {
    let gib = |b: Option<u64>| b.map_or_else(|| "—".into(), memory::gib);
    let mut s = format!(
        "\n## Memory and time by phase: {model}\n\nRead at the end of each phase of the timed steps ({}); the peak is the most in use during the phase, the seconds its wall time once the device has finished its work.\n\n",
        mem.source
    );
    let mut phases = Table::new([
        ("phase", Left),
        ("in use at its end (GiB)", Right),
        ("peak during it (GiB)", Right),
        ("seconds", Right),
    ]);
    for m in trace {
        phases.row([
            m.phase.clone(),
            gib(m.live),
            gib(m.peak),
            m.seconds.map_or_else(|| "—".into(), |s| format!("{s:.4}")),
        ]);
    }
    s.push_str(&phases.to_string());
    s.push_str(&parts_markdown(trace));
    let named: u64 = mem.named.iter().map(|(_, b)| b).sum();
    let mut tensors = Table::new([("named tensor (arithmetic)", Left), ("GiB", Right)]);
    for (name, bytes) in &mem.named {
        tensors.row([name.to_string(), memory::gib(*bytes)]);
    }
    tensors.row([
        "**all of them**".to_string(),
        format!("**{}**", memory::gib(named)),
    ]);
    s.push('\n');
    s.push_str(&tensors.to_string());
    if let Some(peak) = mem.peak {
        s.push_str(&format!(
            "\nThe measured peak, {} GiB, is {:.0} % of the named tensors' {} GiB; {} GiB are not named.\n",
            memory::gib(peak),
            100.0 * peak as f64 / named.max(1) as f64,
            memory::gib(named),
            memory::gib(peak.saturating_sub(named)),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls sort as numbers (call 10 after call 2; 02 is 2, then the words decide; a run of
    /// digits too long for any integer type no trouble), text as text.
    #[test]
    fn call_order_sorts_the_calls_numbers_as_numbers() {
        let mut paths: Vec<PathBuf> = [
            "r/H200-20261126/10-decode/x.json",
            "r/H200-20261126/2-suite/x.json",
            "r/H200-20261126/1-suite/x.json",
            "r/H200-20261126/02-plan/x.json",
            "r/H200-20261126/99999999999999999999999-z/x.json",
            "r/H200-20261126/1-suite/y.json",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        paths.sort_by_cached_key(|p| call_order(p));
        let calls: Vec<String> = paths
            .iter()
            .map(|p| {
                let call = p.components().nth(2).expect("a call").as_os_str();
                let file = p.file_name().expect("a file").to_string_lossy();
                format!("{}/{file}", call.to_string_lossy())
            })
            .collect();
        assert_eq!(
            calls,
            [
                "1-suite/x.json",
                "1-suite/y.json",
                "02-plan/x.json",
                "2-suite/x.json",
                "10-decode/x.json",
                "99999999999999999999999-z/x.json"
            ]
        );
    }
}
