//! One RL step, phase by phase (the module doc of [`super`] lists them).

use std::time::Instant;

use candle_core::Tensor;

use super::batch::{self, layout, DataCursor, Layout, LOGIT_CHUNK};
use super::metrics::{StepMetrics, Timings};
use super::update::{self, UpdatePlan};
use super::{Result, Trainer};
use crate::algo::advantage;
use crate::manifest::AdvantageEstimator;
use crate::model::qwen::{Critic, Qwen};
use crate::parallel;
use crate::reward;
use crate::rollout::{self, Completion, SampleKey, SampleRequest, SamplingParams};
use crate::run::tails::Tails;

/// The step's prompts and the responses sampled for them.
pub(super) struct Rollout {
    /// Training-problem index of each prompt.
    pub indices: Vec<usize>,
    /// Token ids of each prompt.
    pub prompts: Vec<Vec<u32>>,
    /// Response r answers prompt r / n.
    pub completions: Vec<Completion>,
}

/// The verifier's judgement of each response and its reward.
pub(super) struct Rewards {
    pub correct: Vec<bool>,
    pub scores: Vec<f32>,
}

impl Trainer {
    /// One RL step; returns its metrics and, at tail steps, the r·Â histograms.
    pub fn train_step(
        &mut self,
        step: usize,
        cursor: &mut DataCursor,
    ) -> Result<(StepMetrics, Option<Tails>)> {
        let t0 = Instant::now();
        let sampler = Qwen::new(&self.cfg, &self.policy, true)?;
        let rollout = self.rollout(&sampler, step, cursor)?;
        let t_rollout = t0.elapsed().as_secs_f64();
        let rewards = self.reward(&rollout)?;
        let mut tails = self.probe(&sampler, step, &rollout, &rewards.correct)?;
        let all = self.layout(&rollout)?;
        let critic = self
            .critic
            .as_ref()
            .map(|c| Critic::new(&self.cfg, c, true))
            .transpose()?;
        let plan = self.update_plan();
        let (old_log_probs, old_values) = old_log_probs(&sampler, critic.as_ref(), &all, &plan)?;
        let (advantages, returns) = self.advantages(&rewards.scores, old_values.as_ref(), &all)?;
        let t_prep = t0.elapsed().as_secs_f64();
        let actor = update::actor(
            &self.cfg,
            &self.policy,
            &mut self.actor_opt,
            &all,
            &old_log_probs,
            &advantages,
            &plan,
            step,
            tails.as_mut(),
        )?;
        let critic = match (&self.critic, &mut self.critic_opt, &returns, &old_values) {
            (Some(params), Some(opt), Some(returns), Some(old_values)) => {
                let cliprange = self.exp.critic.as_ref().map_or(0.5, |c| c.cliprange_value);
                let out = update::critic(
                    &self.cfg, params, opt, &all, old_values, returns, cliprange, &plan, step,
                )?;
                Some((out, returns, old_values))
            }
            _ => None,
        };
        let timings = Timings::since(t0, t_rollout, t_prep);
        let metrics = StepMetrics::new(
            step,
            &self.exp,
            &rollout.completions,
            &rewards,
            &actor,
            critic,
            &all.mask,
            timings,
        )?;
        metrics.check_finite()?;
        Ok((metrics, tails.map(|t| t.tails)))
    }

    /// The next batch of prompts and n responses each from the current policy.
    fn rollout(&mut self, sampler: &Qwen, step: usize, cursor: &mut DataCursor) -> Result<Rollout> {
        let (n, seed) = (self.exp.rollout.n, self.exp.seed);
        let indices = batch::next_batch(
            cursor,
            self.exp.trainer.batch_size,
            self.problems.len(),
            seed,
            self.exp.data.shuffle,
        );
        let prompts = indices
            .iter()
            .map(|&i| self.prompt(i))
            .collect::<Result<Vec<_>>>()?;
        let completions = self.sample_each(sampler, step, &indices, &prompts, n, 0)?;
        Ok(Rollout {
            indices,
            prompts,
            completions,
        })
    }

