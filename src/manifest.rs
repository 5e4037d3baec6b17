//! Experiment manifests: one YAML file per training run.
//!
//! A manifest is the only source of a run's settings (DESIGN.md). It is read in two stages, as
//! ripgrep and uv do with their flags: [`raw::Manifest`] mirrors the YAML exactly
//! (`deny_unknown_fields` everywhere, so a typo is an error, never a silently ignored setting),
//! and [`Experiment::try_from`] validates it once into typed values that the rest of the crate
//! trusts. Every validation rule lives in this file, and every error names the file, the field
//! path and the reason.
//!
//! Field names follow verl (`clip_ratio_low`, `clip_ratio_c`, `loss_agg_mode`, `lam`,
//! `norm_adv_by_std_in_grpo`, `cliprange_value`, ...) so the manifests read like the verl
//! configs the paper ran. The values of the paper's runs come from its appendix table
//! "RL training hyperparameters" and Section 5 (see `experiments/paper/`).
//!
//! The [`Experiment::fingerprint`] is the SHA-256 of the canonical JSON of the *validated*
//! experiment. It is derived with `serde::Serialize`, so a new field is in the fingerprint
//! unless someone opts it out explicitly; a test mutates every leaf of the manifests and
//! checks that the fingerprint changes.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why a manifest could not be used. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read the manifest: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: field `{field}`: {message}")]
    Parse {
        path: PathBuf,
        line: u64,
        field: String,
        message: String,
    },
    #[error("{path}: not a valid manifest: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: {reason}")]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },
}

impl ManifestError {
    /// The field path at fault, when the error is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            ManifestError::Invalid { field, .. } | ManifestError::Parse { field, .. } => {
                Some(field)
            }
            _ => None,
        }
    }
}

/// The YAML as written. Only [`Experiment::try_from`] reads these.
pub mod raw {
    use super::*;

    #[derive(Debug, Clone, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub struct Manifest {
        pub name: String,
        #[serde(default)]
        pub description: Option<String>,
        pub scale: Scale,
        pub seed: u64,
        pub device: Device,
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
        // cispo, gspo, or unclipped (issue #23's clipping family).
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
}

// ---------------------------------------------------------------------------------------------
// Enumerations shared by the raw and validated forms.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    Smoke,
    Mini,
    Paper,
    /// A paper manifest at its own shapes on random weights, batch sizes divided (issue #34,
    /// `acpo pipeline`): what a paper run costs on a GPU and whether it fits, never accuracy.
    /// Its manifests are derived, never kept in `experiments/`.
    #[value(skip)]
    Pipeline,
}

impl Scale {
    /// The name of the scale's folders (`experiments/<name>`, `results/<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::Mini => "mini",
            Scale::Paper => "paper",
            Scale::Pipeline => "pipeline",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    /// CUDA when this binary was built with it and a GPU is visible, else CPU.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

/// The four methods of Table 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum AlgorithmKind {
    #[serde(rename = "ppo")]
    Ppo,
    #[serde(rename = "ppo-ac")]
    PpoAc,
    #[serde(rename = "grpo")]
    Grpo,
    #[serde(rename = "grpo-ac")]
    GrpoAc,
}

impl AlgorithmKind {
    pub const ALL: [AlgorithmKind; 4] = [Self::Ppo, Self::PpoAc, Self::Grpo, Self::GrpoAc];

    /// PPO types learn a critic and use GAE; GRPO types normalise rewards within a prompt group.
    pub fn is_ppo_type(self) -> bool {
        matches!(self, Self::Ppo | Self::PpoAc)
    }

    /// -AC variants clip r·Â to [−α, α] (paper eq. 5) instead of clipping r.
    pub fn is_advantage_clipped(self) -> bool {
        matches!(self, Self::PpoAc | Self::GrpoAc)
    }

    /// The method's name as the paper writes it.
    pub fn paper_name(self) -> &'static str {
        match self {
            Self::Ppo => "PPO",
            Self::PpoAc => "PPO-AC",
            Self::Grpo => "GRPO",
            Self::GrpoAc => "GRPO-AC",
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ppo => "ppo",
            Self::PpoAc => "ppo-ac",
            Self::Grpo => "grpo",
            Self::GrpoAc => "grpo-ac",
        })
    }
}

/// A baseline's policy loss (verl's `actor.policy_loss.loss_mode`, issue #23): the ratio clip
/// of PPO (`vanilla`), CISPO, GSPO, or no clip at all (an unclipped importance-sampling
/// control, not a verl mode). The -AC variants always clip r·Â.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLossMode {
    Vanilla,
    Cispo,
    Gspo,
    Unclipped,
}

/// How per-token losses are reduced to the mini-batch loss (verl's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAggMode {
    /// Mean over every valid token of the mini-batch, exact across micro-batches.
    TokenMean,
    /// verl's legacy path: the mean of per-micro-batch token means (for verl parity).
    TokenMeanMicrobatch,
    SeqMeanTokenSum,
    SeqMeanTokenMean,
    SeqMeanTokenSumNorm,
}

/// Where prompts and benchmarks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSuite {
    /// DAPO-Math-17k for training and the four real benchmarks (local JSONL dir or HF hub).
    Real,
    /// The seeded synthetic task (mini/smoke scales): a training set and four benchmark twins
    /// with the same roles and sizes as the real ones.
    Synthetic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTemplate {
    /// DAPO's training prompt: solve, then `Answer: ...` on the last line.
    Dapo,
    /// The evaluation prompt: reason step by step, final answer in `\boxed{}`.
    Boxed,
    /// DAPO's instruction in one short line (`Answer: ...` last), for tiny-context models of
    /// the mini scale: the full DAPO template would be most of their sequence.
    Answer,
    /// The problem text alone.
    Raw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    /// Constant after an optional linear warmup (the paper's setting).
    Constant,
}

/// The reward for a verified answer. The paper does not say which scale it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardKind {
    /// 1 correct, 0 otherwise (Math-Verify's score).
    Binary,
    /// +1 correct, −1 otherwise (verl's DAPO scorer).
    Signed,
}

/// The evaluation benchmarks of Table 1, with the problem counts that weight the
/// "weighted accuracy" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Benchmark {
    Math500,
    Minerva,
    Olympiadbench,
    AimeLike,
}

impl Benchmark {
    pub const ALL: [Benchmark; 4] = [
        Self::Math500,
        Self::Minerva,
        Self::Olympiadbench,
        Self::AimeLike,
    ];

