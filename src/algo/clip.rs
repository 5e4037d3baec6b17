//! The clipping rules of the policy loss, each one's whole life in one place (verl's policy-loss
//! registry, in Rust terms): PPO's ratio clip, ACPO's advantage clip (paper eq. 5), and the
//! family the paper's related work names: CISPO, GSPO and the unclipped importance-sampling
//! control. A rule is a [`PolicyClip`] variant (a baseline's is selected in a manifest by a
//! [`PolicyLossMode`]); for each one, in an exhaustive `match`:
//!
//! - the manifest fields it reads and their checks ([`PolicyClip::from_fields`]);
//! - its per-token objective and gradient mask ([`PolicyClip::terms`]), by its own function
//!   ([`ppo_clip`], [`acpo_clip`], [`cispo_loss`], [`gspo_loss`]);
//! - which tokens keep their gradient, as Proposition 1 counts them ([`PolicyClip::retains`]);
//! - the clip fractions it reports, under their metric names ([`PolicyClip::clip_metrics`],
//!   [`PolicyClip::own_clip_metric`]);
//! - how verl runs it: its `loss_mode` ([`PolicyClip::verl_loss_mode`]) and the keys it sets
//!   ([`PolicyClip::verl_keys`]);
//! - how it is written (`Display`) and its family in the figures ([`PolicyClip::family`]);
//! - the pair of rules the regime diagnostic compares beside it ([`compared_rules`]).
//!
//! A new variant fails to compile until each of these handles it; no code of the product outside
//! this file matches on a variant (`tests/it/layout.rs` checks it). [`super::loss::policy_loss`] turns a
//! rule's terms into the loss.
//!
//! A clipped objective is written as `keep · (unclipped term) + (1 − keep) · detach(clipped
//! value)` where `keep` is 1 exactly where the clipped objective still has a gradient. The value
//! is the same as the textbook min/max/clamp form, but the gradient is exact and explicit:
//! autograd of `min`/`max`/`clamp` splits the gradient at ties, and "exactly zero outside
//! [−α, α]" is the property ACPO is about.

use std::fmt;

use candle_core::{DType, Result, Tensor, D};
use serde::{Deserialize, Serialize};

use super::method::{short, AlgorithmKind};
use super::{check_same_shape, masked_mean, zero_padding};
use crate::field::{self, Checked};

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

/// A baseline's policy loss (`algorithm.policy_loss`, verl's `actor.policy_loss.loss_mode`):
/// the ratio clip of PPO (`vanilla`, the default), CISPO, GSPO, or no clip at all
/// (an unclipped importance-sampling control, not a verl mode). The -AC variants always clip
/// r·Â. Each selects a [`PolicyClip`] ([`PolicyClip::from_fields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLossMode {
    Vanilla,
    Cispo,
    Gspo,
    Unclipped,
}

/// The manifest fields a clipping rule reads (`algorithm.*`), as written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClipFields {
    pub policy_loss: Option<PolicyLossMode>,
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    pub clip_ratio_c: Option<f64>,
    pub alpha: Option<f64>,
}

const EPS_LOW: &str = "algorithm.clip_ratio_low";
const EPS_HIGH: &str = "algorithm.clip_ratio_high";
const DUAL_CLIP: &str = "algorithm.clip_ratio_c";
const ALPHA: &str = "algorithm.alpha";

impl ClipFields {
    /// The ratio bounds (ε_low, ε_high) a rule needs, for `kind`. The ratio clip and GSPO need
    /// 1 − ε_low > 0; CISPO's lower bound may be switched off (`lower_bound_off`), as its
    /// authors and verl's example do (clip_ratio_low 10: a weight bound below 0 never binds).
    fn ratio_bounds(&self, kind: AlgorithmKind, lower_bound_off: bool) -> Checked<(f64, f64)> {
        let for_kind = format!("for {kind}");
        let eps_low = field::required(EPS_LOW, self.clip_ratio_low, &for_kind)?;
        let eps_high = field::required(EPS_HIGH, self.clip_ratio_high, &for_kind)?;
        let (low_max, low_range) = if lower_bound_off {
            (f64::MAX, "[0, inf)")
        } else {
            (1.0, "[0, 1]")
        };
        let eps_low = field::finite_in(EPS_LOW, eps_low, 0.0, low_max, low_range)?;
        let eps_high = field::finite_in(EPS_HIGH, eps_high, 0.0, f64::MAX, "[0, inf)")?;
        if !lower_bound_off && eps_low >= 1.0 {
            return field::fail(
                EPS_LOW,
                format!(
                    "must be < 1 so the lower ratio bound 1 - eps stays positive, got {eps_low}"
                ),
            );
        }
        Ok((eps_low, eps_high))
    }
}

