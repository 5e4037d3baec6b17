//! The updates of one step: `epochs` passes over mini-batches of `mini_batch_size` prompts × n
//! responses; each mini-batch is split into micro-batches (side by side on the CPU,
//! [`crate::parallel`]) whose gradients add up to the mini-batch's exactly
//! ([`loss::Aggregation`]), then one global-norm clip and AdamW step. The actor minimises the
//! policy loss ([`loss::policy_loss`]: PPO's ratio clip or ACPO's advantage clip, paper eq. 5)
//! minus the entropy bonus; the critic the clipped value loss. The two sets of parameters are
//! independent, so the critic's passes run after the actor's. `acpo bench train-step` times
//! [`actor`] itself.

use candle_core::Tensor;

use super::batch::{Layout, LOGIT_CHUNK};
use super::outcomes::{ActorOutcome, CriticOutcome, RatioQuantiles, TokenEntropy};
use super::probe::TailRecorder;
use super::{Result, TrainError};
use crate::algo::clip::{self, ComparedRules, Disagreement, PolicyClip, PolicyStats};
use crate::algo::loss::{self, Aggregation};
use crate::algo::method::LossAggMode;
use crate::model::qwen::{Critic, Kernels, Qwen};
use crate::model::{Params, QwenConfig};
use crate::optim::{AdamW, Gradients};
use crate::parallel;
use crate::run::metric;

/// How the mini-batches of a step are cut and what the actor's loss is.
#[derive(Debug, Clone, Copy)]
pub struct UpdatePlan {
    /// Rows (responses) per mini-batch: `mini_batch_size × n`.
    pub mini_rows: usize,
    /// Rows per micro-batch.
    pub micro: usize,
    pub epochs: usize,
    pub agg_mode: LossAggMode,
    /// The response-length horizon of the `seq-mean-token-sum-norm` aggregation.
    pub horizon: usize,
    pub clip: PolicyClip,
    /// The ratio clip and ACPO's, compared on every batch (diagnostics only;
    /// [`clip::compared_rules`]).
    pub compared: ComparedRules,
    /// The sampling temperature the log-probs are taken at.
    pub temperature: f64,
    pub entropy_coeff: f64,
    /// Micro-batches side by side (the CPU); one after another on a GPU.
    pub side_by_side: bool,
    /// Attention and vocabulary-end kernels of the training forward ([`Kernels::for_device`]),
    /// with the manifest's choices of backward ([`crate::model::spec::ModelSpec::train_kernels`]).
    pub kernels: Kernels,
    /// Gradient checkpointing per decoder layer ([`Qwen::checkpointed_backward`]).
    pub checkpointing: bool,
}

impl UpdatePlan {
    /// Each mini-batch's rows and its loss aggregation, in update order (all epochs).
    fn mini_batches(&self, layout: &Layout) -> Result<Vec<(std::ops::Range<usize>, Aggregation)>> {
        let total = layout.targets.dim(0)?;
        let mut out = Vec::new();
        for _ in 0..self.epochs {
            for start in (0..total).step_by(self.mini_rows) {
                let len = self.mini_rows.min(total - start);
                let agg = Aggregation::new(
                    self.agg_mode,
                    &layout.mask.narrow(0, start, len)?,
                    len.div_ceil(self.micro),
                    self.horizon,
                )?;
                out.push((start..start + len, agg));
            }
        }
        Ok(out)
    }
}

/// A micro-batch of the actor's update: its rows laid out, their old log-probs and advantages,
/// and whether this step records its r·Â tails.
struct PolicyMicroBatch {
    part: Layout,
    old: Tensor,
    adv: Tensor,
    record_tails: bool,
}

/// What one policy micro-batch hands back, besides its gradients, to be folded in order into
/// the mini-batch: the policy loss and its statistics, and beside them the rules'
/// disagreement, r and r·Â, and the entropy.
struct MicroOut {
    pg_loss: f64,
    stats: PolicyStats,
    disagreement: Disagreement,
    ratios: TokenRatios,
    entropy: TokenEntropy,
}

/// `(B, R)` values and the response mask as rows.
pub(super) type RowsAndMask = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// r and r·Â of each response token at the moment its gradient is taken: (r, |r·Â|) of every
/// valid token in row order (the step's quantiles), and r·Â with the mask row by row when the
/// step records its tails.
struct TokenRatios {
    pairs: Vec<(f32, f32)>,
    tails: Option<RowsAndMask>,
}

impl TokenRatios {
    fn of(
        log_prob: &Tensor,
        old: &Tensor,
        adv: &Tensor,
        mask: &Tensor,
        tails: bool,
    ) -> Result<Self> {
        let (_, r) = clip::importance_ratio(&log_prob.detach(), old)?;
        let ra = (&r * adv)?.to_vec2::<f32>()?;
        let mask = mask.to_vec2::<f32>()?;
        let pairs = r
            .to_vec2::<f32>()?
            .iter()
            .zip(&ra)
            .zip(&mask)
            .flat_map(|((r, ra), m)| {
                r.iter()
                    .zip(ra)
                    .zip(m)
                    .filter(|(_, &m)| m > 0.0)
                    .map(|((&r, &ra), _)| (r, ra.abs()))
            })
            .collect();
        Ok(TokenRatios {
            pairs,
            tails: tails.then_some((ra, mask)),
        })
    }
}

