//! The methods the paper compares and the choices that define their objectives: the four
//! methods of Table 1 ([`AlgorithmKind`]), how token losses are aggregated ([`LossAggMode`]),
//! how advantages are estimated ([`AdvantageEstimator`]). The objectives' math in
//! [`super::loss`] and [`super::advantage`] is written in these terms; manifests parse them and
//! define none.
//!
//! What each method clips is a clipping rule, declared with all there is to it in
//! [`super::clip`].

use std::fmt;

use serde::{Deserialize, Serialize};

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