impl PolicyClip {
    /// The rule a manifest's `algorithm` section selects, its fields checked: ACPO's α for the
    /// -AC variants (paper eq. 5), else the baseline's `policy_loss` (vanilla when unset) with
    /// its ratio bounds. A field the rule does not read must be unset; the first field broken
    /// is the error.
    pub fn from_fields(kind: AlgorithmKind, f: &ClipFields) -> Checked<PolicyClip> {
        if kind.is_advantage_clipped() {
            let not_ratio = format!("for {kind}: -AC variants clip r·A, not the ratio (use alpha)");
            field::forbidden(EPS_LOW, &f.clip_ratio_low, &not_ratio)?;
            field::forbidden(EPS_HIGH, &f.clip_ratio_high, &not_ratio)?;
            field::forbidden(DUAL_CLIP, &f.clip_ratio_c, &not_ratio)?;
            let always = format!("for {kind}: -AC variants always clip r·A (paper eq. 5)");
            field::forbidden("algorithm.policy_loss", &f.policy_loss, &always)?;
            let alpha = field::required(ALPHA, f.alpha, &format!("for {kind}"))?;
            return Ok(PolicyClip::Advantage {
                alpha: field::strictly_positive(ALPHA, alpha)?,
            });
        }
        let only_ac = format!(
            "for {kind}: alpha is the advantage-clipping threshold of the -AC variants only"
        );
        field::forbidden(ALPHA, &f.alpha, &only_ac)?;
        let no_dual_clip = "with policy_loss: cispo or gspo (verl's have no dual clip)";
        Ok(match f.policy_loss.unwrap_or(PolicyLossMode::Vanilla) {
            PolicyLossMode::Vanilla => {
                let (eps_low, eps_high) = f.ratio_bounds(kind, false)?;
                let c = field::required(DUAL_CLIP, f.clip_ratio_c, &format!("for {kind}"))?;
                if !c.is_finite() || c <= 1.0 {
                    return field::fail(
                        DUAL_CLIP,
                        format!("the dual-clip constant must be a finite number > 1, got {c}"),
                    );
                }
                PolicyClip::Ratio {
                    eps_low,
                    eps_high,
                    dual_clip_c: c,
                }
            }
            PolicyLossMode::Cispo => {
                field::forbidden(DUAL_CLIP, &f.clip_ratio_c, no_dual_clip)?;
                let (eps_low, eps_high) = f.ratio_bounds(kind, true)?;
                PolicyClip::Cispo { eps_low, eps_high }
            }
            PolicyLossMode::Gspo => {
                field::forbidden(DUAL_CLIP, &f.clip_ratio_c, no_dual_clip)?;
                let (eps_low, eps_high) = f.ratio_bounds(kind, false)?;
                PolicyClip::Gspo { eps_low, eps_high }
            }
            PolicyLossMode::Unclipped => {
                let why = "with policy_loss: unclipped (nothing is clipped)";
                field::forbidden(EPS_LOW, &f.clip_ratio_low, why)?;
                field::forbidden(EPS_HIGH, &f.clip_ratio_high, why)?;
                field::forbidden(DUAL_CLIP, &f.clip_ratio_c, why)?;
                PolicyClip::Unclipped
            }
        })
    }

    /// verl's `actor.policy_loss.loss_mode` for the rule: the plug-in's `acpo` for ACPO's clip
    /// (python/, registered in verl by the package), verl's own for the others; where verl has
    /// no such loss, why (`acpo export verl` lists it as unsupported).
    pub fn verl_loss_mode(&self) -> std::result::Result<&'static str, &'static str> {
        match self {
            PolicyClip::Ratio { .. } => Ok("vanilla"),
            PolicyClip::Advantage { .. } => Ok("acpo"),
            PolicyClip::Cispo { .. } => Ok("cispo"),
            PolicyClip::Gspo { .. } => Ok("gspo"),
            PolicyClip::Unclipped => {
                Err("verl has no unclipped policy loss; the launch would clip the ratio")
            }
        }
    }

