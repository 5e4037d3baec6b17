//! Policy and critic models: Qwen2 / Qwen3 decoders that can be *trained*, loaded from and saved
//! to the Hugging Face layout.
//!
//! - [`QwenConfig`]: `config.json` as HF writes it (Qwen2 and Qwen3; `rope_theta` at the top
//!   level or under transformers v5's `rope_parameters`).
//! - [`Params`]: the named trainable tensors (`candle_core::Var`), loaded from single or sharded
//!   safetensors and saved back under the same names, so a trained policy loads in HF tools.
//! - [`qwen::Qwen`]: the decoder; [`qwen::Critic`]: the same backbone with a scalar value head.
//! - [`tokenizer`]: `tokenizer.json` + the Jinja chat template of `tokenizer_config.json`.
//! - [`init`]: a seeded random model in HF layout (tests and the mini scale).
//! - [`load`]: the one loader (files, device, dtype, tokenizer) every command uses.

pub mod budget;
pub mod init;
pub mod load;
pub mod paged;
pub mod qwen;
pub mod score;
pub mod spec;
pub mod tokenizer;

use crate::files::{AtPath, PathIoError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use serde::Deserialize;

/// Why a model could not be loaded, built or saved. Variants name the file or tensor.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}: invalid model config: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Weights { path: PathBuf, reason: String },
    #[error("{}: cannot save: {source}", path.display())]
    Save {
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },
    #[error("tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
    #[error("device {asked}: {reason}")]
    Device { asked: &'static str, reason: String },
    #[error("{what} needs about {need} GiB of memory; {have} GiB are available {place}")]
    TooLarge {
        what: String,
        need: String,
        have: String,
        place: &'static str,
    },
    #[error(transparent)]
    Paged(#[from] paged::PagedError),
    #[error("sampling: {0}")]
    Sampling(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// The architecture family decides the attention details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Biases on q/k/v, no q/k norm, head_dim = hidden / heads.
    Qwen2,
    /// q/k RMSNorm over head_dim, `head_dim` from the config, biases per `attention_bias`.
    Qwen3,
}

/// Bounds on a config's sizes ([`QwenConfig::from_json`] refuses beyond them): far above any
/// Qwen's (vocabulary 151,936, width 8,192 and 29,568, 80 layers, 64 heads of 128, 131,072
/// positions, 72 B parameters), far below what overflows or cannot be allocated.
pub const MAX_VOCAB: usize = 1 << 21;
pub const MAX_WIDTH: usize = 1 << 18;
pub const MAX_LAYERS: usize = 1 << 10;
pub const MAX_HEADS: usize = 1 << 10;
pub const MAX_HEAD_DIM: usize = 1 << 12;
pub const MAX_POSITIONS: usize = 1 << 22;
pub const MAX_PARAMETERS: u64 = 1 << 40;

/// `config.json` of a Qwen2 / Qwen3 causal LM.
#[derive(Debug, Clone, Deserialize)]
pub struct QwenConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// The file as read, written back verbatim when the model is saved.
    #[serde(skip)]
    pub raw: serde_json::Value,
}

impl QwenConfig {
    pub fn load(path: &Path) -> Result<QwenConfig> {
        let text = crate::files::read_to_string(path).at(path)?;
        Self::from_json(&text, path)
    }

    pub fn from_json(text: &str, path: &Path) -> Result<QwenConfig> {
        let bad = |reason: String| ModelError::Config {
            path: path.to_owned(),
            reason,
        };
        let raw: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut cfg: QwenConfig =
            serde_json::from_value(raw.clone()).map_err(|e| bad(e.to_string()))?;
        cfg.raw = raw;
        cfg.family().map_err(bad)?;
        cfg.check_sizes().map_err(bad)?;
        if cfg.num_attention_heads == 0
            || cfg.num_key_value_heads == 0
            || !cfg
                .num_attention_heads
                .is_multiple_of(cfg.num_key_value_heads)
        {
            return Err(bad(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                cfg.num_attention_heads, cfg.num_key_value_heads
            )));
        }
        if !cfg.head_dim().is_multiple_of(2) {
            return Err(bad(format!(
                "head_dim must be even for RoPE, got {}",
                cfg.head_dim()
            )));
        }
        if let Some(act) = &cfg.hidden_act {
            if act != "silu" {
                return Err(bad(format!(
                    "hidden_act `{act}` is not supported (only silu)"
                )));
            }
        }
        let scaled = |v: &Option<serde_json::Value>| {
            v.as_ref().is_some_and(|v| {
                !v.is_null()
                    && v.get("rope_type")
                        .and_then(|t| t.as_str())
                        .unwrap_or("default")
                        != "default"
            })
        };
        if scaled(&cfg.rope_scaling) || scaled(&cfg.rope_parameters) {
            return Err(bad(
                "RoPE scaling (yarn/dynamic/...) is not supported".into()
            ));
        }
        Ok(cfg)
    }

    /// Refuses sizes no Qwen has and any model could not hold in memory (issue #35), before
    /// anything is allocated: every dimension positive and under its bound, the norm's ε and
    /// RoPE's θ positive and finite, and the parameter count (computed without overflow) under
    /// [`MAX_PARAMETERS`]. The message names the field.
    fn check_sizes(&self) -> std::result::Result<(), String> {
        let dims = [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("head_dim", self.head_dim(), MAX_HEAD_DIM),
        ];
        for (field, value, max) in dims {
            if value == 0 || value > max {
                return Err(format!("{field} must be in 1..={max}, got {value}"));
            }
        }
        if let Some(p) = self.max_position_embeddings {
            if p == 0 || p > MAX_POSITIONS {
                return Err(format!(
                    "max_position_embeddings must be in 1..={MAX_POSITIONS}, got {p}"
                ));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "rms_norm_eps must be positive and finite, got {}",
                self.rms_norm_eps
            ));
        }
        let theta = self.rope_theta();
        if !(theta.is_finite() && theta > 0.0) {
            return Err(format!(
                "rope_theta must be positive and finite, got {theta}"
            ));
        }
        let n = self.parameter_count();
        if n > MAX_PARAMETERS as u128 {
            return Err(format!(
                "these sizes make {n} parameters, more than the {MAX_PARAMETERS} any model here may have"
            ));
        }
        Ok(())
    }

    /// Parameters of the model (the shapes `init::layout` writes), in u128 so that no sizes can
    /// overflow it.
    pub fn parameter_count(&self) -> u128 {
        let (v, h, i) = (
            self.vocab_size as u128,
            self.hidden_size as u128,
            self.intermediate_size as u128,
        );
        let (nh, nkv, hd) = (
            self.num_attention_heads as u128,
            self.num_key_value_heads as u128,
            self.head_dim() as u128,
        );
        let qwen3 = self.model_type == "qwen3";
        let bias = if self.qkv_bias() {
            (nh + 2 * nkv) * hd
        } else {
            0
        };
        let layer = 2 * h
            + (nh + 2 * nkv) * hd * h
            + h * nh * hd
            + bias
            + if qwen3 { 2 * hd } else { 0 }
            + 3 * h * i;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers as u128 * layer + h + head
    }

    pub fn family(&self) -> std::result::Result<Family, String> {
        match self.model_type.as_str() {
            "qwen2" => Ok(Family::Qwen2),
            "qwen3" => Ok(Family::Qwen3),
            other => Err(format!(
                "model_type `{other}` is not supported (qwen2, qwen3)"
            )),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Bytes of K and V one sequence position holds in the cache, over every layer, at
    /// `elem_size` bytes per value.
    pub fn kv_bytes_per_position(&self, elem_size: usize) -> usize {
        2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim() * elem_size
    }

    pub fn rope_theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| {
                self.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(|t| t.as_f64())
            })
            .unwrap_or(10_000.0)
    }

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.family() {
            Ok(Family::Qwen2) => true,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// End-of-sequence ids declared by the config (an int or a list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Where a model's weights are kept and where its arithmetic runs (issue #18).
///
/// Training keeps fp32 master weights, so gradients and AdamW moments are fp32 too, whatever
/// the compute dtype: a bf16 master would round updates of size lr·1e-3 to nothing. This is
/// what the manifest's `dtype: bf16` means, as verl's FSDP mixed precision does (fp32 params,
/// bf16 forward and backward). Sampling and evaluation keep the weights in the compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precision {
    pub master: DType,
    pub compute: DType,
}

impl Precision {
    /// fp32 masters, the manifest's dtype for the arithmetic.
    pub fn training(dtype: crate::model::spec::DType) -> Precision {
        Precision {
            master: DType::F32,
            compute: self::dtype(dtype),
        }
    }

    /// Weights and arithmetic in the manifest's dtype.
    pub fn inference(dtype: crate::model::spec::DType) -> Precision {
        Precision {
            master: self::dtype(dtype),
            compute: self::dtype(dtype),
        }
    }
}

/// Named trainable tensors (the masters), keyed by their safetensors names, with the dtype the
/// model computes in: [`Params::weight`] hands the model each one cast to it.
#[derive(Debug, Clone)]
pub struct Params {
    vars: BTreeMap<String, Var>,
    compute: DType,
}

impl Params {
    /// Parameters computing in their own dtype (that of the first; f32 when empty).
    pub fn new(vars: BTreeMap<String, Var>) -> Params {
        let compute = vars.values().next().map_or(DType::F32, |v| v.dtype());
        Params { vars, compute }
    }

    /// The same parameters computing in `compute`.
    pub fn with_compute(mut self, compute: DType) -> Params {
        self.compute = compute;
        self
    }

    /// The dtype the model computes in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// The weight `name` as the model uses it: in the compute dtype (a cast of the master,
    /// through which gradients reach the master in its own dtype), detached when asked (for
    /// sampling: no autograd graph).
    pub fn weight(&self, name: &str, shape: &[usize], detach: bool) -> Result<Tensor> {
        let t = self.get(name, shape)?;
        let t = if detach { t.detach() } else { t };
        Ok(if t.dtype() == self.compute {
            t
        } else {
            t.to_dtype(self.compute)?
        })
    }

    /// Loads every `*.safetensors` of a model directory (single file or sharded with
    /// `model.safetensors.index.json`), converted to `dtype`.
    pub fn load_dir(dir: &Path, dtype: DType, device: &Device) -> Result<Params> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = crate::files::read_to_string(&index).at(&index)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Weights {
                    path: index.clone(),
                    reason: e.to_string(),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Weights {
                    path: index.clone(),
                    reason: "no `weight_map` object".into(),
                })?;
            let mut shards: Vec<PathBuf> = map
                .values()
                .filter_map(|f| f.as_str())
                .map(|f| dir.join(f))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut bytes: u128 = 0;
        for file in &files {
            let len = std::fs::metadata(file).map_err(|_| ModelError::Weights {
                path: file.clone(),
                reason: "weights file not found".into(),
            })?;
            bytes += len.len() as u128;
        }
        // stored in bf16 at the least: loaded in f32 they take at most twice their files
        budget::check(
            device,
            bytes * (dtype.size_in_bytes() as u128).max(2) / 2,
            || format!("the weights of {}", dir.display()),
        )?;
        let mut vars = BTreeMap::new();
        for file in &files {
            if !file.exists() {
                return Err(ModelError::Weights {
                    path: file.clone(),
                    reason: "weights file not found".into(),
                });
            }
            let tensors = crate::files::regular(file)
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    candle_core::safetensors::load(file, device).map_err(|e| e.to_string())
                })
                .map_err(|reason| ModelError::Weights {
                    path: file.clone(),
                    reason,
                })?;
            for (name, t) in tensors {
                let t = if t.dtype() == dtype {
                    t
                } else {
                    t.to_dtype(dtype)?
                };
                vars.insert(name, Var::from_tensor(&t)?);
            }
        }
        Ok(Params {
            vars,
            compute: dtype,
        })
    }

    /// The tensor called `name`, checked against the expected shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let var = self.vars.get(name).ok_or_else(|| ModelError::Tensor {
            name: name.into(),
            reason: "missing from the checkpoint".into(),
        })?;
        if var.dims() != shape {
            return Err(ModelError::Tensor {
                name: name.into(),
                reason: format!("has shape {:?}, the config implies {:?}", var.dims(), shape),
            });
        }
        Ok(var.as_tensor().clone())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    pub fn insert(&mut self, name: String, var: Var) {
        self.vars.insert(name, var);
    }

    pub fn vars(&self) -> impl Iterator<Item = (&String, &Var)> {
        self.vars.iter()
    }

    pub fn len(&self) -> usize {
        self.vars.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Number of scalar parameters.
    pub fn count(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// Writes `model.safetensors` (atomically: temp file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        crate::atomic::save_safetensors(&tensors, path).map_err(|source| ModelError::Save {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }
}

/// The device a manifest asks for. `cuda` needs a binary built with the `cuda` feature and a
/// visible GPU; `auto` takes CUDA when both allow it, else the CPU.
pub fn device(asked: crate::model::spec::Device) -> Result<Device> {
    use crate::model::spec::Device as D;
    match asked {
        D::Cpu => Ok(Device::Cpu),
        D::Cuda if cfg!(feature = "cuda") => {
            Device::new_cuda(0).map_err(|e| ModelError::Device {
                asked: "cuda",
                reason: first_line(&e),
            })
        }
        D::Cuda => Err(ModelError::Device {
            asked: "cuda",
            reason: "this binary was built without CUDA (cargo build --release --features cuda); use device: cpu or auto".into(),
        }),
        D::Auto => {
            let (device, why) = if cfg!(feature = "cuda") {
                match Device::new_cuda(0) {
                    Ok(d) => (d, "CUDA GPU 0".to_string()),
                    Err(e) => (
                        Device::Cpu,
                        format!("the CPU: no CUDA GPU is usable ({})", first_line(&e)),
                    ),
                }
            } else {
                (
                    Device::Cpu,
                    "the CPU: this binary was built without CUDA".to_string(),
                )
            };
            // said once per process: a run resolves its device in several places
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("device auto: {why}"));
            Ok(device)
        }
    }
}

/// An error's first line: candle's CUDA errors carry a backtrace after it.
fn first_line(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// The compute dtype of a manifest's `model.dtype`.
pub fn dtype(dtype: crate::model::spec::DType) -> DType {
    match dtype {
        crate::model::spec::DType::F32 => DType::F32,
        crate::model::spec::DType::Bf16 => DType::BF16,
        crate::model::spec::DType::F16 => DType::F16,
    }
}