/// The actor's update of one step: every mini-batch of every epoch, each one AdamW step.
/// With a recorder, the first epoch's r·Â (at the moment each token's gradient is taken) is
/// added to the step's tail histograms.
#[allow(clippy::too_many_arguments)]
pub fn actor(
    cfg: &QwenConfig,
    policy: &Params,
    opt: &mut AdamW,
    layout: &Layout,
    old_log_probs: &Tensor,
    advantages: &Tensor,
    plan: &UpdatePlan,
    step: usize,
    mut tails: Option<&mut TailRecorder>,
) -> Result<ActorOutcome> {
    let mut out = ActorOutcome::default();
    let mut later = Vec::new();
    let per_epoch = layout.targets.dim(0)?.div_ceil(plan.mini_rows);
    for (i, (rows, agg)) in plan.mini_batches(layout)?.into_iter().enumerate() {
        let record = i < per_epoch && tails.is_some();
        let model = Qwen::new(cfg, policy, false)?.with_kernels(plan.kernels);
        crate::device::mark(|| format!("actor mini-batch {i}: the compute copy of the weights"));
        let start = rows.start;
        let mut grads = Gradients::default();
        let micro_outs = micro_batches(rows, plan, &mut grads, |ms, len, sums| {
            let batch = PolicyMicroBatch {
                part: layout.rows(ms, len)?,
                old: old_log_probs.narrow(0, ms, len)?,
                adv: advantages.narrow(0, ms, len)?,
                record_tails: record,
            };
            policy_micro_batch(&model, policy, sums, batch, &agg, plan)
        })?;
        drop(model);
        let mut ratios = Vec::new();
        let mut stats = PolicyStats::default();
        let mut disagreement = Disagreement::default();
        for (k, mut micro) in micro_outs.into_iter().enumerate() {
            ratios.append(&mut micro.ratios.pairs);
            if let (Some((ra, mask)), Some(t)) = (&micro.ratios.tails, tails.as_deref_mut()) {
                t.record(start + k * plan.micro, ra, mask);
            }
            out.entropy.add(micro.entropy);
            out.pg_loss += micro.pg_loss;
            stats = stats.merge(&micro.stats);
            disagreement = disagreement.merge(&micro.disagreement);
        }
        out.grad_norms
            .push(apply_update(opt, &grads, step, metric::ACTOR_GRAD_NORM)?);
        crate::device::mark(|| format!("actor mini-batch {i}: the optimizer step"));
        out.stats = out.stats.merge(&stats);
        out.disagreement = out.disagreement.merge(&disagreement);
        if i == 0 {
            out.first = RatioQuantiles::of(&ratios);
        } else {
            later.extend(ratios);
            out.later_stats = out.later_stats.merge(&stats);
            out.later_disagreement = out.later_disagreement.merge(&disagreement);
        }
    }
    out.later = RatioQuantiles::of(&later);
    Ok(out)
}

/// The micro-batches of `rows`, each through `f(start, len, sums)`, their gradients summed into
/// `grads` in micro-batch order, and their other results in that order. Side by side (the CPU),
/// each micro-batch adds into sums of its own, added to `grads` in order when all are done; one
/// after another (a GPU), each adds straight into `grads` as its backward goes, so one set of
/// gradients is alive besides the sums rather than one per micro-batch. A parameter's sum is
/// the same either way: `((g₁ + g₂) + g₃) …`.
fn micro_batches<R: Send>(
    rows: std::ops::Range<usize>,
    plan: &UpdatePlan,
    grads: &mut Gradients,
    f: impl Fn(usize, usize, &mut Gradients) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let mut out = Vec::new();
    if plan.side_by_side {
        let each = parallel::map_micro_batches(rows, plan.micro, true, |ms, len| {
            let mut own = Gradients::default();
            f(ms, len, &mut own).map(|r| (r, own))
        });
        for (k, micro) in each.into_iter().enumerate() {
            let (r, own) = micro?;
            grads.accumulate(own)?;
            crate::device::mark(|| format!("micro-batch {k}: its gradients added up"));
            out.push(r);
        }
    } else {
        for (k, ms) in rows.clone().step_by(plan.micro).enumerate() {
            out.push(f(ms, plan.micro.min(rows.end - ms), grads)?);
            crate::device::mark(|| format!("micro-batch {k}: its gradients added up"));
        }
    }
    Ok(out)
}