    /// The keys the rule sets in verl's actor config besides its loss mode, each from the
    /// manifest field that holds its value: the ratio bounds verl's own losses read, or the
    /// plug-in's config class and the α it carries.
    pub fn verl_keys(&self) -> Vec<VerlKey> {
        let number = |key, value, from| VerlKey {
            key,
            value: VerlValue::Number(value),
            from,
            added: false,
        };
        let bounds = |eps_low, eps_high| {
            vec![
                number("clip_ratio_low", eps_low, EPS_LOW),
                number("clip_ratio_high", eps_high, EPS_HIGH),
            ]
        };
        match *self {
            PolicyClip::Ratio {
                eps_low,
                eps_high,
                dual_clip_c,
            } => {
                let mut keys = bounds(eps_low, eps_high);
                keys.push(number("clip_ratio_c", dual_clip_c, DUAL_CLIP));
                keys
            }
            // The plug-in's loss reads α from its own config class, which verl's schema lacks.
            PolicyClip::Advantage { alpha } => vec![
                VerlKey {
                    key: "policy_loss._target_",
                    value: VerlValue::Text("acpo.verl.AcpoPolicyLossConfig"),
                    from: "algorithm.name",
                    added: false,
                },
                VerlKey {
                    key: "policy_loss.alpha",
                    value: VerlValue::Number(alpha),
                    from: ALPHA,
                    added: true,
                },
            ],
            PolicyClip::Cispo { eps_low, eps_high } | PolicyClip::Gspo { eps_low, eps_high } => {
                bounds(eps_low, eps_high)
            }
            PolicyClip::Unclipped => Vec::new(),
        }
    }

    /// Whether the rule keeps the gradient of a token with ratio `r` and advantage `a`, as
    /// Proposition 1 counts it: the ratio clips retain it unless r left the trust region on
    /// the side Â pushes (Â > 0 needs r ≤ 1+ε_high, Â < 0 needs 1−ε_low ≤ r, and r ≤ c under
    /// the dual clip; Â = 0 has no gradient and counts as not retained), ACPO's where
    /// |r·Â| ≤ α (paper eq. 5); CISPO and no clip keep every token. For GSPO, `r` is the
    /// sequence's ratio.
    pub fn retains(&self, r: f64, a: f64) -> bool {
        let ratio_clip = |eps_low: f64, eps_high: f64, c: f64| {
            (a > 0.0 && r <= 1.0 + eps_high) || (a < 0.0 && r >= 1.0 - eps_low && r <= c)
        };
        match *self {
            PolicyClip::Ratio {
                eps_low,
                eps_high,
                dual_clip_c,
            } => ratio_clip(eps_low, eps_high, dual_clip_c),
            PolicyClip::Advantage { alpha } => (r * a).abs() <= alpha,
            PolicyClip::Gspo { eps_low, eps_high } => ratio_clip(eps_low, eps_high, f64::INFINITY),
            PolicyClip::Cispo { .. } | PolicyClip::Unclipped => true,
        }
    }

    /// The rule's family, as the figures tell rules apart.
    pub fn family(&self) -> ClipFamily {
        match *self {
            PolicyClip::Ratio { .. } => ClipFamily::Ratio,
            PolicyClip::Advantage { alpha } => ClipFamily::Advantage { alpha },
            PolicyClip::Cispo { .. } => ClipFamily::Related(0),
            PolicyClip::Gspo { .. } => ClipFamily::Related(1),
            PolicyClip::Unclipped => ClipFamily::Unclipped,
        }
    }

    /// ACPO's threshold α, for the advantage clip.
    pub fn alpha(&self) -> Option<f64> {
        match self.family() {
            ClipFamily::Advantage { alpha } => Some(alpha),
            _ => None,
        }
    }
}

/// What a rule is to the figures (the sweeps' colours): ACPO's advantage clip, told apart by
/// α; the ratio clip of the run's method; no clip; or another rule of the related work,
/// numbered in order (CISPO 0, GSPO 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClipFamily {
    Advantage { alpha: f64 },
    Ratio,
    Unclipped,
    Related(usize),
}

/// A value a rule sets in verl's config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VerlValue {
    Text(&'static str),
    Number(f64),
}

