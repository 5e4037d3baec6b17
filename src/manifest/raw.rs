//! The YAML as written: every section of a manifest as serde reads it, `deny_unknown_fields`
//! everywhere (a typo is an error, never a setting silently ignored). Only the validator
//! (`manifest::validate`) reads these.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Scale;
use crate::algo::clip::{ClipFields, PolicyLossMode};
use crate::algo::method::{AlgorithmKind, LossAggMode};
use crate::data::{Benchmark, DataSuite, PromptTemplate};
use crate::model::init::InitTokenizer;
use crate::model::spec::{DType, Device};
use crate::optim::LrSchedule;
use crate::reward::RewardKind;
use crate::rollout::KvLayout;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub scale: Scale,
    pub seed: u64,
    pub device: Device,
    /// How the run's samplers (rollouts, the probe, evaluations) hold their KV cache; absent:
    /// `dense`.
    #[serde(default)]
    pub kv_layout: Option<KvLayout>,
    pub model: Model,
    pub algorithm: Algorithm,
    pub data: Data,
    pub rollout: Rollout,
    pub actor: Actor,
    #[serde(default)]
    pub critic: Option<Critic>,
    pub trainer: Trainer,
    pub eval: Eval,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// HF hub repository id, e.g. `Qwen/Qwen3-8B`. Exactly one of `repo` and `dir`.
    #[serde(default)]
    pub repo: Option<String>,
    /// Hub revision (branch, tag or commit); required with `repo`.
    #[serde(default)]
    pub revision: Option<String>,
    /// A local directory in HF layout (config.json, *.safetensors, tokenizer.json).
    #[serde(default)]
    pub dir: Option<PathBuf>,
    pub dtype: DType,
    #[serde(default)]
    pub gradient_checkpointing: bool,
    /// With `dir`: create the directory as a seeded random model when it does not exist.
    #[serde(default)]
    pub init: Option<ModelInit>,
    /// Positions the run may use beyond config.json's `max_position_embeddings`, as verl's
    /// `override_config` sets them (RoPE extends to any position).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// `autograd` (absent) or `by-hand`: each decoder layer's backward in the train step
    /// (by hand needs `gradient_checkpointing: true`).
    #[serde(default)]
    pub layer_backward: Option<crate::model::spec::LayerBackward>,
    /// `pair` (absent) or `five-products`: the CUDA flash kernels' backward in the train step
    /// (the CPU and the row kernels have one backward, which both take).
    #[serde(default)]
    pub attention_backward: Option<crate::fused::FlashBackward>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInit {
    /// An HF config.json for the architecture.
    pub config: PathBuf,
    pub seed: u64,
    /// Also write a tokenizer: `char` (fixed, 98 symbols) or `bpe` (trained on the
    /// synthetic task's corpus, up to the config's vocab_size).
    #[serde(default)]
    pub tokenizer: Option<InitTokenizer>,
    /// A supervised fine-tune on the synthetic task's worked solutions before RL.
    #[serde(default)]
    pub warm_start: Option<WarmStart>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WarmStart {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    #[serde(default)]
    pub warmup_steps: usize,
    /// Longest solution (tokens) learned; longer ones are skipped.
    pub max_response_length: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Algorithm {
    pub name: AlgorithmKind,
    // Ratio clipping: baselines (ppo, grpo) only.
    #[serde(default)]
    pub clip_ratio_low: Option<f64>,
    #[serde(default)]
    pub clip_ratio_high: Option<f64>,
    #[serde(default)]
    pub clip_ratio_c: Option<f64>,
    // The baselines' policy loss (verl's `actor.policy_loss.loss_mode`): vanilla (default),
    // cispo, gspo, or unclipped (the clipping family of the paper's related work).
    #[serde(default)]
    pub policy_loss: Option<PolicyLossMode>,
    // Advantage clipping: -AC variants only.
    #[serde(default)]
    pub alpha: Option<f64>,
    // GAE: PPO types only.
    #[serde(default)]
    pub gamma: Option<f64>,
    #[serde(default)]
    pub lam: Option<f64>,
    #[serde(default)]
    pub whiten_advantages: Option<bool>,
    // Group normalisation: GRPO types only.
    #[serde(default)]
    pub norm_adv_by_std_in_grpo: Option<bool>,
    pub loss_agg_mode: LossAggMode,
}

impl Algorithm {
    /// The fields a clipping rule reads, as written (the rule checks them).
    pub fn clip_fields(&self) -> ClipFields {
        ClipFields {
            policy_loss: self.policy_loss,
            clip_ratio_low: self.clip_ratio_low,
            clip_ratio_high: self.clip_ratio_high,
            clip_ratio_c: self.clip_ratio_c,
            alpha: self.alpha,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    pub suite: DataSuite,
    pub prompt_template: PromptTemplate,
    pub apply_chat_template: bool,
    pub max_prompt_length: usize,
    pub max_response_length: usize,
    pub shuffle: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    pub n: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// `null` or absent: no top-k filtering (verl's `top_k: -1`).
    #[serde(default)]
    pub top_k: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Optim {
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    #[serde(default)]
    pub warmup_steps: usize,
    pub grad_clip: f64,
    pub weight_decay: f64,
    pub betas: [f64; 2],
    pub eps: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Actor {
    pub optim: Optim,
    /// Prompts per optimizer step (verl `ppo_mini_batch_size`); × n responses.
    pub mini_batch_size: usize,
    /// Responses per forward/backward pass, for memory only; default: the whole mini-batch.
    #[serde(default)]
    pub micro_batch_size: Option<usize>,
    pub epochs: usize,
    pub entropy_coeff: f64,
    pub kl_loss_coef: f64,
    pub use_kl_in_reward: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Critic {
    pub optim: Optim,
    pub cliprange_value: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Trainer {
    /// Prompts per training step (verl `data.train_batch_size`).
    pub batch_size: usize,
    pub total_steps: usize,
    pub eval_every: usize,
    pub checkpoint_every: usize,
    pub reward: RewardKind,
    /// Record r·Â histograms by prompt difficulty every this many steps (0 = never).
    pub tails_every: usize,
    /// PPO types (n = 1): extra samples per prompt that estimate its pass rate at tail steps.
    pub difficulty_probe_k: usize,
    /// Evaluate the starting policy before the first step (verl's name; default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_before_train: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Eval {
    pub benchmarks: Vec<Benchmark>,
    /// Samples per problem for Avg@k.
    pub k: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub max_new_tokens: usize,
    pub prompt_template: PromptTemplate,
    pub apply_chat_template: bool,
    /// Evaluate only the first `limit` problems of each benchmark (smoke tests).
    #[serde(default)]
    pub limit: Option<usize>,
}
