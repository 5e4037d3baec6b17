//! A step's metrics as a typed value, and the one place they get verl's names
//! (`actor/pg_clipfrac`, `critic/vf_loss`, ...; ours where verl has none, e.g.
//! `actor/acpo_clipfrac`), so runs compare with verl's directly.

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{DType, Tensor};

use super::outcomes::{ActorOutcome, CriticOutcome, RatioQuantiles, Rewards};
use super::{Result, TrainError};
use crate::algo::clip::{Disagreement, PolicyClip, PolicyStats};
use crate::manifest::Experiment;
use crate::rollout::{Completion, FinishReason};
use crate::run::metric;

/// A step's phases in the order they ran, to find where a step's time and memory go:
/// wall-clock seconds (never part of a
/// result's numbers), the tokens each processed, and on CUDA the device's peak memory during
/// each. A phase's metrics take verl's names where verl has one: `timing_s/gen`,
/// `timing_s/reward`, `timing_s/old_log_prob`, `timing_s/values`, `timing_s/adv`,
/// `timing_s/update_actor`, `timing_s/update_critic`, `timing_s/testing`,
/// `timing_s/save_checkpoint`, `timing_s/step`; ours: `timing_s/gen_prefill` and
/// `timing_s/gen_decode` (the rollout's two parts), `timing_s/probe` (the PPO types' difficulty
/// probe), `perf/tokens_per_s/<phase>` and `perf/max_memory_allocated_gb/<phase>` (verl has the
/// step's alone).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Phases(pub Vec<Phase>);

/// One phase of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    pub seconds: f64,
    /// Tokens the phase processed (generated, scored, trained on), where that means something.
    pub tokens: Option<f64>,
    /// The most device memory in use during the phase (CUDA only).
    pub peak_bytes: Option<u64>,
}

impl Phases {
    /// The phase called `name`, if it ran.
    pub fn get(&self, name: &str) -> Option<&Phase> {
        self.0.iter().find(|p| p.name == name)
    }

    /// Every phase's metrics, verl's names where verl has one.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for p in &self.0 {
            out.push((format!("timing_s/{}", p.name), p.seconds));
            if let Some(t) = p.tokens.filter(|_| p.seconds > 0.0) {
                out.push((format!("perf/tokens_per_s/{}", p.name), t / p.seconds));
            }
            if let Some(b) = p.peak_bytes {
                out.push((
                    format!("perf/max_memory_allocated_gb/{}", p.name),
                    b as f64 / 1e9,
                ));
            }
        }
        out
    }
}

/// Times a step's phases one after the other: each [`PhaseClock::lap`] closes the phase that
/// ran since the previous one. On CUDA it waits for the device first (the work of a phase is
/// queued, not done, when its last call returns), and reads and resets the allocator's
/// high-water mark.
pub struct PhaseClock {
    meter: Option<crate::device::PeakMeter>,
    device: candle_core::Device,
    start: Instant,
    last: Instant,
    phases: Phases,
}

impl PhaseClock {
    pub fn start(device: &candle_core::Device) -> PhaseClock {
        let meter = device
            .is_cuda()
            .then(|| crate::device::PeakMeter::new(device));
        if let Some(m) = &meter {
            m.reset();
        }
        let now = Instant::now();
        PhaseClock {
            meter,
            device: device.clone(),
            start: now,
            last: now,
            phases: Phases::default(),
        }
    }

    /// Closes phase `name`, which processed `tokens`.
    pub fn lap(&mut self, name: &'static str, tokens: Option<usize>) {
        if self.device.is_cuda() {
            let _ = self.device.synchronize();
        }
        let now = Instant::now();
        let peak_bytes = self.meter.as_ref().and_then(|m| {
            let peak = m.peak();
            m.reset();
            peak
        });
        self.phases.0.push(Phase {
            name,
            seconds: now.duration_since(self.last).as_secs_f64(),
            tokens: tokens.map(|t| t as f64),
            peak_bytes,
        });
        self.last = now;
    }

    /// Adds a phase measured apart (the rollout's prefill and decode, out of the engine).
    pub fn add(&mut self, phase: Phase) {
        self.phases.0.push(phase);
    }

    /// The phases closed so far.
    pub fn phases(&self) -> &Phases {
        &self.phases
    }