/// A key a rule sets in verl's actor config (`actor_rollout_ref.actor.<key>`), and the
/// manifest field it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerlKey {
    pub key: &'static str,
    pub value: VerlValue,
    pub from: &'static str,
    /// verl's schema lacks the key (Hydra then writes it `+key`).
    pub added: bool,
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

/// Token-level statistics of a policy-loss call, as masked means over its valid tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyStats {
    /// Valid tokens these means are over (the weight for merging micro-batches).
    pub tokens: f64,
    /// Mean of log π_old − log π (after the ±20 clamp), verl's `ppo_kl`.
    pub ppo_kl: f64,
    /// Ratio clip: fraction where the clipped term is active (PPO types; 0 for -AC).
    pub pg_clipfrac: f64,
    /// Ratio clip: fraction where the dual clip (Â < 0) is active (PPO types; 0 for -AC).
    pub pg_clipfrac_lower: f64,
    /// ACPO: fraction with r·Â > α (0 for ratio clipping).
    pub acpo_clipfrac_upper: f64,
    /// ACPO: fraction with r·Â < −α (0 for ratio clipping).
    pub acpo_clipfrac_lower: f64,
    /// Mean of r·Â over valid tokens.
    pub ratio_adv_mean: f64,
    /// Max of |r·Â| over valid tokens.
    pub ratio_adv_abs_max: f64,
}

impl PolicyStats {
    /// Token-weighted combination of micro-batch statistics (max for the abs-max).
    pub fn merge(&self, other: &PolicyStats) -> PolicyStats {
        let n = self.tokens + other.tokens;
        if n == 0.0 {
            return PolicyStats::default();
        }
        let w = |a: f64, b: f64| (a * self.tokens + b * other.tokens) / n;
        PolicyStats {
            tokens: n,
            ppo_kl: w(self.ppo_kl, other.ppo_kl),
            pg_clipfrac: w(self.pg_clipfrac, other.pg_clipfrac),
            pg_clipfrac_lower: w(self.pg_clipfrac_lower, other.pg_clipfrac_lower),
            acpo_clipfrac_upper: w(self.acpo_clipfrac_upper, other.acpo_clipfrac_upper),
            acpo_clipfrac_lower: w(self.acpo_clipfrac_lower, other.acpo_clipfrac_lower),
            ratio_adv_mean: w(self.ratio_adv_mean, other.ratio_adv_mean),
            ratio_adv_abs_max: self.ratio_adv_abs_max.max(other.ratio_adv_abs_max),
        }
    }
}

const PG_CLIPFRAC: &str = "actor/pg_clipfrac";
const ACPO_CLIPFRAC: &str = "actor/acpo_clipfrac";

impl PolicyClip {
    /// The clip fractions the rule reports, under verl's names where verl has them: the ratio
    /// clip's family `actor/pg_clipfrac` and `actor/pg_clipfrac_lower`, ACPO's the share above
    /// α, below −α and both.
    pub fn clip_metrics(&self, s: &PolicyStats) -> Vec<(&'static str, f64)> {
        match self {
            PolicyClip::Ratio { .. }
            | PolicyClip::Cispo { .. }
            | PolicyClip::Gspo { .. }
            | PolicyClip::Unclipped => vec![
                (PG_CLIPFRAC, s.pg_clipfrac),
                ("actor/pg_clipfrac_lower", s.pg_clipfrac_lower),
            ],
            PolicyClip::Advantage { .. } => vec![
                ("actor/acpo_clipfrac_upper", s.acpo_clipfrac_upper),
                ("actor/acpo_clipfrac_lower", s.acpo_clipfrac_lower),
                (ACPO_CLIPFRAC, s.acpo_clipfrac_upper + s.acpo_clipfrac_lower),
            ],
        }
    }

    /// The metric (one of [`PolicyClip::clip_metrics`]) of the share of update tokens the
    /// rule's own clip acted on: what the report and the sweeps read back of a run.
    pub fn own_clip_metric(&self) -> &'static str {
        match self {
            PolicyClip::Ratio { .. }
            | PolicyClip::Cispo { .. }
            | PolicyClip::Gspo { .. }
            | PolicyClip::Unclipped => PG_CLIPFRAC,
            PolicyClip::Advantage { .. } => ACPO_CLIPFRAC,
        }
    }

    /// The one clip fraction reported for a step's later, off-policy mini-batches, whose
    /// ratios have moved away from 1 by the earlier updates.
    pub fn later_clip_metric(&self, s: &PolicyStats) -> (&'static str, f64) {
        match self {
            PolicyClip::Ratio { .. }
            | PolicyClip::Cispo { .. }
            | PolicyClip::Gspo { .. }
            | PolicyClip::Unclipped => ("actor/pg_clipfrac_later", s.pg_clipfrac),
            PolicyClip::Advantage { .. } => (
                "actor/acpo_clipfrac_later",
                s.acpo_clipfrac_upper + s.acpo_clipfrac_lower,
            ),
        }
    }
}

