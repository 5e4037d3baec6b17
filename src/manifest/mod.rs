//! Experiment manifests: one YAML file per training run.
//!
//! A manifest is the only source of a run's settings (docs/ARCHITECTURE.md). It is read in two stages, as
//! ripgrep and uv do with their flags: [`raw::Manifest`] mirrors the YAML exactly
//! (`deny_unknown_fields` everywhere, so a typo is an error, never a silently ignored setting),
//! and [`Experiment::validate`] validates it once into typed values that the rest of the crate
//! trusts. Every validation rule lives in the `validate` module, and every error names the file, the
//! field path and the reason (`diagnostics` turns the YAML reader's errors into that form).
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

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::algo::Algorithm;
use crate::checksum::hex;
use crate::data::{Benchmark, DataSpec, PromptTemplate};
use crate::files::{AtPath, PathIoError};
use crate::hub::ModelSource;
use crate::model::spec::{Device, ModelSpec};
use crate::optim::OptimSpec;
use crate::reward::RewardKind;
use crate::rollout::{KvLayout, Sampling};
use diagnostics::{parse_error, quoted_scalar};
use validate::Validator;

/// Why a manifest could not be used. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// (Not `#[from]`: that would make it the source, and the message says it already.)
    #[error("{}: cannot read the manifest: {}", .0.path.display(), .0.source)]
    Io(PathIoError),
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

impl From<PathIoError> for ManifestError {
    fn from(e: PathIoError) -> Self {
        ManifestError::Io(e)
    }
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

mod bound;
pub use bound::SAMPLE_RECORD_BYTES;
mod check;
mod diagnostics;
pub mod edit;
pub mod ranges;
pub mod raw;
mod validate;

pub use check::{check_all, discover, CheckReport};
// ---------------------------------------------------------------------------------------------
// Enumerations shared by the raw and validated forms.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    Smoke,
    Mini,
    Paper,
    /// A paper manifest at its own shapes on random weights, batch sizes divided (issue #34,
    /// `acpo pipeline`): what a paper run costs on a GPU and whether it fits, never accuracy.
    /// Its manifests are derived, never kept in `experiments/`.
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
    /// How the samplers hold their KV cache ([`Experiment::kv_layout`]): `Some(Paged)` or
    /// None (dense, written or not); left out of the fingerprint when None, so manifests
    /// without it keep theirs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_layout: Option<KvLayout>,
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

    /// Whether a run evaluates at `step` (0: before the first step): at the start when
    /// [`Self::evaluates_at_start`], every `eval_every` steps, and after the last step. The one
    /// statement of the schedule: the trainer follows it, a finished run's `eval.jsonl` is
    /// checked against it ([`crate::run::complete`]), and verl validates on it (`test_freq`,
    /// `val_before_train` and its last step), so an imported dump off it is refused.
    pub fn evaluates_at(&self, step: usize) -> bool {
        match step {
            0 => self.evaluates_at_start(),
            s if s > self.total_steps => false,
            s => {
                s == self.total_steps || (self.eval_every > 0 && s.is_multiple_of(self.eval_every))
            }
        }
    }

    /// The steps a complete run evaluates at, in order ([`Self::evaluates_at`]); an iterator,
    /// since a manifest's steps are not bounded.
    pub fn eval_steps(&self) -> impl Iterator<Item = usize> + '_ {
        let every = self.eval_every.max(1);
        let start = self.evaluates_at_start().then_some(0);
        let periodic = (1..=self.total_steps / every).map(move |k| k * every);
        let last = (!self.total_steps.is_multiple_of(every)).then_some(self.total_steps);
        start.into_iter().chain(periodic).chain(last)
    }

    /// Evaluations a run costs (the plans' count): one every `eval_every` steps and one at the
    /// start (`eval_every` 0: at the start only).
    pub fn evaluations(&self) -> usize {
        self.total_steps.checked_div(self.eval_every).unwrap_or(0) + 1
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

impl EvalSpec {
    /// Problems one evaluation scores: each benchmark's, at most `limit` of them.
    pub fn problems(&self) -> usize {
        self.benchmarks
            .iter()
            .map(|b| self.limit.map_or(b.size(), |l| l.min(b.size())))
            .sum()
    }
}

pub use crate::rollout::MIN_TEMPERATURE;

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
        Ok(Self::load_with_raw(path)?.0)
    }

    /// [`Experiment::load`], and the manifest as written (before defaults and validation's
    /// derived values): what an export to another engine must account for field by field.
    pub fn load_with_raw(path: &Path) -> Result<(Experiment, raw::Manifest), ManifestError> {
        // A FIFO or a device would block or never end: only a regular file of sane size is read.
        let meta = crate::files::metadata(path)?;
        if !meta.is_file() || meta.len() > MAX_MANIFEST_BYTES {
            return Err(PathIoError::refused(
                path,
                std::io::ErrorKind::InvalidInput,
                format!("not a manifest: only a regular file of at most {MAX_MANIFEST_BYTES} bytes is read"),
            )
            .into());
        }
        let text = crate::files::read_to_string(path).at(path)?;
        let (experiment, raw) = Self::from_yaml_with_raw(&text, path)?;
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
        Ok((experiment, raw))
    }

    /// Parses and validates manifest text; `path` is used in error messages only.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Experiment, ManifestError> {
        Ok(Self::from_yaml_with_raw(text, path)?.0)
    }

    /// [`Experiment::from_yaml`], and the manifest as written: the one reader of manifest text.
    /// The text is read twice in this one place, as the schema ([`raw::Manifest`], which
    /// converts a quoted `"1"` where a number is wanted) and as written (which keeps it a
    /// string), so that a typo'd type is refused rather than converted.
    pub fn from_yaml_with_raw(
        text: &str,
        path: &Path,
    ) -> Result<(Experiment, raw::Manifest), ManifestError> {
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
        Ok((Experiment::validate(raw.clone(), path)?, raw))
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
        let text = crate::files::read_to_string(&config).ok()?;
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
        if !edit::has_field(text, "seed") {
            return Err(ManifestError::Invalid {
                path: path.to_owned(),
                field: "seed".into(),
                reason: "no top-level `seed: N` line to vary (--seeds rewrites it)".into(),
            });
        }
        let varied = edit::set_field(text, "seed", &seed.to_string())
            .expect("invariant: a top-level field is always set");
        let exp = Experiment::from_yaml(&varied, path)?;
        debug_assert_eq!(exp.seed, seed);
        Ok((exp, varied))
    }

    /// How the run's samplers (rollouts, the probe, evaluations) hold their KV cache: the
    /// manifest's `kv_layout`, dense when absent.
    pub fn kv_layout(&self) -> KvLayout {
        self.kv_layout.unwrap_or_default()
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
