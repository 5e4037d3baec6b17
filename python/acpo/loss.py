"""ACPO's policy loss (paper eq. 5) in torch, the way verl computes its own losses.

    r = exp(clamp(log π − log π_old, −20, 20)),   L = −clamp(r·Â, −α, α)

per token, aggregated by verl's `agg_loss`. No ratio bound and no min with the unclipped term:
∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0 elsewhere (the gradient is written out with
`keep`, as acpo's Rust objective does, so ties at ±α do not split it).

This module needs torch only; `acpo.verl` registers it with verl as `loss_mode=acpo`. Metrics
carry the names acpo's trainer logs, so verl-trained runs and ours compare directly.
"""
import torch

LOG_RATIO_BOUND = 20.0


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp(min=1)


def acpo_token_losses(old_log_prob, log_prob, advantages, response_mask, alpha):
    """Per-token ACPO losses `(B, T)` and the metrics of acpo's trainer (floats)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    ratio_adv = ratio * advantages
    above = (ratio_adv.detach() > alpha).to(log_prob.dtype)
    below = (ratio_adv.detach() < -alpha).to(log_prob.dtype)
    keep = 1.0 - above - below
    clipped = -torch.clamp(ratio_adv.detach(), -alpha, alpha)
    losses = keep * (-ratio_adv) + (1.0 - keep) * clipped
    with torch.no_grad():
        metrics = {
            "actor/ppo_kl": masked_mean(-log_ratio, mask).item(),
            "actor/acpo_clipfrac_upper": masked_mean(above, mask).item(),
            "actor/acpo_clipfrac_lower": masked_mean(below, mask).item(),
            "actor/ratio_adv_mean": masked_mean(ratio_adv, mask).item(),
            "actor/ratio_adv_abs_max": (ratio_adv.abs() * mask).max().item(),
        }
        metrics["actor/acpo_clipfrac"] = (
            metrics["actor/acpo_clipfrac_upper"] + metrics["actor/acpo_clipfrac_lower"]
        )
    return losses * mask, metrics


def aggregate(losses, mask, mode, horizon=None):
    """verl's `agg_loss` on one data-parallel rank with the batch's own counts (for tests and
    for use without verl)."""
    mask = mask.to(losses.dtype)
    if mode == "token-mean":
        return (losses * mask).sum() / mask.sum()
    seq_sums = (losses * mask).sum(-1)
    seqs = (mask.sum(-1) > 0).to(losses.dtype)
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = (seq_sums * seqs).sum() / seqs.sum()
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (horizon or mask.shape[-1])
        return loss
    if mode == "seq-mean-token-mean":
        return ((seq_sums / (mask.sum(-1) + 1e-8)) * seqs).sum() / seqs.sum()
    raise ValueError(f"unknown loss_agg_mode {mode!r}")