/// Bounds log π − log π_old before exponentiating, as verl does, so r stays finite.
pub(crate) const LOG_RATIO_BOUND: f64 = 20.0;

/// log r = clamp(log π − log π_old, ±20) and r = exp(log r), as verl computes them; `(B, T)`.
pub fn importance_ratio(log_prob: &Tensor, old_log_prob: &Tensor) -> Result<(Tensor, Tensor)> {
    let log_ratio = (log_prob - old_log_prob)?.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)?;
    let ratio = log_ratio.exp()?;
    Ok((log_ratio, ratio))
}

/// What every rule is written in, per token `(B, T)` in f32: the mask; log π (carrying the
/// gradient), log π_old and Â with padding zeroed (it may hold anything, even NaN, which would
/// leak through 0·NaN); log r and r·Â (with the gradient); constant copies of r and r·Â for the
/// masks and clipped values.
pub struct Tokens {
    pub mask: Tensor,
    pub log_prob: Tensor,
    pub old_log_prob: Tensor,
    pub adv: Tensor,
    log_ratio: Tensor,
    pub ratio_adv: Tensor,
    pub ratio_c: Tensor,
    pub ratio_adv_c: Tensor,
}

impl Tokens {
    /// The tokens of a batch: `log_prob` keeps its graph, the others are constants.
    pub fn new(
        log_prob: &Tensor,
        old_log_prob: &Tensor,
        advantages: &Tensor,
        response_mask: &Tensor,
    ) -> Result<Tokens> {
        check_same_shape(
            response_mask,
            &[
                ("log_prob", log_prob),
                ("old_log_prob", old_log_prob),
                ("advantages", advantages),
            ],
        )?;
        let mask = response_mask.to_dtype(DType::F32)?.detach();
        let log_prob = zero_padding(&log_prob.to_dtype(DType::F32)?, &mask)?;
        let old_log_prob = zero_padding(&old_log_prob.to_dtype(DType::F32)?.detach(), &mask)?;
        let adv = zero_padding(&advantages.to_dtype(DType::F32)?.detach(), &mask)?;
        let (log_ratio, ratio) = importance_ratio(&log_prob, &old_log_prob)?;
        let ratio_adv = (&ratio * &adv)?;
        Ok(Tokens {
            ratio_c: ratio.detach(),
            ratio_adv_c: ratio_adv.detach(),
            mask,
            log_prob,
            old_log_prob,
            adv,
            log_ratio,
            ratio_adv,
        })
    }

    /// Valid tokens.
    pub fn count(&self) -> Result<f64> {
        self.mask
            .sum_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()
    }

    /// verl's `ppo_kl`: the mean of log π_old − log π from the clamped log-ratio.
    fn ppo_kl(&self) -> Result<f64> {
        masked_mean(&self.log_ratio.detach().neg()?, &self.mask)
    }
}

/// One rule on a batch's tokens.
#[derive(Debug, Clone)]
pub struct RuleTerms {
    /// The per-token loss, its gradient with respect to log π the rule's; `(B, T)`, not masked.
    pub objective: Tensor,
    /// 1 where log π gets a gradient from the rule, else 0; `(B, T)`.
    pub keep: Tensor,
    /// The rule's clip fractions and `ppo_kl` (the other fields are filled by
    /// [`super::loss::policy_loss`]).
    pub stats: PolicyStats,
}

