//! One RL step, phase by phase (the module doc of [`super`] lists them).

use candle_core::Tensor;

use super::batch::{self, layout, DataCursor, Layout, LOGIT_CHUNK};
use super::metrics::{Phase, PhaseClock, StepMetrics};
use super::outcomes::{Rewards, Rollout};
use super::update::{self, UpdatePlan};
use super::{Result, Trainer};
use crate::algo::advantage;
use crate::algo::method::AdvantageEstimator;
use crate::model::qwen::{Critic, Qwen};
use crate::parallel;
use crate::reward;
use crate::rollout::{self, Completion, SampleKey, SampleRequest, SamplingParams};
use crate::run::tails::Tails;

impl Trainer {
    /// One RL step; returns its metrics and, at tail steps, the r·Â histograms.
    pub fn train_step(
        &mut self,
        step: usize,
        cursor: &mut DataCursor,
    ) -> Result<(StepMetrics, Option<Tails>)> {
        let mut clock = PhaseClock::start(&self.device);
        let sampler = Qwen::new(&self.cfg, &self.policy, true)?;
        let gen = std::sync::Mutex::new(rollout::GenStats::default());
        let rollout = self.rollout(&sampler, step, cursor, &gen)?;
        let generated: usize = rollout.completions.iter().map(|c| c.tokens.len()).sum();
        clock.lap("gen", Some(generated));
        let rewards = self.reward(&rollout)?;
        clock.lap("reward", Some(rollout.completions.len()));
        let mut tails = self.probe(&sampler, step, &rollout, &rewards.correct)?;
        if tails.is_some() {
            clock.lap("probe", None);
        }
        let all = self.layout(&rollout)?;
        let plan = self.update_plan();
        let tokens = all.ids.elem_count();
        let old_log_probs = old_log_probs(&sampler, &all, &plan)?;
        drop(sampler);
        clock.lap("old_log_prob", Some(tokens));
        let old_values = match &self.critic {
            Some(c) => {
                let values = values(&Critic::new(&self.cfg, c, true)?, &all, &plan)?;
                clock.lap("values", Some(tokens));
                Some(values)
            }
            None => None,
        };
        let (advantages, returns) = self.advantages(&rewards.scores, old_values.as_ref(), &all)?;
        clock.lap("adv", None);
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
        clock.lap("update_actor", Some(tokens * plan.epochs));
        let critic = match (&self.critic, &mut self.critic_opt, &returns, &old_values) {
            (Some(params), Some(opt), Some(returns), Some(old_values)) => {
                let cliprange = self.exp.critic.as_ref().map_or(0.5, |c| c.cliprange_value);
                let out = update::critic(
                    &self.cfg, params, opt, &all, old_values, returns, cliprange, &plan, step,
                )?;
                clock.lap("update_critic", Some(tokens * plan.epochs));
                Some((out, returns, old_values))
            }
            _ => None,
        };
        let gen = gen.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut phases = clock.finish();
        phases.0.extend(split_gen(&phases, &gen));
        let metrics = StepMetrics::new(
            step,
            &self.exp,
            &rollout.completions,
            &rewards,
            &actor,
            critic,
            &all.mask,
            phases,
        )?;
        metrics.check_finite()?;
        Ok((metrics, tails.map(|t| t.tails)))
    }

    /// The next batch of prompts and n responses each from the current policy; the engine adds
    /// what its prefills and decode steps took to `stats`.
    fn rollout(
        &mut self,
        sampler: &Qwen,
        step: usize,
        cursor: &mut DataCursor,
        stats: &std::sync::Mutex<rollout::GenStats>,
    ) -> Result<Rollout> {
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
        let completions = self.sample_each(sampler, step, &indices, &prompts, n, 0, Some(stats))?;
        Ok(Rollout {
            indices,
            prompts,
            completions,
        })
    }

    /// `per_prompt` completions of each prompt (problem `indices[i]`, tokens `prompts[i]`), in
    /// that order, sample s of problem p drawn on the stream (seed, step, p, first_stream + s).
    /// The cache as the manifest's `kv_layout` says ([`rollout::KvLayout`]): dense, on a GPU
    /// as many decode at once as its free memory holds at full length
    /// ([`rollout::device_slots`]), each waiting prompt taking a finished one's place; paged,
    /// as many as the pool holds at their real lengths, a group's n responses sharing one
    /// prefill. On the CPU all at once either way, with the same completions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sample_each(
        &self,
        sampler: &Qwen,
        step: usize,
        indices: &[usize],
        prompts: &[Vec<u32>],
        per_prompt: usize,
        first_stream: u64,
        stats: Option<&std::sync::Mutex<rollout::GenStats>>,
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
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut request = self
            .exp
            .kv_layout()
            .request(self.sample_request(), sampler, longest);
        if let Some(stats) = stats {
            request = request.stats(stats);
        }
        Ok(rollout::generate(sampler, &batch, &keys, &request)?)
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
            compared: crate::algo::clip::compared_rules(exp.algorithm.kind, &exp.algorithm.clip),
            temperature: exp.rollout.temperature,
            entropy_coeff: exp.actor.entropy_coeff,
            side_by_side: self.device.is_cpu(),
            kernels: exp.model.train_kernels(&self.device),
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

/// Old log-probs of the responses under the sampling policy, recomputed by micro-batches as
/// verl does.
pub fn old_log_probs(sampler: &Qwen, all: &Layout, plan: &UpdatePlan) -> Result<Tensor> {
    let rows = all.targets.dim(0)?;
    let lps = parallel::map_micro_batches(
        0..rows,
        plan.micro,
        plan.side_by_side,
        |start, len| -> Result<_> {
            let part = all.rows(start, len)?;
            let h = part.response_hidden(sampler)?;
            let (lp, _) =
                sampler.token_log_probs(&h, &part.targets, plan.temperature, LOGIT_CHUNK, false)?;
            Ok(lp)
        },
    );
    Ok(Tensor::cat(
        &lps.into_iter().collect::<Result<Vec<_>>>()?,
        0,
    )?)
}

/// The critic's values of the responses' positions (PPO types), by micro-batches.
pub fn values(critic: &Critic, all: &Layout, plan: &UpdatePlan) -> Result<Tensor> {
    let rows = all.targets.dim(0)?;
    let values = parallel::map_micro_batches(
        0..rows,
        plan.micro,
        plan.side_by_side,
        |start, len| -> Result<_> {
            let part = all.rows(start, len)?;
            Ok(critic.values(&part.response_hidden(&critic.backbone)?)?)
        },
    );
    Ok(Tensor::cat(
        &values.into_iter().collect::<Result<Vec<_>>>()?,
        0,
    )?)
}

/// The rollout's wall-clock split into its prefills and its decode steps, in the proportion of
/// the engine's own times for them ([`rollout::GenStats`]), with their tokens.
fn split_gen(phases: &super::metrics::Phases, gen: &rollout::GenStats) -> Vec<Phase> {
    let Some(wall) = phases.get("gen").map(|p| p.seconds) else {
        return Vec::new();
    };
    let busy = gen.prefill_seconds + gen.decode_seconds;
    let share = if busy > 0.0 {
        gen.prefill_seconds / busy
    } else {
        0.0
    };
    vec![
        Phase {
            name: "gen_prefill",
            seconds: wall * share,
            tokens: Some(gen.prefill_tokens as f64),
            peak_bytes: None,
        },
        Phase {
            name: "gen_decode",
            seconds: wall * (1.0 - share),
            tokens: Some(gen.decode_tokens as f64),
            peak_bytes: None,
        },
    ]
}