    /// The phases so far and the whole step as `step`.
    pub fn finish(mut self) -> Phases {
        let peak = self.phases.0.iter().filter_map(|p| p.peak_bytes).max();
        self.phases.0.push(Phase {
            name: "step",
            seconds: self.start.elapsed().as_secs_f64(),
            tokens: None,
            peak_bytes: peak,
        });
        self.phases
    }
}

/// The critic's part of a step's metrics (PPO types).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CriticMetrics {
    pub vf_loss: f64,
    pub vf_clipfrac: f64,
    pub grad_norm: f64,
    /// 1 − Var(R − V)/Var(R) over valid tokens.
    pub explained_var: f64,
}

/// What one step reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetrics {
    pub step: usize,
    pub score_mean: f64,
    pub acc_mean: f64,
    pub response_length_mean: f64,
    pub response_length_max: f64,
    /// Share of responses cut at the length limit.
    pub response_length_clip_ratio: f64,
    /// Mean over the step's mini-batches.
    pub pg_loss: f64,
    pub policy: PolicyStats,
    /// Which clip trained: names the clip fractions reported.
    pub clip: PolicyClip,
    /// Where the ratio clip and ACPO's disagree on the step's tokens: the regime where the
    /// rules differ at all.
    pub disagreement: Disagreement,
    pub entropy: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub critic: Option<CriticMetrics>,
    pub phases: Phases,
    pub tokens_per_s: f64,
    /// r and |r·Â| in the first mini-batch and in the later ones.
    pub first: Option<RatioQuantiles>,
    pub later: Option<RatioQuantiles>,
    /// The clip statistics of the later mini-batches alone, and the rules' disagreement there.
    pub later_policy: PolicyStats,
    pub later_disagreement: Disagreement,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