impl PolicyClip {
    /// The rule's per-token objective and gradient mask on `t`: the one place each rule's math
    /// is chosen.
    pub fn terms(&self, t: &Tokens) -> Result<RuleTerms> {
        match *self {
            PolicyClip::Ratio {
                eps_low,
                eps_high,
                dual_clip_c,
            } => ppo_clip(&t.ratio_c, &t.adv, &t.mask, eps_low, eps_high, dual_clip_c)?.on(t),
            PolicyClip::Advantage { alpha } => acpo_clip(&t.ratio_adv_c, &t.mask, alpha)?.on(t),
            PolicyClip::Unclipped => Clipped::nowhere(&t.ratio_c)?.on(t),
            PolicyClip::Cispo { eps_low, eps_high } => {
                let terms =
                    cispo_loss(&t.log_prob, &t.ratio_c, &t.adv, &t.mask, eps_low, eps_high)?;
                Ok(terms.with_ppo_kl(t.ppo_kl()?))
            }
            // verl's GSPO reports its own ppo_kl, from the unclamped log-ratio
            PolicyClip::Gspo { eps_low, eps_high } => gspo_loss(
                &t.log_prob,
                &t.old_log_prob,
                &t.adv,
                &t.mask,
                eps_low,
                eps_high,
            ),
        }
    }
}

impl RuleTerms {
    /// These terms reporting verl's shared `ppo_kl`.
    fn with_ppo_kl(self, ppo_kl: f64) -> RuleTerms {
        RuleTerms {
            stats: PolicyStats {
                ppo_kl,
                ..self.stats
            },
            ..self
        }
    }
}

/// Where a clip rule keeps the gradient of −r·Â, and the loss value where it does not.
#[derive(Debug, Clone)]
pub struct Clipped {
    /// 1 where the unclipped term −r·Â is the active one (its gradient flows), else 0; `(B, T)`.
    pub keep: Tensor,
    /// The (constant) loss value where `keep` is 0.
    pub value: Tensor,
    /// The rule's clip fractions.
    pub stats: PolicyStats,
}

impl Clipped {
    /// No clip: −r·Â everywhere (the unclipped importance-sampling control).
    fn nowhere(ratio: &Tensor) -> Result<Clipped> {
        Ok(Clipped {
            keep: ratio.ones_like()?,
            value: ratio.zeros_like()?,
            stats: PolicyStats::default(),
        })
    }

    /// The rule's terms on `t`: `keep · (−r·Â) + (1 − keep) · value`, with verl's `ppo_kl`.
    fn on(self, t: &Tokens) -> Result<RuleTerms> {
        let unclipped = t.ratio_adv.neg()?; // −r·Â, carries the gradient
        let objective = ((&self.keep * &unclipped)? + ((1.0 - &self.keep)? * &self.value)?)?;
        let terms = RuleTerms {
            objective,
            keep: self.keep,
            stats: self.stats,
        };
        Ok(terms.with_ppo_kl(t.ppo_kl()?))
    }
}

/// PPO's ratio clip with dual clip (verl's `vanilla` loss): per token
/// L = max(−Â·r, −Â·clamp(r, 1−ε_low, 1+ε_high)), and for Â < 0, L = min(L, −Â·c).
/// `ratio` and `adv` are constants here; the gradient flows where −Â·r is the active term.
pub fn ppo_clip(
    ratio: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
    dual_clip_c: f64,
) -> Result<Clipped> {
    let loss1 = (ratio * adv)?.neg()?;
    let loss2 = (ratio.clamp(1.0 - eps_low, 1.0 + eps_high)? * adv)?.neg()?;
    let clip1 = loss1.maximum(&loss2)?;
    let loss3 = (adv * (-dual_clip_c))?;
    let negative_cond = adv.lt(0.0)?;
    let negative = negative_cond.to_dtype(DType::F32)?;
    let dual_active = (clip1.gt(&loss3)?.to_dtype(DType::F32)? * &negative)?;
    let ratio_clipped = loss2.gt(&loss1)?.to_dtype(DType::F32)?;
    // Gradient flows only where the unclipped term is the active one and the dual clip
    // is not: keep = (loss1 ≥ loss2) ∧ ¬dual.
    let keep = ((1.0 - &ratio_clipped)? * (1.0 - &dual_active)?)?;
    let value = negative_cond.where_cond(&clip1.minimum(&loss3)?, &clip1)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&ratio_clipped, mask)?,
        pg_clipfrac_lower: masked_mean(&dual_active, mask)?,
        ..PolicyStats::default()
    };
    Ok(Clipped { keep, value, stats })
}