    /// `per_prompt` completions of each prompt (problem `indices[i]`, tokens `prompts[i]`), in
    /// that order, sample s of problem p drawn on the stream (seed, step, p, first_stream + s).
    pub(super) fn sample_each(
        &self,
        sampler: &Qwen,
        step: usize,
        indices: &[usize],
        prompts: &[Vec<u32>],
        per_prompt: usize,
        first_stream: u64,
    ) -> Result<Vec<Completion>> {
        let seed = self.exp.seed;
        let batch: Vec<Vec<u32>> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), per_prompt))
            .collect();
        let keys: Vec<SampleKey> = indices
            .iter()
            .flat_map(|&p| {
                (0..per_prompt as u64).map(move |s| [seed, step as u64, p as u64, first_stream + s])
            })
            .collect();
        Ok(rollout::generate(
            sampler,
            &batch,
            &keys,
            &self.sample_request(),
        )?)
    }

    /// Whether each completion is correct: completion r answers problem `indices[r / per_prompt]`.
    pub(super) fn judge_all(
        &self,
        indices: &[usize],
        completions: &[Completion],
        per_prompt: usize,
    ) -> Result<Vec<bool>> {
        completions
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let gold = &self.problems[indices[r / per_prompt]].answer;
                Ok(reward::judge(&self.tokenizer, &c.tokens, gold)?
                    .verdict
                    .correct)
            })
            .collect()
    }

    /// How rollouts (and the probe) sample: the manifest's rollout settings, up to the
    /// response length, stopping at EOS.
    pub(super) fn sample_request(&self) -> SampleRequest<'static> {
        let r = &self.exp.rollout;
        SampleRequest::new(SamplingParams {
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            max_new_tokens: self.exp.data.max_response_length,
        })
        .eos(self.eos.clone())
        .pad(self.tokenizer.pad_id())
    }

    /// Each response judged by the verifier against its prompt's gold answer, and scored.
    fn reward(&self, rollout: &Rollout) -> Result<Rewards> {
        let correct = self.judge_all(&rollout.indices, &rollout.completions, self.exp.rollout.n)?;
        let kind = self.exp.trainer.reward;
        let scores = correct.iter().map(|&ok| reward::score(kind, ok)).collect();
        Ok(Rewards { correct, scores })
    }

    /// Prompts and responses laid out for the model.
    fn layout(&self, rollout: &Rollout) -> Result<Layout> {
        let n = self.exp.rollout.n;
        let prompts: Vec<&Vec<u32>> = rollout
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p, n))
            .collect();
        let responses: Vec<&Vec<u32>> = rollout.completions.iter().map(|c| &c.tokens).collect();
        layout(&prompts, &responses, self.tokenizer.pad_id(), &self.device)
    }

    /// How this run's updates are cut into mini- and micro-batches, and the actor's loss.
    pub(super) fn update_plan(&self) -> UpdatePlan {
        let exp = &self.exp;
        UpdatePlan {
            mini_rows: exp.actor.mini_batch_size * exp.rollout.n,
            micro: exp.actor.micro_batch_size,
            epochs: exp.actor.epochs,
            agg_mode: exp.algorithm.loss_agg_mode,
            horizon: exp.data.max_response_length,
            clip: exp.algorithm.clip,
            compared: crate::algo::loss::compared_rules(exp.algorithm.kind, &exp.algorithm.clip),
            temperature: exp.rollout.temperature,
            entropy_coeff: exp.actor.entropy_coeff,
            side_by_side: self.device.is_cpu(),
            kernels: crate::model::qwen::Kernels::for_device(&self.device),
            checkpointing: exp.model.gradient_checkpointing,
        }
    }

    /// Advantages (GAE with the critic's values, or group-normalised) and, for GAE, returns.
    fn advantages(
        &self,
        scores: &[f32],
        old_values: Option<&Tensor>,
        all: &Layout,
    ) -> Result<(Tensor, Option<Tensor>)> {
        Ok(match self.exp.algorithm.advantage {
            AdvantageEstimator::Gae { gamma, lam, whiten } => {
                let values = old_values.expect("invariant: PPO types have a critic");
                let token_rewards = advantage::outcome_to_token_rewards(scores, &all.mask)?;
                let out = advantage::gae(&token_rewards, values, &all.mask, gamma, lam, whiten)?;
                (out.advantages, Some(out.returns))
            }
            AdvantageEstimator::GroupNormalized { norm_by_std } => {
                let n = self.exp.rollout.n;
                let group: Vec<usize> = (0..scores.len()).map(|k| k / n).collect();
                (
                    advantage::grpo(scores, &group, &all.mask, norm_by_std)?,
                    None,
                )
            }
        })
    }
}

/// Old log-probs of the responses under the sampling policy, and the critic's values, recomputed
/// by micro-batches as verl does.
pub fn old_log_probs(
    sampler: &Qwen,
    critic: Option<&Critic>,
    all: &Layout,
    plan: &UpdatePlan,
) -> Result<(Tensor, Option<Tensor>)> {
    let rows = all.targets.dim(0)?;
    let olds = parallel::map_micro_batches(
        0..rows,
        plan.micro,
        plan.side_by_side,
        |start, len| -> Result<_> {
            let part = all.rows(start, len)?;
            let h = part.response_hidden(sampler)?;
            let (lp, _) =
                sampler.token_log_probs(&h, &part.targets, plan.temperature, LOGIT_CHUNK, false)?;
            let values = match critic {
                Some(c) => Some(c.values(&part.response_hidden(&c.backbone)?)?),
                None => None,
            };
            Ok((lp, values))
        },
    );
    let (mut lps, mut values) = (Vec::new(), Vec::new());
    for r in olds {
        let (lp, v) = r?;
        lps.push(lp);
        values.extend(v);
    }
    let values = if values.is_empty() {
        None
    } else {
        Some(Tensor::cat(&values, 0)?)
    };
    Ok((Tensor::cat(&lps, 0)?, values))
}