/// Policy loss − entropy bonus of one micro-batch, its gradients added into `sums`.
fn policy_micro_batch(
    model: &Qwen,
    policy: &Params,
    sums: &mut Gradients,
    batch: PolicyMicroBatch,
    agg: &Aggregation,
    plan: &UpdatePlan,
) -> Result<MicroOut> {
    let PolicyMicroBatch {
        part,
        old,
        adv,
        record_tails,
    } = batch;
    let mask = &part.mask;
    // The loss from the final hidden states: what the plain and the checkpointed backward share.
    let head = |model: &Qwen, hidden: &Tensor| -> Result<(Tensor, MicroOut)> {
        let h = part.response_of(hidden)?;
        let (log_prob, entropy) =
            model.token_log_probs(&h, &part.targets, plan.temperature, LOGIT_CHUNK, true)?;
        let entropy = entropy.expect("invariant: entropy was requested");
        // L = agg(ℓ(r, Â)) − c_H·agg(H): the run's clip rule (paper eq. 5 for the -AC
        // variants) minus the entropy bonus
        let pg = loss::policy_loss(&plan.clip, &log_prob, &old, &adv, mask, agg)?;
        let total = loss::minus_entropy_bonus(&pg.loss, &entropy, mask, agg, plan.entropy_coeff)?;
        let kept = MicroOut {
            pg_loss: pg.loss.to_scalar::<f32>()? as f64,
            stats: pg.stats,
            disagreement: plan.compared.disagreement(&log_prob, &old, &adv, mask)?,
            ratios: TokenRatios::of(&log_prob, &old, &adv, mask, record_tails)?,
            entropy: TokenEntropy::of(&entropy, mask)?,
        };
        Ok((total, kept))
    };
    backward(model, &part, plan.checkpointing, head, policy, sums)
}

/// The backward of `head`'s loss through the model on `part`, plain or checkpointed per layer,
/// the gradients of `params` added into `sums` (a checkpointed one's layer by layer).
fn backward<T>(
    model: &Qwen,
    part: &Layout,
    checkpointing: bool,
    head: impl FnOnce(&Qwen, &Tensor) -> Result<(Tensor, T)>,
    params: &Params,
    sums: &mut Gradients,
) -> Result<T> {
    if checkpointing {
        return model.checkpointed_backward(
            &part.ids,
            &part.positions,
            &part.valid,
            head,
            |store| Ok(sums.add_store(params, &store)?),
        );
    }
    let (hidden, _) = model.forward_hidden(&part.ids, &part.positions, &part.valid, None)?;
    let (loss, kept) = head(model, &hidden)?;
    crate::device::mark(|| "forward with a graph, and the loss".into());
    sums.add_store(params, &loss.backward()?)?;
    crate::device::mark(|| "backward".into());
    Ok(kept)
}

/// The critic's update of one step, mini-batch by mini-batch as the actor's.
#[allow(clippy::too_many_arguments)]
pub fn critic(
    cfg: &QwenConfig,
    params: &Params,
    opt: &mut AdamW,
    layout: &Layout,
    old_values: &Tensor,
    returns: &Tensor,
    cliprange: f64,
    plan: &UpdatePlan,
    step: usize,
) -> Result<CriticOutcome> {
    let mut out = CriticOutcome::default();
    for (rows, agg) in plan.mini_batches(layout)? {
        let critic = Critic::new(cfg, params, false)?.with_kernels(plan.kernels);
        crate::device::mark(|| "critic: the compute copy of the weights".into());
        let mut grads = Gradients::default();
        let micro_outs = micro_batches(rows, plan, &mut grads, |ms, len, sums| {
            let part = layout.rows(ms, len)?;
            let head = |_: &Qwen, hidden: &Tensor| -> Result<_> {
                let values = critic.values(&part.response_of(hidden)?)?;
                let v = loss::value_loss(
                    &values,
                    &old_values.narrow(0, ms, len)?,
                    &returns.narrow(0, ms, len)?,
                    &part.mask,
                    cliprange,
                    &agg,
                )?;
                let kept = (v.loss.to_scalar::<f32>()? as f64, v.clipfrac, v.tokens);
                Ok((v.loss, kept))
            };
            backward(
                &critic.backbone,
                &part,
                plan.checkpointing,
                head,
                params,
                sums,
            )
        })?;
        for (loss, clipfrac, tokens) in micro_outs {
            out.vf_loss += loss;
            out.vf_clipped_tokens += clipfrac * tokens;
            out.vf_tokens += tokens;
        }
        drop(critic);
        out.grad_norms
            .push(apply_update(opt, &grads, step, metric::CRITIC_GRAD_NORM)?);
        crate::device::mark(|| "critic: the optimizer step".into());
    }
    Ok(out)
}

/// One optimizer step; a non-finite gradient norm stops the run (nothing was applied).
pub(super) fn apply_update(
    opt: &mut AdamW,
    grads: &Gradients,
    step: usize,
    metric: &'static str,
) -> Result<f64> {
    let report = opt.step(grads)?;
    if !report.applied {
        return Err(TrainError::NonFinite {
            step,
            metric,
            value: report.grad_norm,
        });
    }
    if !report.params_finite {
        return Err(TrainError::NonFiniteParameters { step });
    }
    Ok(report.grad_norm)
}