/// ACPO's advantage clip (paper eq. 5): L = −clamp(r·Â, −α, α) per token, no ratio bound and
/// no min with the unclipped term, so ∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0
/// elsewhere. `ratio_adv` (r·Â) is a constant here.
pub fn acpo_clip(ratio_adv: &Tensor, mask: &Tensor, alpha: f64) -> Result<Clipped> {
    let above = ratio_adv.gt(alpha)?.to_dtype(DType::F32)?;
    let below = ratio_adv.lt(-alpha)?.to_dtype(DType::F32)?;
    let keep = ((1.0 - &above)? - &below)?;
    let value = ratio_adv.clamp(-alpha, alpha)?.neg()?;
    let stats = PolicyStats {
        acpo_clipfrac_upper: masked_mean(&above, mask)?,
        acpo_clipfrac_lower: masked_mean(&below, mask)?,
        ..PolicyStats::default()
    };
    Ok(Clipped { keep, value, stats })
}

/// CISPO (verl's `cispo`, MiniMax-M1): L = −sg(clamp(r, 1−ε_low, 1+ε_high))·Â·log π per
/// token. The clipped weight is detached, so every token keeps a gradient, −clamp(r)·Â: the
/// clip bounds its size and never zeroes it. The clip fraction is verl's, the share of tokens
/// with r outside the bounds.
pub fn cispo_loss(
    log_prob: &Tensor,
    ratio: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
) -> Result<RuleTerms> {
    let weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)?;
    let clipped = ratio.ne(&weight)?.to_dtype(DType::F32)?;
    let objective = ((&weight * adv)?.neg()? * log_prob)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&clipped, mask)?,
        ..PolicyStats::default()
    };
    Ok(RuleTerms {
        objective,
        keep: ratio.ones_like()?,
        stats,
    })
}

/// GSPO (verl's `gspo`, Zheng et al. 2025): the sequence-level ratio
/// s_i = exp(Σ_t (log π − log π_old) / |y_i|), at token t written sg(s_i)·π_t/sg(π_t) so that
/// its value is s_i and its gradient flows through the token's own log π_t, then PPO's clip:
/// L = max(−Â·s, −Â·clamp(s, 1−ε_low, 1+ε_high)), no dual clip. As in verl, log s is capped at
/// 10 (no gradient there) and `ppo_kl` is the token mean of log π_old − log π without the
/// ±20 clamp; the clip fraction is the share of tokens where the clipped term is the larger.
pub fn gspo_loss(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
) -> Result<RuleTerms> {
    let diff = ((log_prob.detach() - old_log_prob)? * mask)?;
    let lengths = mask.sum_keepdim(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
    let seq = diff.sum_keepdim(D::Minus1)?.div(&lengths)?; // (B, 1), constant
    const LOG_CAP: f64 = 10.0;
    let free = seq.le(LOG_CAP)?.to_dtype(DType::F32)?;
    let own = (log_prob - log_prob.detach())?.broadcast_mul(&free)?; // value 0, gradient 1
    let s = own
        .broadcast_add(&seq.clamp(f64::NEG_INFINITY, LOG_CAP)?)?
        .exp()?;
    let unclipped = (&s * adv)?.neg()?;
    let unclipped_c = unclipped.detach();
    let clipped_value = (s.detach().clamp(1.0 - eps_low, 1.0 + eps_high)? * adv)?.neg()?;
    let clipped = clipped_value.gt(&unclipped_c)?.to_dtype(DType::F32)?;
    let objective = (((1.0 - &clipped)? * &unclipped)? + (&clipped * &clipped_value)?)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&clipped, mask)?,
        ppo_kl: masked_mean(&diff.neg()?, mask)?,
        ..PolicyStats::default()
    };
    Ok(RuleTerms {
        objective,
        keep: (1.0 - &clipped)?.broadcast_mul(&free)?,
        stats,
    })
}

/// The two rules the regime diagnostic compares on every batch, whichever trains: a ratio clip
/// and ACPO's advantage clip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ComparedRules {
    pub ratio: PolicyClip,
    pub acpo: PolicyClip,
}