    /// Problem count, the weight of the benchmark in the weighted accuracy.
    pub fn size(self) -> usize {
        match self {
            Self::Math500 => 500,
            Self::Minerva => 272,
            Self::Olympiadbench => 675,
            Self::AimeLike => 230,
        }
    }

    /// The name used in files and metric keys (`val-core/<name>/acc/mean@k`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Math500 => "math500",
            Self::Minerva => "minerva",
            Self::Olympiadbench => "olympiadbench",
            Self::AimeLike => "aime-like",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The validated experiment.

/// A validated manifest: every value in range, every cross-field rule checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Experiment {
    pub name: String,
    pub description: Option<String>,
    pub scale: Scale,
    pub seed: u64,
    pub device: Device,
    pub model: ModelSpec,
    pub algorithm: Algorithm,
    pub data: DataSpec,
    pub rollout: Sampling,
    pub actor: ActorSpec,
    /// Present exactly for PPO types.
    pub critic: Option<CriticSpec>,
    pub trainer: TrainerSpec,
    pub eval: EvalSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum ModelSource {
    Hub { repo: String, revision: String },
    Dir(PathBuf),
}

impl ModelSource {
    /// The model's name: the hub repo's (`Qwen/Qwen3-1.7B` → `Qwen3-1.7B`), or the model
    /// directory's.
    pub fn label(&self) -> String {
        match self {
            ModelSource::Hub { repo, .. } => repo.rsplit('/').next().unwrap_or(repo).to_string(),
            ModelSource::Dir(d) => d.file_name().map_or_else(
                || d.display().to_string(),
                |n| n.to_string_lossy().to_string(),
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub source: ModelSource,
    pub dtype: DType,
    pub gradient_checkpointing: bool,
    /// How to create a missing `dir` (smoke and mini scales).
    pub init: Option<ModelInitSpec>,
    /// Overrides config.json's `max_position_embeddings` (left out of the fingerprint when
    /// unset, so manifests without it keep theirs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
}

/// A seeded random model written by `acpo model init` when the model directory is missing,
/// optionally with a tokenizer and a supervised warm start (smoke and mini scales).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInitSpec {
    pub config: PathBuf,
    pub seed: u64,
    pub tokenizer: Option<InitTokenizer>,
    pub warm_start: Option<WarmStartSpec>,
}

/// The tokenizer written with a created model: one the project makes (`char`, `bpe`), or a real
/// model's files (`{dir: …}` or `{repo: …, revision: …}`: its `tokenizer.json` and
/// `tokenizer_config.json`, chat template included; issue #34's paper-shape runs on random
/// weights use the real Qwen tokenizer). Written back as read, so the manifests of `char` and
/// `bpe` keep their fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum InitTokenizer {
    Kind(TokenizerKind),
    Files(TokenizerFiles),
}

/// A tokenizer the project builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// One token per printable ASCII character (smoke: a random policy already writes digits).
    Char,
    /// Byte-level BPE trained on the synthetic task's corpus, digits split one per token.
    Bpe,
}

/// Where a real tokenizer's files are.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TokenizerFiles {
    /// A directory holding `tokenizer.json` and `tokenizer_config.json`.
    Dir { dir: PathBuf },
    /// Those files of a hub model (from the cache, downloaded unless offline).
    Hub { repo: String, revision: String },
}

/// Supervised fine-tune on worked solutions of the synthetic training set (issue #8): each
/// model starts RL with partial accuracy, the regime where RL has signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmStartSpec {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    pub max_response_length: usize,
}

/// What is clipped in the policy loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum PolicyClip {
    /// PPO/GRPO: clip r to [1−ε_low, 1+ε_high], with the dual clip c for Â < 0.
    Ratio {
        eps_low: f64,
        eps_high: f64,
        dual_clip_c: f64,
    },
    /// ACPO (paper eq. 5): clip r·Â to [−α, α].
    Advantage { alpha: f64 },
    /// CISPO (verl `cispo`): the importance weight clipped to [1−ε_low, 1+ε_high] and
    /// detached, times Â·log π; every token keeps a gradient.
    Cispo { eps_low: f64, eps_high: f64 },
    /// GSPO (verl `gspo`): the sequence's length-normalised ratio, clipped PPO-style.
    Gspo { eps_low: f64, eps_high: f64 },
    /// No clip: −r·Â, the unclipped importance-sampling control.
    Unclipped,
}

/// The rule and its bounds in one short phrase (`acpo check`, sweep reports): `alpha=2`,
/// `eps=0.2/0.28`, `cispo eps=10/0.2`, ...
impl fmt::Display for PolicyClip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PolicyClip::Ratio {
                eps_low, eps_high, ..
            } => write!(f, "eps={}/{}", short(eps_low), short(eps_high)),
            PolicyClip::Advantage { alpha } => write!(f, "alpha={}", short(alpha)),
            PolicyClip::Cispo { eps_low, eps_high } => {
                write!(f, "cispo eps={}/{}", short(eps_low), short(eps_high))
            }
            PolicyClip::Gspo { eps_low, eps_high } => {
                write!(f, "gspo eps={}/{}", short(eps_low), short(eps_high))
            }
            PolicyClip::Unclipped => f.write_str("unclipped"),
        }
    }
}

