//! Advantage estimators (paper Section 2): GAE for the PPO types, group normalisation for the
//! GRPO types.
//!
//! Advantages carry no gradient, and GAE is a reverse recursion over T: it is computed on a host
//! copy (B·T floats, negligible next to a forward pass) and returned on the input's device.

use candle_core::{Result, Tensor};

use super::{check_same_shape, from_rows, to_rows};

/// Advantages and value targets for the PPO types.
#[derive(Debug, Clone)]
pub struct GaeOutput {
    /// `(B, T)`; whitened over the batch's valid tokens when asked; 0 on padding.
    pub advantages: Tensor,
    /// `(B, T)`: A + V with the advantages *before* whitening (the critic's target); 0 on padding.
    pub returns: Tensor,
}

/// Generalised advantage estimation over response tokens.
///
/// δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}, where t+1 is the next *valid* token
/// (padding is skipped, as in verl) and V after the last valid token is 0. `token_rewards` holds
/// the scalar outcome reward on each response's last valid token (see [`outcome_to_token_rewards`]).
/// Returns = A + V before whitening; whitening (mean 0, unbiased variance, + 1e-8 inside the
/// square root) runs over every valid token of the whole batch.
pub fn gae(
    token_rewards: &Tensor,
    values: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
    lam: f64,
    whiten: bool,
) -> Result<GaeOutput> {
    check_same_shape(
        response_mask,
        &[("token_rewards", token_rewards), ("values", values)],
    )?;
    let rewards = to_rows(token_rewards)?;
    let values_h = to_rows(values)?;
    let mask = to_rows(response_mask)?;
    let (gamma, lam) = (gamma as f32, lam as f32);
    let mut advantages = vec![vec![0f32; mask.first().map_or(0, Vec::len)]; mask.len()];
    let mut returns = advantages.clone();
    for b in 0..mask.len() {
        let (mut next_value, mut last_gae) = (0f32, 0f32);
        for t in (0..mask[b].len()).rev() {
            if mask[b][t] == 0.0 {
                continue;
            }
            let delta = rewards[b][t] + gamma * next_value - values_h[b][t];
            last_gae = delta + gamma * lam * last_gae;
            next_value = values_h[b][t];
            advantages[b][t] = last_gae;
            returns[b][t] = last_gae + values_h[b][t];
        }
    }
    if whiten {
        masked_whiten(&mut advantages, &mask);
    }
    Ok(GaeOutput {
        advantages: from_rows(&advantages, response_mask)?,
        returns: from_rows(&returns, response_mask)?,
    })
}

/// (x − mean)/sqrt(var + 1e-8) over the valid entries, with the unbiased variance (verl's
/// `masked_whiten`); padding stays 0. Fewer than two valid entries: centred only.
fn masked_whiten(x: &mut [Vec<f32>], mask: &[Vec<f32>]) {
    let valid = || {
        x.iter().zip(mask).flat_map(|(xr, mr)| {
            xr.iter()
                .zip(mr)
                .filter(|(_, m)| **m != 0.0)
                .map(|(v, _)| *v as f64)
        })
    };
    let count = valid().count() as f64;
    if count == 0.0 {
        return;
    }
    let mean = valid().sum::<f64>() / count;
    let scale = if count > 1.0 {
        let var = valid().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (count - 1.0);
        1.0 / (var + 1e-8).sqrt()
    } else {
        1.0
    };
    for (xr, mr) in x.iter_mut().zip(mask) {
        for (v, m) in xr.iter_mut().zip(mr) {
            *v = if *m != 0.0 {
                ((*v as f64 - mean) * scale) as f32
            } else {
                0.0
            };
        }
    }
}

/// Places each response's scalar outcome reward on its last valid token; `(B, T)`.
pub fn outcome_to_token_rewards(scores: &[f32], response_mask: &Tensor) -> Result<Tensor> {
    let mask = to_rows(response_mask)?;
    if scores.len() != mask.len() {
        candle_core::bail!("{} scores for {} responses", scores.len(), mask.len());
    }
    let rows: Vec<Vec<f32>> = mask
        .iter()
        .zip(scores)
        .map(|(m, s)| {
            let mut row = vec![0f32; m.len()];
            if let Some(last) = m.iter().rposition(|v| *v != 0.0) {
                row[last] = *s;
            }
            row
        })
        .collect();
    from_rows(&rows, response_mask)
}

/// GRPO's outcome advantage (paper Section 2): within each prompt group,
/// Â_i = (s_i − mean)/(std + 1e-6) with the unbiased std, or s_i − mean without the std
/// (Dr. GRPO), broadcast over the response's valid tokens; no batch whitening. `group[i]` names
/// the prompt of response i. A group of size 1 has no baseline and gets 0.
pub fn grpo(
    scores: &[f32],
    group: &[usize],
    response_mask: &Tensor,
    norm_by_std: bool,
) -> Result<Tensor> {
    let mask = to_rows(response_mask)?;
    if scores.len() != mask.len() || group.len() != mask.len() {
        candle_core::bail!(
            "{} scores and {} group ids for {} responses",
            scores.len(),
            group.len(),
            mask.len()
        );
    }
    let per_response = group_normalize(scores, group, norm_by_std);
    let rows: Vec<Vec<f32>> = mask
        .iter()
        .zip(&per_response)
        .map(|(m, a)| m.iter().map(|v| if *v != 0.0 { *a } else { 0.0 }).collect())
        .collect();
    from_rows(&rows, response_mask)
}

/// One advantage per response from group statistics (f64 accumulation).
pub fn group_normalize(scores: &[f32], group: &[usize], norm_by_std: bool) -> Vec<f32> {
    use std::collections::HashMap;
    let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, g) in group.iter().enumerate() {
        members.entry(*g).or_default().push(i);
    }
    let mut out = vec![0f32; scores.len()];
    for idx in members.values() {
        if idx.len() < 2 {
            continue;
        }
        let n = idx.len() as f64;
        let mean = idx.iter().map(|&i| scores[i] as f64).sum::<f64>() / n;
        let std = (idx
            .iter()
            .map(|&i| (scores[i] as f64 - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0))
            .sqrt();
        for &i in idx {
            let centred = scores[i] as f64 - mean;
            out[i] = if norm_by_std {
                (centred / (std + 1e-6)) as f32
            } else {
                centred as f32
            };
        }
    }
    out
}