/// The rules a run compares: its own rule with the other family's at the paper's values when it
/// trains with one of them, the paper's pair for its family when it trains with neither (CISPO,
/// GSPO, unclipped).
pub fn compared_rules(kind: AlgorithmKind, clip: &PolicyClip) -> ComparedRules {
    let (ratio, acpo) = match clip {
        PolicyClip::Ratio { .. } => (*clip, rival_rule(kind)),
        PolicyClip::Advantage { .. } => (rival_rule(kind), *clip),
        PolicyClip::Cispo { .. } | PolicyClip::Gspo { .. } | PolicyClip::Unclipped => {
            let (base, ac) = if kind.is_ppo_type() {
                (AlgorithmKind::Ppo, AlgorithmKind::PpoAc)
            } else {
                (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc)
            };
            (rival_rule(ac), rival_rule(base))
        }
    };
    ComparedRules { ratio, acpo }
}

/// The other family's rule at the paper's values (appendix table), for the diagnostics only:
/// PPO's ratio clip (ε 0.2 / 0.2) beside PPO-AC's α = 3, GRPO's (ε 0.2 / 0.28) beside
/// GRPO-AC's α = 2, dual clip 3. `kind` trains with its own manifest values; this is the rule
/// it is compared with.
pub fn rival_rule(kind: AlgorithmKind) -> PolicyClip {
    match kind {
        AlgorithmKind::Ppo => PolicyClip::Advantage { alpha: 3.0 },
        AlgorithmKind::Grpo => PolicyClip::Advantage { alpha: 2.0 },
        AlgorithmKind::PpoAc => PolicyClip::Ratio {
            eps_low: 0.2,
            eps_high: 0.2,
            dual_clip_c: 3.0,
        },
        AlgorithmKind::GrpoAc => PolicyClip::Ratio {
            eps_low: 0.2,
            eps_high: 0.28,
            dual_clip_c: 3.0,
        },
    }
}

/// Where the compared rules disagree on a batch's tokens, whichever trains: the fractions of
/// its valid tokens where the ratio clip zeroes the gradient and ACPO's keeps it, and the
/// reverse.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Disagreement {
    /// Valid tokens the fractions are over (the weight for merging micro-batches).
    pub tokens: f64,
    pub ratio_zeroes: f64,
    pub acpo_zeroes: f64,
}

impl Disagreement {
    /// Token-weighted combination of micro-batches' disagreements.
    pub fn merge(&self, other: &Disagreement) -> Disagreement {
        let n = self.tokens + other.tokens;
        if n == 0.0 {
            return Disagreement::default();
        }
        let w = |a: f64, b: f64| (a * self.tokens + b * other.tokens) / n;
        Disagreement {
            tokens: n,
            ratio_zeroes: w(self.ratio_zeroes, other.ratio_zeroes),
            acpo_zeroes: w(self.acpo_zeroes, other.acpo_zeroes),
        }
    }
}

impl ComparedRules {
    /// Where the two disagree on a batch (the regime diagnostic); inputs as for
    /// [`super::loss::policy_loss`], constants here.
    pub fn disagreement(
        &self,
        log_prob: &Tensor,
        old_log_prob: &Tensor,
        advantages: &Tensor,
        response_mask: &Tensor,
    ) -> Result<Disagreement> {
        let t = Tokens::new(&log_prob.detach(), old_log_prob, advantages, response_mask)?;
        let (ratio_zeroes, acpo_zeroes) = disagreement_on(&t, &self.ratio, &self.acpo)?;
        Ok(Disagreement {
            tokens: t.count()?,
            ratio_zeroes,
            acpo_zeroes,
        })
    }
}

/// Where two rules disagree on the tokens of a batch: the fractions of valid tokens where `a`
/// zeroes the gradient and `b` keeps it, and where `b` zeroes it and `a` keeps it. Inputs as
/// for [`super::loss::policy_loss`] (constants here).
pub fn rule_disagreement(
    a: &PolicyClip,
    b: &PolicyClip,
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
) -> Result<(f64, f64)> {
    let t = Tokens::new(&log_prob.detach(), old_log_prob, advantages, response_mask)?;
    disagreement_on(&t, a, b)
}

fn disagreement_on(t: &Tokens, a: &PolicyClip, b: &PolicyClip) -> Result<(f64, f64)> {
    let (keep_a, keep_b) = (a.terms(t)?.keep, b.terms(t)?.keep);
    let a_zeroes = ((1.0 - &keep_a)? * &keep_b)?;
    let b_zeroes = ((1.0 - &keep_b)? * &keep_a)?;
    Ok((
        masked_mean(&a_zeroes, &t.mask)?,
        masked_mean(&b_zeroes, &t.mask)?,
    ))
}
