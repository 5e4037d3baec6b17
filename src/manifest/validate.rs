//! The one place a raw manifest becomes an [`Experiment`]: every value in range, every
//! cross-field rule checked, the first rule broken an error naming the file and the field.

use std::collections::BTreeSet;
use std::path::Path;

use super::raw;
use super::{
    ActorSpec, CriticSpec, EvalSpec, Experiment, ManifestError, Scale, TrainerSpec, MIN_TEMPERATURE,
};
use crate::algo::clip::PolicyClip;
use crate::algo::method::AdvantageEstimator;
use crate::algo::Algorithm;
use crate::data::DataSpec;
use crate::field::{self, number, FieldError};
use crate::hub::ModelSource;
use crate::model::init::{InitTokenizer, ModelInitSpec, TokenizerFiles, WarmStartSpec};
use crate::model::spec::{Device, ModelSpec};
use crate::optim::OptimSpec;
use crate::rollout::{KvLayout, Sampling};

/// Walks a raw manifest; the first rule broken becomes the error.
pub(super) struct Validator<'a> {
    pub(super) path: &'a Path,
}

type Checked<T> = Result<T, ManifestError>;

impl Validator<'_> {
    /// A field's refusal as this manifest's error.
    fn at(&self, e: FieldError) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.to_owned(),
            field: e.field,
            reason: e.reason,
        }
    }

    fn fail<T>(&self, field: &str, reason: impl Into<String>) -> Checked<T> {
        field::fail(field, reason).map_err(|e| self.at(e))
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

    /// A whole-number field in its declared range ([`super::ranges::RANGES`]).
    fn ranged(&self, field: &str, value: usize) -> Checked<usize> {
        let range = super::ranges::of(field);
        if !range.holds(value as u64) {
            return self.fail(field, format!("must be {}, got {value}", range.describe()));
        }
        Ok(value)
    }

    fn finite_in(&self, field: &str, value: f64, lo: f64, hi: f64, range: &str) -> Checked<f64> {
        field::finite_in(field, value, lo, hi, range).map_err(|e| self.at(e))
    }

    fn strictly_positive(&self, field: &str, value: f64) -> Checked<f64> {
        field::strictly_positive(field, value).map_err(|e| self.at(e))
    }

    fn required<T: Copy>(&self, field: &str, value: Option<T>, why: &str) -> Checked<T> {
        field::required(field, value, why).map_err(|e| self.at(e))
    }

    fn forbidden<T>(&self, field: &str, value: &Option<T>, why: &str) -> Checked<()> {
        field::forbidden(field, value, why).map_err(|e| self.at(e))
    }

    pub(super) fn experiment(&self, raw: raw::Manifest) -> Checked<Experiment> {
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
            // `dense` is the default: written or not, the same run and fingerprint
            kv_layout: raw.kv_layout.filter(|l| *l != KvLayout::Dense),
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
        let source = self.model_source(raw)?;
        let init = match (&raw.init, &source) {
            (None, _) => None,
            (Some(i), ModelSource::Dir(_)) => Some(self.model_init(i)?),
            (Some(_), ModelSource::Hub { .. }) => {
                return self.fail(
                    "model.init",
                    "is only for model.dir (a hub model is downloaded, not created)",
                )
            }
        };
        let max_position_embeddings = match raw.max_position_embeddings {
            Some(n) => Some(self.ranged("model.max_position_embeddings", n)?),
            None => None,
        };
        let layer_backward = raw
            .layer_backward
            .filter(|b| *b != crate::model::spec::LayerBackward::Autograd);
        if layer_backward.is_some() && !raw.gradient_checkpointing {
            return self.fail(
                "model.layer_backward",
                "`by-hand` needs `model.gradient_checkpointing: true` (a layer's backward by hand is how the checkpointed backward recomputes it)",
            );
        }
        Ok(ModelSpec {
            source,
            dtype: raw.dtype,
            gradient_checkpointing: raw.gradient_checkpointing,
            init,
            max_position_embeddings,
            // the defaults, written or not, are the same run and fingerprint
            layer_backward,
            attention_backward: raw
                .attention_backward
                .filter(|b| *b != crate::fused::FlashBackward::Pair),
        })
    }

    /// `model.repo` with its revision, or `model.dir`: exactly one.
    fn model_source(&self, raw: &raw::Model) -> Checked<ModelSource> {
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
        Ok(source)
    }

    /// `model.init`: a model directory created from a config, its tokenizer and warm start.
    fn model_init(&self, i: &raw::ModelInit) -> Checked<ModelInitSpec> {
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
                    steps: self.ranged(&f("steps"), w.steps)?,
                    batch_size: self.ranged(&f("batch_size"), w.batch_size)?,
                    lr: self.learning_rate(&f("lr"), w.lr)?,
                    warmup_steps: self.ranged(&f("warmup_steps"), w.warmup_steps)?,
                    max_response_length: self
                        .ranged(&f("max_response_length"), w.max_response_length)?,
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
        Ok(ModelInitSpec {
            config: i.config.clone(),
            seed: i.seed,
            tokenizer: i.tokenizer.clone(),
            warm_start,
        })
    }

    fn algorithm(&self, raw: &raw::Algorithm) -> Checked<Algorithm> {
        let kind = raw.name;
        let for_kind = format!("for {kind}");
        // The clipping rule checks its own fields.
        let clip = PolicyClip::from_fields(kind, &raw.clip_fields()).map_err(|e| self.at(e))?;
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
            max_prompt_length: self.ranged("data.max_prompt_length", raw.max_prompt_length)?,
            max_response_length: self
                .ranged("data.max_response_length", raw.max_response_length)?,
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
        self.ranged(&n_field, n)?;
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
        if let Some(k) = top_k {
            self.ranged(&format!("{section}.top_k"), k)?;
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
            warmup_steps: self.ranged(&f("warmup_steps"), raw.warmup_steps)?,
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
        let mini = self.ranged("actor.mini_batch_size", raw.mini_batch_size)?;
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
        self.ranged("actor.micro_batch_size", micro)?;
        if !responses.is_multiple_of(micro) {
            return self.fail(
                "actor.micro_batch_size",
                format!(
                    "must divide the responses of a mini-batch (mini_batch_size × rollout.n = {responses}), got {micro}"
                ),
            );
        }
        let epochs = self.ranged("actor.epochs", raw.epochs)?;
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
            batch_size: self.ranged("trainer.batch_size", raw.batch_size)?,
            total_steps: self.ranged("trainer.total_steps", raw.total_steps)?,
            eval_every: self.ranged("trainer.eval_every", raw.eval_every)?,
            checkpoint_every: self.ranged("trainer.checkpoint_every", raw.checkpoint_every)?,
            reward: raw.reward,
            tails_every: self.ranged("trainer.tails_every", raw.tails_every)?,
            difficulty_probe_k: self
                .ranged("trainer.difficulty_probe_k", raw.difficulty_probe_k)?,
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
            self.ranged("eval.limit", limit)?;
        }
        Ok(EvalSpec {
            benchmarks: raw.benchmarks.clone(),
            sampling,
            max_new_tokens: self.ranged("eval.max_new_tokens", raw.max_new_tokens)?,
            prompt_template: raw.prompt_template,
            apply_chat_template: raw.apply_chat_template,
            limit: raw.limit,
        })
    }
}