/// A number as a manifest would write it: 0.2, 2, and 1e9 or 3e-4 rather than 1000000000 or
/// 0.0003.
pub fn short(x: f64) -> String {
    if x != 0.0 && !(1e-3..1e5).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// How advantages are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum AdvantageEstimator {
    /// GAE over the response tokens with a learned critic, then batch whitening (PPO types).
    Gae { gamma: f64, lam: f64, whiten: bool },
    /// (s − mean)/(std + ε) within each prompt's group, or s − mean without std (GRPO types).
    GroupNormalized { norm_by_std: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Algorithm {
    pub kind: AlgorithmKind,
    pub clip: PolicyClip,
    pub advantage: AdvantageEstimator,
    pub loss_agg_mode: LossAggMode,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataSpec {
    pub suite: DataSuite,
    pub prompt_template: PromptTemplate,
    pub apply_chat_template: bool,
    pub max_prompt_length: usize,
    pub max_response_length: usize,
    pub shuffle: bool,
}

/// Sampling settings, shared by training rollouts and evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sampling {
    /// Responses per prompt.
    pub n: usize,
    /// 0 means greedy (evaluation only).
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OptimSpec {
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    pub warmup_steps: usize,
    pub grad_clip: f64,
    pub weight_decay: f64,
    pub betas: [f64; 2],
    pub eps: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ActorSpec {
    pub optim: OptimSpec,
    pub mini_batch_size: usize,
    pub micro_batch_size: usize,
    pub epochs: usize,
    pub entropy_coeff: f64,
    pub kl_loss_coef: f64,
    pub use_kl_in_reward: bool,
}

impl ActorSpec {
    /// Optimizer steps per training step: mini-batches × epochs (4 with the paper's sizes).
    pub fn updates_per_step(&self, batch_size: usize) -> usize {
        batch_size / self.mini_batch_size * self.epochs
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CriticSpec {
    pub optim: OptimSpec,
    pub cliprange_value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TrainerSpec {
    pub batch_size: usize,
    pub total_steps: usize,
    pub eval_every: usize,
    pub checkpoint_every: usize,
    pub reward: RewardKind,
    /// 0 = no tail histograms.
    pub tails_every: usize,
    pub difficulty_probe_k: usize,
    /// Evaluate the starting policy before the first step; None: yes (left out of the
    /// fingerprint when unset, so manifests without it keep theirs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_before_train: Option<bool>,
}

impl TrainerSpec {
    /// Whether the starting policy is evaluated before the first step.
    pub fn evaluates_at_start(&self) -> bool {
        self.val_before_train.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalSpec {
    pub benchmarks: Vec<Benchmark>,
    pub sampling: Sampling,
    pub max_new_tokens: usize,
    pub prompt_template: PromptTemplate,
    pub apply_chat_template: bool,
    pub limit: Option<usize>,
}

/// A number as a message shows it: plain when short, in exponent form when huge or tiny.
fn number(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e9).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The smallest sampling temperature other than 0 (greedy).
pub const MIN_TEMPERATURE: f64 = 0.01;

/// The most prompts a step may take (`trainer.batch_size`), and responses per prompt
/// (`rollout.n`, `eval.k`): sizes that bound memory (the paper uses 512 and 8).
pub const MAX_BATCH: usize = 1 << 16;
pub const MAX_SAMPLES: usize = 1 << 10;

/// The largest manifest file read (they are a few kilobytes).
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

impl Experiment {
    /// Reads and validates one manifest file. The run `name` must equal the file stem, so a
    /// run is found by its name in one guess.
    pub fn load(path: &Path) -> Result<Experiment, ManifestError> {
        let io = |source| ManifestError::Io {
            path: path.to_owned(),
            source,
        };
        // A FIFO or a device would block or never end: only a regular file of sane size is read.
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() || meta.len() > MAX_MANIFEST_BYTES {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a manifest: only a regular file of at most {MAX_MANIFEST_BYTES} bytes is read"),
            )));
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let experiment = Self::from_yaml(&text, path)?;
        if let Some((config, max_positions)) = experiment.local_max_positions() {
            experiment.check_context(path, max_positions, &config)?;
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if experiment.name != stem {
            return Err(ManifestError::Invalid {
                path: path.to_owned(),
                field: "name".into(),
                reason: format!(
                    "must equal the file name without extension (`{stem}`), got `{}`",
                    experiment.name
                ),
            });
        }
        Ok(experiment)
    }

    /// [`Experiment::load`], and the manifest as written (before defaults and validation's
    /// derived values): what an export to another engine must account for field by field.
    pub fn load_with_raw(path: &Path) -> Result<(Experiment, raw::Manifest), ManifestError> {
        let experiment = Self::load(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Io {
            path: path.to_owned(),
            source,
        })?;
        let raw = serde_saphyr::from_str(&text).map_err(|e| parse_error(e, &text, path))?;
        Ok((experiment, raw))
    }

    /// Parses and validates manifest text; `path` is used in error messages only.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Experiment, ManifestError> {
        // A tag the YAML crate does not know (`!foo 3`) would otherwise be dropped silently.
        let mut options = serde_saphyr::Options::default();
        options.reject_unsupported_tags = true;
        let raw: raw::Manifest = serde_saphyr::from_str_with_options(text, options.clone())
            .map_err(|e| parse_error(e, text, path))?;
        let written: serde_json::Value = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| parse_error(e, text, path))?;
        let typed = serde_json::to_value(&raw)
            .expect("invariant: a raw manifest always serialises to JSON");
        if let Some((field, got)) = quoted_scalar(&written, &typed, String::new()) {
            return Err(ManifestError::Invalid {
                path: path.to_owned(),
                field,
                reason: format!("a number or boolean is expected, not the quoted string \"{got}\""),
            });
        }
        Experiment::validate(raw, path)
    }

    /// The single place where a raw manifest becomes an experiment.
    pub fn validate(raw: raw::Manifest, path: &Path) -> Result<Experiment, ManifestError> {
        Validator { path }.experiment(raw)
    }

    /// The model's position limit where its config.json is on this machine (a model directory,
    /// or the config a missing one is created from), with that file; the manifest's
    /// `model.max_position_embeddings` overrides it. A hub model's limit is checked by `train`
    /// once it is downloaded.
    pub fn local_max_positions(&self) -> Option<(PathBuf, usize)> {
        let config = match &self.model.source {
            ModelSource::Dir(dir) if dir.join("config.json").is_file() => dir.join("config.json"),
            ModelSource::Dir(_) => self.model.init.as_ref()?.config.clone(),
            ModelSource::Hub { .. } => return None,
        };
        let text = std::fs::read_to_string(&config).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        let from_config = value["max_position_embeddings"].as_u64()? as usize;
        Some((config, from_config))
    }

    /// Refuses sequences longer than the model's positions: the prompt plus the longest
    /// response of training, evaluation or the warm start. `config_limit` is config.json's
    /// `max_position_embeddings` (from `config`); `model.max_position_embeddings` overrides it.
    pub fn check_context(
        &self,
        manifest: &Path,
        config_limit: usize,
        config: &Path,
    ) -> Result<(), ManifestError> {
        let (limit, whence) = match self.model.max_position_embeddings {
            Some(n) => (n, "model.max_position_embeddings".to_string()),
            None => (
                config_limit,
                format!("max_position_embeddings of {}", config.display()),
            ),
        };
        let prompt = self.data.max_prompt_length;
        let mut needs = vec![
            ("data.max_response_length", self.data.max_response_length),
            ("eval.max_new_tokens", self.eval.max_new_tokens),
        ];
        if let Some(w) = self.model.init.as_ref().and_then(|i| i.warm_start.as_ref()) {
            needs.push((
                "model.init.warm_start.max_response_length",
                w.max_response_length,
            ));
        }
        match needs.into_iter().find(|(_, n)| prompt + n > limit) {
            Some((field, n)) => Err(ManifestError::Invalid {
                path: manifest.to_owned(),
                field: field.into(),
                reason: format!(
                    "data.max_prompt_length {prompt} + {n} = {} positions, more than the model's {limit} ({whence}); shorten it, or set model.max_position_embeddings as verl's override_config does",
                    prompt + n
                ),
            }),
            None => Ok(()),
        }
    }

    /// This run (parsed from `text`) and its `seeds − 1` seed variants, seeds s, s + 1, …
    /// ([`Experiment::with_seed`]), each with the manifest text it keeps: what `reproduce
    /// --seeds` and `sweep` train.
    pub fn seeds(
        &self,
        text: &str,
        seeds: usize,
        path: &Path,
    ) -> Result<Vec<(Experiment, String)>, ManifestError> {
        let mut out = vec![(self.clone(), text.to_string())];
        for k in 1..seeds as u64 {
            let seed = self
                .seed
                .checked_add(k)
                .ok_or_else(|| ManifestError::Invalid {
                    path: path.to_owned(),
                    field: "seed".into(),
                    reason: format!(
                        "{} + {} more seeds runs past the largest seed ({})",
                        self.seed,
                        seeds - 1,
                        u64::MAX
                    ),
                })?;
            out.push(Experiment::with_seed(text, seed, path)?);
        }
        Ok(out)
    }

    /// The same manifest with another run seed (`acpo reproduce --seeds`): the text with its
    /// top-level `seed:` line rewritten, so the run directory's manifest.yaml is the one that
    /// ran, and the experiment parsed from it. Nothing else changes: the created model's own
    /// seed (`model.init.seed`) stays, so every seed starts RL from the same warm start, as runs
    /// of one pretrained checkpoint do.
    pub fn with_seed(
        text: &str,
        seed: u64,
        path: &Path,
    ) -> Result<(Experiment, String), ManifestError> {
        let mut found = false;
        let lines: Vec<String> = text
            .lines()
            .map(|l| {
                let value = l
                    .strip_prefix("seed:")
                    .map(|v| v.split('#').next().unwrap_or("").trim());
                match value {
                    Some(v) if !found && v.parse::<u64>().is_ok() => {
                        found = true;
                        format!("seed: {seed}")
                    }
                    _ => l.to_string(),
                }
            })
            .collect();
        if !found {
            return Err(ManifestError::Invalid {
                path: path.to_owned(),
                field: "seed".into(),
                reason: "no top-level `seed: N` line to vary (--seeds rewrites it)".into(),
            });
        }
        let mut varied = lines.join("\n");
        if text.ends_with('\n') {
            varied.push('\n');
        }
        let exp = Experiment::from_yaml(&varied, path)?;
        debug_assert_eq!(exp.seed, seed);
        Ok((exp, varied))
    }

    /// SHA-256 (hex) of the canonical JSON of every validated field.
    pub fn fingerprint(&self) -> String {
        let canonical =
            serde_json::to_vec(self).expect("invariant: an Experiment always serialises to JSON");
        hex(&Sha256::digest(&canonical))
    }

    /// The first 12 hex digits of the fingerprint, used in run directory names.
    pub fn short_fingerprint(&self) -> String {
        self.fingerprint()[..12].to_string()
    }

    /// Responses per training step: prompts × n.
    pub fn responses_per_step(&self) -> usize {
        self.trainer.batch_size * self.rollout.n
    }

    /// One line for `acpo check`.
    pub fn summary(&self) -> String {
        let model = match &self.model.source {
            ModelSource::Hub { repo, revision } => format!("{repo}@{revision}"),
            ModelSource::Dir(dir) => dir.display().to_string(),
        };
        format!(
            "{name:<36} {scale:<5} {algo:<7} {model:<34} n={n} batch={b}/{mb} lr={lr:e} {clip} steps={steps} avg@{k} fp={fp}",
            name = self.name,
            scale = format!("{:?}", self.scale).to_lowercase(),
            algo = self.algorithm.kind.to_string(),
            n = self.rollout.n,
            b = self.trainer.batch_size,
            mb = self.actor.mini_batch_size,
            lr = self.actor.optim.lr,
            clip = self.algorithm.clip,
            steps = self.trainer.total_steps,
            k = self.eval.sampling.n,
            fp = self.short_fingerprint(),
        )
    }
}

/// The first field written as a quoted string where the manifest wants a number or a boolean
/// (`seed: "1"`): the YAML crate converts the text, a typo'd type should not pass silently.
fn quoted_scalar(
    written: &serde_json::Value,
    typed: &serde_json::Value,
    at: String,
) -> Option<(String, String)> {
    use serde_json::Value;
    let join = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match (written, typed) {
        (Value::String(s), Value::Number(_) | Value::Bool(_)) => Some((at, s.clone())),
        (Value::Object(w), Value::Object(t)) => w
            .iter()
            .find_map(|(k, v)| t.get(k).and_then(|tv| quoted_scalar(v, tv, join(k)))),
        (Value::Array(w), Value::Array(t)) => w
            .iter()
            .zip(t)
            .enumerate()
            .find_map(|(i, (v, tv))| quoted_scalar(v, tv, format!("{at}[{i}]"))),
        _ => None,
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// serde-saphyr reports a line and column with a source snippet; a manifest error is one
/// sentence naming the field, so the snippet is dropped and the field path is recovered from
/// the line.
fn parse_error(err: serde_saphyr::Error, text: &str, path: &Path) -> ManifestError {
    let plain = err.without_snippet().to_string();
    // "error: line 8 column 1: unknown field ..." -> "unknown field ..."
    let mut message = plain.trim().trim_start_matches("error:").trim();
    if message.starts_with("line ") {
        if let Some((_, rest)) = message.split_once(": ") {
            message = rest;
        }
    }
    let mut message = message.lines().next().unwrap_or("").trim();
    if let Some((head, _)) = message.rsplit_once(" at line ") {
        message = head;
    }
    let message = message.to_string();
    match err.location().filter(|l| l.line() > 0) {
        Some(location) => {
            // A quote left open runs into the lines after it, where the YAML parser stops: the
            // fault is on the line that opened it.
            let line = location.line() as usize;
            let line = if message.contains("quoted scalar") {
                unclosed_quote_line(text, line).unwrap_or(line)
            } else {
                line
            };
            ManifestError::Parse {
                path: path.to_owned(),
                line: line as u64,
                field: field_path_at_line(text, line),
                message,
            }
        }
        None => ManifestError::Syntax {
            path: path.to_owned(),
            message,
        },
    }
}

/// The last line up to `line` (1-based) that opens a quote it does not close.
fn unclosed_quote_line(text: &str, line: usize) -> Option<usize> {
    let opens_unclosed = |l: &str| {
        let mut quote: Option<char> = None;
        let mut chars = l.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, '#') => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some('\''), '\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                }
                (Some(q), c) if c == q => quote = None,
                _ => {}
            }
        }
        quote.is_some()
    };
    text.lines()
        .take(line)
        .enumerate()
        .filter(|(_, l)| opens_unclosed(l))
        .map(|(i, _)| i + 1)
        .last()
}

/// The dotted key path (`rollout.n`) of a 1-based line of block-style YAML, from indentation.
fn field_path_at_line(text: &str, line: usize) -> String {
    let mut stack: Vec<(usize, &str)> = Vec::new();
    for raw_line in text.lines().take(line) {
        let content = raw_line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = raw_line.len() - content.len();
        let Some((key, _)) = content.split_once(':') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
    }
    if stack.is_empty() {
        return "(top level)".to_string();
    }
    stack.iter().map(|(_, k)| *k).collect::<Vec<_>>().join(".")
}

/// Walks a raw manifest; the first rule broken becomes the error.
struct Validator<'a> {
    path: &'a Path,
}

type Checked<T> = Result<T, ManifestError>;

impl Validator<'_> {
    fn fail<T>(&self, field: &str, reason: impl Into<String>) -> Checked<T> {
        Err(ManifestError::Invalid {
            path: self.path.to_owned(),
            field: field.to_owned(),
            reason: reason.into(),
        })
    }

    fn learning_rate(&self, field: &str, lr: f64) -> Checked<f64> {
        let lr = self.strictly_positive(field, lr)?;
        if lr >= 1.0 {
            return self.fail(
                field,
                format!("must be < 1 (a learning rate of {lr} diverges)"),
            );
        }
        Ok(lr)
    }

    /// A count that sizes memory: at least 1 and at most `max`.
    fn bounded(&self, field: &str, value: usize, max: usize, why: &str) -> Checked<usize> {
        self.positive(field, value)?;
        if value > max {
            return self.fail(field, format!("must be at most {max} ({why}), got {value}"));
        }
        Ok(value)
    }

    fn positive(&self, field: &str, value: usize) -> Checked<usize> {
        if value == 0 {
            return self.fail(field, "must be at least 1, got 0");
        }
        Ok(value)
    }

    fn finite_in(&self, field: &str, value: f64, lo: f64, hi: f64, range: &str) -> Checked<f64> {
        if !value.is_finite() || value < lo || value > hi {
            return self.fail(field, format!("must be in {range}, got {}", number(value)));
        }
        Ok(value)
    }

    fn strictly_positive(&self, field: &str, value: f64) -> Checked<f64> {
        if !value.is_finite() || value <= 0.0 {
            return self.fail(
                field,
                format!("must be a finite number > 0, got {}", number(value)),
            );
        }
        Ok(value)
    }

    fn required<T: Copy>(&self, field: &str, value: Option<T>, why: &str) -> Checked<T> {
        match value {
            Some(v) => Ok(v),
            None => self.fail(field, format!("is required {why}")),
        }
    }

    fn forbidden<T>(&self, field: &str, value: &Option<T>, why: &str) -> Checked<()> {
        if value.is_some() {
            return self.fail(field, format!("must not be set {why}"));
        }
        Ok(())
    }

    fn experiment(&self, raw: raw::Manifest) -> Checked<Experiment> {
        let name = self.name(&raw.name)?;
        if let Some(description) = &raw.description {
            if description.trim().is_empty() {
                return self.fail("description", "must not be empty when present");
            }
        }
        let model = self.model(&raw.model)?;
        let algorithm = self.algorithm(&raw.algorithm)?;
        let data = self.data(&raw.data)?;
        let rollout = self.sampling(
            "rollout",
            raw.rollout.n,
            raw.rollout.temperature,
            raw.rollout.top_p,
            raw.rollout.top_k,
            false,
        )?;
        if !algorithm.kind.is_ppo_type() && rollout.n < 2 {
            return self.fail(
                "rollout.n",
                format!(
                    "must be at least 2 for {}: group-normalised advantages need a group, got {}",
                    algorithm.kind, rollout.n
                ),
            );
        }
        let trainer = self.trainer(&raw.trainer)?;
        let actor = self.actor(&raw.actor, &trainer, &rollout)?;
        let critic = match (algorithm.kind.is_ppo_type(), &raw.critic) {
            (true, Some(critic)) => Some(self.critic(critic)?),
            (true, None) => {
                return self.fail(
                    "critic",
                    format!(
                        "is required for {}: PPO types learn a value function",
                        algorithm.kind
                    ),
                )
            }
            (false, Some(_)) => {
                return self.fail(
                    "critic",
                    format!(
                        "must not be set for {}: GRPO types have no critic",
                        algorithm.kind
                    ),
                )
            }
            (false, None) => None,
        };
        let warmups = [
            ("actor", Some(&actor.optim)),
            ("critic", critic.as_ref().map(|c| &c.optim)),
        ];
        for (who, optim) in warmups {
            if let Some(o) = optim.filter(|o| o.warmup_steps > trainer.total_steps) {
                return self.fail(
                    &format!("{who}.optim.warmup_steps"),
                    format!(
                        "must not exceed trainer.total_steps ({}), got {}",
                        trainer.total_steps, o.warmup_steps
                    ),
                );
            }
        }
        let eval = self.eval(&raw.eval)?;
        if raw.scale == Scale::Paper && raw.device != Device::Cuda {
            // results/paper/ holds the paper's runs; a CPU run there would sit beside them
            return self.fail(
                "device",
                format!(
                    "must be cuda for scale paper (its results are the paper's, from the GPU), got {}: use scale smoke or mini for a CPU run",
                    format!("{:?}", raw.device).to_lowercase()
                ),
            );
        }
        Ok(Experiment {
            name,
            description: raw.description,
            scale: raw.scale,
            seed: raw.seed,
            device: raw.device,
            model,
            algorithm,
            data,
            rollout,
            actor,
            critic,
            trainer,
            eval,
        })
    }

    fn name(&self, name: &str) -> Checked<String> {
        let ok = !name.is_empty()
            && name.len() <= 96
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok {
            return self.fail(
                "name",
                format!(
                    "must be 1-96 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit (it names the run directory), got `{name}`"
                ),
            );
        }
        Ok(name.to_owned())
    }

    fn model(&self, raw: &raw::Model) -> Checked<ModelSpec> {
        let source = match (&raw.repo, &raw.dir) {
            (Some(repo), None) => {
                let valid_repo = repo.split('/').count() == 2
                    && repo.split('/').all(|part| {
                        !part.is_empty()
                            && part
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                    });
                if !valid_repo {
                    return self.fail(
                        "model.repo",
                        format!("must be a hub id of the form `owner/name`, got `{repo}`"),
                    );
                }
                let Some(revision) = &raw.revision else {
                    return self.fail(
                        "model.revision",
                        "is required with model.repo (a branch, tag or commit to pin the weights)",
                    );
                };
                if revision.trim().is_empty() {
                    return self.fail("model.revision", "must not be empty");
                }
                ModelSource::Hub {
                    repo: repo.clone(),
                    revision: revision.clone(),
                }
            }
            (None, Some(dir)) => {
                self.forbidden(
                    "model.revision",
                    &raw.revision,
                    "with model.dir (only hub models have revisions)",
                )?;
                if dir.as_os_str().is_empty() {
                    return self.fail("model.dir", "must not be empty");
                }
                ModelSource::Dir(dir.clone())
            }
            (Some(_), Some(_)) => {
                return self.fail("model", "set exactly one of `repo` and `dir`, not both")
            }
            (None, None) => return self.fail("model", "set exactly one of `repo` and `dir`"),
        };
        let init = match (&raw.init, &source) {
            (None, _) => None,
            (Some(i), ModelSource::Dir(_)) => {
                if i.config.as_os_str().is_empty() {
                    return self.fail("model.init.config", "must not be empty");
                }
                let warm_start = match &i.warm_start {
                    None => None,
                    Some(w) => {
                        let f = |k: &str| format!("model.init.warm_start.{k}");
                        if i.tokenizer.is_none() {
                            return self.fail(
                                "model.init.warm_start",
                                "needs model.init.tokenizer (the solutions are tokenized with it)",
                            );
                        }
                        if w.warmup_steps > w.steps {
                            return self.fail(
                                &f("warmup_steps"),
                                format!(
                                    "must be at most steps ({}), got {}",
                                    w.steps, w.warmup_steps
                                ),
                            );
                        }
                        Some(WarmStartSpec {
                            steps: self.positive(&f("steps"), w.steps)?,
                            batch_size: self.positive(&f("batch_size"), w.batch_size)?,
                            lr: self.learning_rate(&f("lr"), w.lr)?,
                            warmup_steps: w.warmup_steps,
                            max_response_length: self
                                .positive(&f("max_response_length"), w.max_response_length)?,
                        })
                    }
                };
                match &i.tokenizer {
                    Some(InitTokenizer::Files(TokenizerFiles::Dir { dir }))
                        if dir.as_os_str().is_empty() =>
                    {
                        return self.fail("model.init.tokenizer.dir", "must not be empty")
                    }
                    Some(InitTokenizer::Files(TokenizerFiles::Hub { repo, revision }))
                        if repo.is_empty() || revision.is_empty() =>
                    {
                        return self.fail(
                            "model.init.tokenizer",
                            "a hub tokenizer needs a repo and a revision",
                        )
                    }
                    _ => {}
                }
                Some(ModelInitSpec {
                    config: i.config.clone(),
                    seed: i.seed,
                    tokenizer: i.tokenizer.clone(),
                    warm_start,
                })
            }
            (Some(_), ModelSource::Hub { .. }) => {
                return self.fail(
                    "model.init",
                    "is only for model.dir (a hub model is downloaded, not created)",
                )
            }
        };
        let max_position_embeddings = match raw.max_position_embeddings {
            Some(n) => Some(self.positive("model.max_position_embeddings", n)?),
            None => None,
        };
        Ok(ModelSpec {
            source,
            dtype: raw.dtype,
            gradient_checkpointing: raw.gradient_checkpointing,
            init,
            max_position_embeddings,
        })
    }

    /// What the policy loss clips: α for the -AC variants, else the baseline's `policy_loss`
    /// with its ratio bounds (issue #23's family).
    fn policy_clip(&self, raw: &raw::Algorithm) -> Checked<PolicyClip> {
        let kind = raw.name;
        let for_kind = format!("for {kind}");
        Ok(if kind.is_advantage_clipped() {
            let not_ratio = format!("for {kind}: -AC variants clip r·A, not the ratio (use alpha)");
            self.forbidden("algorithm.clip_ratio_low", &raw.clip_ratio_low, &not_ratio)?;
            self.forbidden(
                "algorithm.clip_ratio_high",
                &raw.clip_ratio_high,
                &not_ratio,
            )?;
            self.forbidden("algorithm.clip_ratio_c", &raw.clip_ratio_c, &not_ratio)?;
            self.forbidden(
                "algorithm.policy_loss",
                &raw.policy_loss,
                &format!("for {kind}: -AC variants always clip r·A (paper eq. 5)"),
            )?;
            let alpha = self.required("algorithm.alpha", raw.alpha, &for_kind)?;
            PolicyClip::Advantage {
                alpha: self.strictly_positive("algorithm.alpha", alpha)?,
            }
        } else {
            self.forbidden(
                "algorithm.alpha",
                &raw.alpha,
                &format!("for {kind}: alpha is the advantage-clipping threshold of the -AC variants only"),
            )?;
            // CISPO's lower bound may be switched off, as its authors and verl's example do
            // (clip_ratio_low 10: a weight bound below 0 never binds); the other rules need
            // 1 − ε_low > 0.
            let eps = |no_lower_bound: bool| -> Checked<(f64, f64)> {
                let eps_low =
                    self.required("algorithm.clip_ratio_low", raw.clip_ratio_low, &for_kind)?;
                let eps_high =
                    self.required("algorithm.clip_ratio_high", raw.clip_ratio_high, &for_kind)?;
                let (low_max, low_range) = if no_lower_bound {
                    (f64::MAX, "[0, inf)")
                } else {
                    (1.0, "[0, 1]")
                };
                let eps_low =
                    self.finite_in("algorithm.clip_ratio_low", eps_low, 0.0, low_max, low_range)?;
                let eps_high = self.finite_in(
                    "algorithm.clip_ratio_high",
                    eps_high,
                    0.0,
                    f64::MAX,
                    "[0, inf)",
                )?;
                if !no_lower_bound && eps_low >= 1.0 {
                    return self.fail(
                        "algorithm.clip_ratio_low",
                        format!("must be < 1 so the lower ratio bound 1 - eps stays positive, got {eps_low}"),
                    );
                }
                Ok((eps_low, eps_high))
            };
            match raw.policy_loss.unwrap_or(PolicyLossMode::Vanilla) {
                PolicyLossMode::Vanilla => {
                    let (eps_low, eps_high) = eps(false)?;
                    let c = self.required("algorithm.clip_ratio_c", raw.clip_ratio_c, &for_kind)?;
                    if !c.is_finite() || c <= 1.0 {
                        return self.fail(
                            "algorithm.clip_ratio_c",
                            format!("the dual-clip constant must be a finite number > 1, got {c}"),
                        );
                    }
                    PolicyClip::Ratio {
                        eps_low,
                        eps_high,
                        dual_clip_c: c,
                    }
                }
                mode @ (PolicyLossMode::Cispo | PolicyLossMode::Gspo) => {
                    self.forbidden(
                        "algorithm.clip_ratio_c",
                        &raw.clip_ratio_c,
                        "with policy_loss: cispo or gspo (verl's have no dual clip)",
                    )?;
                    let (eps_low, eps_high) = eps(mode == PolicyLossMode::Cispo)?;
                    if mode == PolicyLossMode::Cispo {
                        PolicyClip::Cispo { eps_low, eps_high }
                    } else {
                        PolicyClip::Gspo { eps_low, eps_high }
                    }
                }
                PolicyLossMode::Unclipped => {
                    let why = "with policy_loss: unclipped (nothing is clipped)";
                    self.forbidden("algorithm.clip_ratio_low", &raw.clip_ratio_low, why)?;
                    self.forbidden("algorithm.clip_ratio_high", &raw.clip_ratio_high, why)?;
                    self.forbidden("algorithm.clip_ratio_c", &raw.clip_ratio_c, why)?;
                    PolicyClip::Unclipped
                }
            }
        })
    }

    fn algorithm(&self, raw: &raw::Algorithm) -> Checked<Algorithm> {
        let kind = raw.name;
        let for_kind = format!("for {kind}");
        let clip = self.policy_clip(raw)?;
        let advantage = if kind.is_ppo_type() {
            let why = format!("for {kind}: it has no group-normalised advantage");
            self.forbidden(
                "algorithm.norm_adv_by_std_in_grpo",
                &raw.norm_adv_by_std_in_grpo,
                &why,
            )?;
            let gamma = self.required("algorithm.gamma", raw.gamma, &for_kind)?;
            let lam = self.required("algorithm.lam", raw.lam, &for_kind)?;
            let whiten = self.required(
                "algorithm.whiten_advantages",
                raw.whiten_advantages,
                &for_kind,
            )?;
            AdvantageEstimator::Gae {
                gamma: self.finite_in("algorithm.gamma", gamma, 0.0, 1.0, "[0, 1]")?,
                lam: self.finite_in("algorithm.lam", lam, 0.0, 1.0, "[0, 1]")?,
                whiten,
            }
        } else {
            let why = format!("for {kind}: GAE parameters belong to PPO types");
            self.forbidden("algorithm.gamma", &raw.gamma, &why)?;
            self.forbidden("algorithm.lam", &raw.lam, &why)?;
            self.forbidden("algorithm.whiten_advantages", &raw.whiten_advantages, &why)?;
            AdvantageEstimator::GroupNormalized {
                norm_by_std: self.required(
                    "algorithm.norm_adv_by_std_in_grpo",
                    raw.norm_adv_by_std_in_grpo,
                    &for_kind,
                )?,
            }
        };
        Ok(Algorithm {
            kind,
            clip,
            advantage,
            loss_agg_mode: raw.loss_agg_mode,
        })
    }

    fn data(&self, raw: &raw::Data) -> Checked<DataSpec> {
        Ok(DataSpec {
            suite: raw.suite,
            prompt_template: raw.prompt_template,
            apply_chat_template: raw.apply_chat_template,
            max_prompt_length: self.positive("data.max_prompt_length", raw.max_prompt_length)?,
            max_response_length: self
                .positive("data.max_response_length", raw.max_response_length)?,
            shuffle: raw.shuffle,
        })
    }

    fn sampling(
        &self,
        section: &str,
        n: usize,
        temperature: f64,
        top_p: f64,
        top_k: Option<usize>,
        greedy_allowed: bool,
    ) -> Checked<Sampling> {
        let n_field = if section == "eval" {
            "eval.k".to_string()
        } else {
            format!("{section}.n")
        };
        self.bounded(
            &n_field,
            n,
            MAX_SAMPLES,
            "samples per prompt; the paper uses 8 to 32",
        )?;
        let field = format!("{section}.temperature");
        // logits / T overflows f32 long before T reaches 0: below MIN_TEMPERATURE, sample greedily.
        let too_small = temperature > 0.0 && temperature < MIN_TEMPERATURE;
        if !temperature.is_finite()
            || temperature < 0.0
            || (temperature == 0.0 && !greedy_allowed)
            || too_small
        {
            let range = if greedy_allowed {
                "0 (greedy) or in [0.01, inf)"
            } else {
                "in [0.01, inf): RL rollouts must sample"
            };
            let got = number(temperature);
            return self.fail(&field, format!("must be {range}, got {got}"));
        }
        let field = format!("{section}.top_p");
        if !top_p.is_finite() || top_p <= 0.0 || top_p > 1.0 {
            return self.fail(&field, format!("must be in (0, 1], got {top_p}"));
        }
        if top_k == Some(0) {
            return self.fail(
                &format!("{section}.top_k"),
                "must be at least 1, or null for no top-k filtering",
            );
        }
        Ok(Sampling {
            n,
            temperature,
            top_p,
            top_k,
        })
    }

    fn optim(&self, section: &str, raw: &raw::Optim) -> Checked<OptimSpec> {
        let f = |name: &str| format!("{section}.optim.{name}");
        let lr = self.learning_rate(&f("lr"), raw.lr)?;
        let grad_clip = self.strictly_positive(&f("grad_clip"), raw.grad_clip)?;
        let weight_decay =
            self.finite_in(&f("weight_decay"), raw.weight_decay, 0.0, 1.0, "[0, 1]")?;
        for (i, beta) in raw.betas.iter().enumerate() {
            if !beta.is_finite() || *beta < 0.0 || *beta >= 1.0 {
                return self.fail(
                    &format!("{section}.optim.betas[{i}]"),
                    format!("must be in [0, 1), got {beta}"),
                );
            }
        }
        let eps = self.strictly_positive(&f("eps"), raw.eps)?;
        // The update runs in f32: an ε that rounds to 0 (or to a subnormal) there turns a
        // parameter with a zero gradient into 0/0.
        if !(eps as f32).is_normal() {
            return self.fail(
                &f("eps"),
                format!(
                    "must be at least {:e} (it is used in f32, where {eps:e} is not a normal number)",
                    f32::MIN_POSITIVE
                ),
            );
        }
        Ok(OptimSpec {
            lr,
            lr_schedule: raw.lr_schedule,
            warmup_steps: raw.warmup_steps,
            grad_clip,
            weight_decay,
            betas: raw.betas,
            eps,
        })
    }

    fn actor(
        &self,
        raw: &raw::Actor,
        trainer: &TrainerSpec,
        rollout: &Sampling,
    ) -> Checked<ActorSpec> {
        let optim = self.optim("actor", &raw.optim)?;
        let mini = self.positive("actor.mini_batch_size", raw.mini_batch_size)?;
        if !trainer.batch_size.is_multiple_of(mini) {
            return self.fail(
                "actor.mini_batch_size",
                format!(
                    "must divide trainer.batch_size ({}) so every mini-batch is full, got {mini}",
                    trainer.batch_size
                ),
            );
        }
        let responses = mini * rollout.n;
        let micro = raw.micro_batch_size.unwrap_or(responses);
        self.positive("actor.micro_batch_size", micro)?;
        if !responses.is_multiple_of(micro) {
            return self.fail(
                "actor.micro_batch_size",
                format!(
                    "must divide the responses of a mini-batch (mini_batch_size × rollout.n = {responses}), got {micro}"
                ),
            );
        }
        let epochs = self.positive("actor.epochs", raw.epochs)?;
        // Beyond 1 the bonus outweighs the policy loss it regularises (verl uses 0 to 0.01).
        let entropy_coeff =
            self.finite_in("actor.entropy_coeff", raw.entropy_coeff, 0.0, 1.0, "[0, 1]")?;
        let kl_loss_coef = self.finite_in(
            "actor.kl_loss_coef",
            raw.kl_loss_coef,
            0.0,
            f64::MAX,
            "[0, inf)",
        )?;
        // `train` keeps no reference policy, so `check` refuses what it could not honour.
        let no_reference = "the trainer keeps no reference policy (the paper uses no KL term)";
        if kl_loss_coef != 0.0 {
            return self.fail(
                "actor.kl_loss_coef",
                format!("must be 0: {no_reference}, got {kl_loss_coef}"),
            );
        }
        if raw.use_kl_in_reward {
            return self.fail(
                "actor.use_kl_in_reward",
                format!("must be false: {no_reference}"),
            );
        }
        Ok(ActorSpec {
            optim,
            mini_batch_size: mini,
            micro_batch_size: micro,
            epochs,
            entropy_coeff,
            kl_loss_coef,
            use_kl_in_reward: raw.use_kl_in_reward,
        })
    }

    fn critic(&self, raw: &raw::Critic) -> Checked<CriticSpec> {
        Ok(CriticSpec {
            optim: self.optim("critic", &raw.optim)?,
            cliprange_value: self
                .strictly_positive("critic.cliprange_value", raw.cliprange_value)?,
        })
    }

    fn trainer(&self, raw: &raw::Trainer) -> Checked<TrainerSpec> {
        Ok(TrainerSpec {
            batch_size: self.bounded(
                "trainer.batch_size",
                raw.batch_size,
                MAX_BATCH,
                "prompts per step; the paper uses 512",
            )?,
            total_steps: self.positive("trainer.total_steps", raw.total_steps)?,
            eval_every: self.positive("trainer.eval_every", raw.eval_every)?,
            checkpoint_every: self.positive("trainer.checkpoint_every", raw.checkpoint_every)?,
            reward: raw.reward,
            tails_every: raw.tails_every,
            difficulty_probe_k: raw.difficulty_probe_k,
            val_before_train: raw.val_before_train,
        })
    }

    fn eval(&self, raw: &raw::Eval) -> Checked<EvalSpec> {
        if raw.benchmarks.is_empty() {
            return self.fail("eval.benchmarks", "must list at least one benchmark");
        }
        let mut seen = BTreeSet::new();
        for b in &raw.benchmarks {
            if !seen.insert(*b) {
                return self.fail("eval.benchmarks", format!("lists `{}` twice", b.name()));
            }
        }
        let sampling = self.sampling("eval", raw.k, raw.temperature, raw.top_p, None, true)?;
        if let Some(limit) = raw.limit {
            self.positive("eval.limit", limit)?;
        }
        Ok(EvalSpec {
            benchmarks: raw.benchmarks.clone(),
            sampling,
            max_new_tokens: self.positive("eval.max_new_tokens", raw.max_new_tokens)?,
            prompt_template: raw.prompt_template,
            apply_chat_template: raw.apply_chat_template,
            limit: raw.limit,
        })
    }
}

/// What `acpo check` found: a summary line per valid manifest, an error per invalid one.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub files: usize,
    pub valid: Vec<String>,
    pub errors: Vec<String>,
}

/// Validates every manifest under `paths` (files, or directories searched for `*.yaml`);
/// run names must be unique across them, and `model` checks what a manifest names beyond
/// itself (the model's config: `model::check_manifest_model`). Every file is checked, whatever
/// the others say.
pub fn check_all(
    paths: &[PathBuf],
    model: &dyn Fn(&Experiment) -> Result<(), String>,
) -> Result<CheckReport, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        files.extend(discover(path)?);
    }
    let mut report = CheckReport {
        files: files.len(),
        ..CheckReport::default()
    };
    let mut names: std::collections::BTreeMap<String, PathBuf> = Default::default();
    for file in &files {
        match Experiment::load(file) {
            Ok(experiment) => {
                if let Some(other) = names.insert(experiment.name.clone(), file.clone()) {
                    report.errors.push(format!(
                        "{}: field `name`: `{}` is already the name of {}",
                        file.display(),
                        experiment.name,
                        other.display()
                    ));
                    continue;
                }
                if let Err(reason) = model(&experiment) {
                    report.errors.push(format!("{}: {reason}", file.display()));
                    continue;
                }
                report.valid.push(experiment.summary());
            }
            Err(err) => report.errors.push(err.to_string()),
        }
    }
    Ok(report)
}

/// Every `*.yaml` / `*.yml` file under `path` (or `path` itself), sorted for a stable order.
pub fn discover(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let io = |source| ManifestError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let mut found = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ManifestError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| ManifestError::Io {
                path: dir.clone(),
                source,
            })?;
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                found.push(p);
            }
        }
    }
    found.sort();
    Ok(found)
}