impl StepMetrics {
    /// The metrics of a step from what its phases returned.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        step: usize,
        exp: &Experiment,
        completions: &[Completion],
        rewards: &Rewards,
        actor: &ActorOutcome,
        critic: Option<(CriticOutcome, &Tensor, &Tensor)>,
        mask: &Tensor,
        phases: Phases,
    ) -> Result<StepMetrics> {
        let updates = actor.updates().max(1) as f64;
        let lengths: Vec<f64> = completions.iter().map(|c| c.tokens.len() as f64).collect();
        let flag = |b: bool| f64::from(u8::from(b));
        let critic = match critic {
            None => None,
            Some((c, returns, old_values)) => Some(CriticMetrics {
                vf_loss: c.vf_loss / updates,
                vf_clipfrac: c.vf_clipped_tokens / c.vf_tokens.max(1.0),
                grad_norm: mean(&c.grad_norms),
                explained_var: explained_variance(old_values, returns, mask)?,
            }),
        };
        Ok(StepMetrics {
            step,
            score_mean: mean(&rewards.scores.iter().map(|&s| s as f64).collect::<Vec<_>>()),
            acc_mean: mean(&rewards.correct.iter().map(|&c| flag(c)).collect::<Vec<_>>()),
            response_length_mean: mean(&lengths),
            response_length_max: lengths.iter().copied().fold(0.0, f64::max),
            response_length_clip_ratio: mean(
                &completions
                    .iter()
                    .map(|c| flag(c.finish == FinishReason::Length))
                    .collect::<Vec<_>>(),
            ),
            pg_loss: actor.pg_loss / updates,
            policy: actor.stats,
            clip: exp.algorithm.clip,
            disagreement: actor.disagreement,
            entropy: actor.entropy.mean(),
            grad_norm: mean(&actor.grad_norms),
            lr: exp.actor.optim.lr,
            critic,
            tokens_per_s: lengths.iter().sum::<f64>()
                / phases.get("step").map_or(0.0, |p| p.seconds).max(1e-9),
            phases,
            first: actor.first,
            later: actor.later,
            later_policy: actor.later_stats,
            later_disagreement: actor.later_disagreement,
        })
    }

    /// Every metric under its name.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let p = &self.policy;
        let mut out = vec![
            (metric::STEP, self.step as f64),
            ("critic/score/mean", self.score_mean),
            (metric::ACC, self.acc_mean),
            (metric::RESPONSE_LENGTH, self.response_length_mean),
            ("response_length/max", self.response_length_max),
            (
                "response_length/clip_ratio",
                self.response_length_clip_ratio,
            ),
            (metric::PG_LOSS, self.pg_loss),
            ("actor/ppo_kl", p.ppo_kl),
            ("actor/ratio_adv_mean", p.ratio_adv_mean),
            ("actor/ratio_adv_abs_max", p.ratio_adv_abs_max),
            // both rules on the same tokens, whichever trains, so runs of either compare
            (
                "actor/clip_disagree_ratio_zeroes",
                self.disagreement.ratio_zeroes,
            ),
            (
                "actor/clip_disagree_acpo_zeroes",
                self.disagreement.acpo_zeroes,
            ),
        ];
        out.extend(self.clip.clip_metrics(p));
        // the later, off-policy mini-batches apart: the ratio clip acts mostly there
        if self.later_policy.tokens > 0.0 {
            let l = &self.later_disagreement;
            out.push(self.clip.later_clip_metric(&self.later_policy));
            out.push(("actor/clip_disagree_ratio_zeroes_later", l.ratio_zeroes));
            out.push(("actor/clip_disagree_acpo_zeroes_later", l.acpo_zeroes));
        }
        for (q, names) in [
            (
                self.first,
                [
                    "actor/ratio_p01_first",
                    "actor/ratio_p99_first",
                    "actor/ratio_adv_abs_p99_first",
                ],
            ),
            (
                self.later,
                [
                    "actor/ratio_p01_later",
                    "actor/ratio_p99_later",
                    "actor/ratio_adv_abs_p99_later",
                ],
            ),
        ] {
            if let Some(q) = q {
                out.extend(
                    names
                        .into_iter()
                        .zip([q.ratio_p01, q.ratio_p99, q.ratio_adv_abs_p99]),
                );
            }
        }
        out.extend([
            (metric::ENTROPY, self.entropy),
            (metric::ACTOR_GRAD_NORM, self.grad_norm),
            ("actor/lr", self.lr),
        ]);
        if let Some(c) = &self.critic {
            out.extend([
                ("critic/vf_loss", c.vf_loss),
                ("critic/vf_clipfrac", c.vf_clipfrac),
                (metric::CRITIC_GRAD_NORM, c.grad_norm),
                ("critic/vf_explained_var", c.explained_var),
            ]);
        }
        out.push(("perf/tokens_per_s", self.tokens_per_s));
        out
    }

    /// The metrics line of `metrics.jsonl`: the named metrics and every phase's.
    pub fn to_verl(&self) -> BTreeMap<String, f64> {
        self.named()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(self.phases.metrics())
            .collect()
    }

    /// A non-finite metric (timings aside) stops the run before anything of the step is written.
    pub fn check_finite(&self) -> Result<()> {
        match self
            .named()
            .into_iter()
            .find(|(k, v)| !v.is_finite() && !k.starts_with("timing"))
        {
            Some((metric, value)) => Err(TrainError::NonFinite {
                step: self.step,
                metric,
                value,
            }),
            None => Ok(()),
        }
    }
}

/// 1 − Var(R − V)/Var(R) over valid tokens (verl's `critic/vf_explained_var`).
fn explained_variance(values: &Tensor, returns: &Tensor, mask: &Tensor) -> Result<f64> {
    let flat = |t: &Tensor| -> Result<Vec<f32>> {
        Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    };
    let (v, r, m) = (flat(values)?, flat(returns)?, flat(mask)?);
    let pairs: Vec<(f64, f64)> = v
        .iter()
        .zip(&r)
        .zip(&m)
        .filter(|(_, k)| **k != 0.0)
        .map(|((a, b), _)| (*a as f64, *b as f64))
        .collect();
    let var = |xs: &[f64]| {
        let mu = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        xs.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / xs.len().max(1) as f64
    };
    let rs: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let diff: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
    let vr = var(&rs);
    Ok(if vr > 0.0 { 1.0 - var(&diff) / vr } else { 0.0 })
}

/// One line describing a step, for logs and progress displays.
pub fn step_line(step: usize, total: usize, m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    format!(
        "step {step}/{total}  acc {:.3}  len {:.1}  pg_loss {:+.4}  entropy {:.3}  grad_norm {:.3}  {:.1}s",
        g(metric::ACC),
        g(metric::RESPONSE_LENGTH),
        g(metric::PG_LOSS),
        g(metric::ENTROPY),
        g(metric::ACTOR_GRAD_NORM),
        g(metric::STEP_SECONDS)
    )
}
