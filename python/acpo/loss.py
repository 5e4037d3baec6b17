"""ACPO's policy loss (paper eq. 5) in torch, the way verl computes its own losses.

    r = exp(clamp(log π − log π_old, −20, 20)),   L = −clamp(r·Â, −α, α)

per token, aggregated by verl's `agg_loss`. No ratio bound and no min with the unclipped term:
∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0 elsewhere (the gradient is written out with
`keep`, as acpo's Rust objective does, so ties at ±α do not split it).

This module needs torch only; `acpo.verl` registers it with verl as `loss_mode=acpo`. Metrics
carry the names acpo's trainer logs, so verl-trained runs and ours compare directly.

What it is given is checked: α a finite number > 0, the per-token tensors one non-empty shape
(ValueError otherwise). Masked-out positions are zeroed before any arithmetic (`torch.where`),
so NaN or inf in padding never reaches the loss or the gradient; `aggregate` over a mask that
selects no token is 0, not NaN.
"""
import math
import numbers

import torch

LOG_RATIO_BOUND = 20.0


def check_alpha(alpha):
    """α as a float, or ValueError: ACPO's clip threshold is a finite number > 0 (α ≤ 0 would
    clip every token, NaN none)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (numbers.Real, torch.Tensor)):
        raise ValueError(f"acpo.loss: alpha must be a finite number > 0, not {type(alpha).__name__}")
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() != 1:
            raise ValueError(f"acpo.loss: alpha must be one number, not a tensor of shape {tuple(alpha.shape)}")
        alpha = alpha.item()
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"acpo.loss: alpha must be a finite number > 0, not {alpha}")
    return alpha


def _check_batch(**tensors):
    """Same non-empty shape for every per-token tensor (torch would broadcast a mismatch)."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if any(shape != first for shape in shapes.values()):
        raise ValueError(f"acpo.loss: the per-token tensors differ in shape: {shapes}")
    if not first or 0 in first:
        raise ValueError(f"acpo.loss: an empty batch (shape {first}): nothing to compute a loss from")


def _where_valid(valid, x):
    """`x` where the mask holds, 0 elsewhere: a NaN or inf in a masked-out position (padding)
    then never reaches the arithmetic, the loss or the gradient."""
    return torch.where(valid, x, torch.zeros_like(x))


def _ratio(num, den):
    """num / den, and 0 where den is 0 (a batch whose mask selects no token has nothing to
    learn from: its loss is 0, not NaN, and backward() still runs)."""
    some = den > 0
    return torch.where(some, num / torch.where(some, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp(min=1)


def acpo_token_losses(old_log_prob, log_prob, advantages, response_mask, alpha):
    """Per-token ACPO losses `(B, T)` and the metrics of acpo's trainer (floats).

    α must be a finite number > 0 (ValueError otherwise); the four tensors one non-empty shape.
    Positions the mask leaves out are set to 0 before any arithmetic, so NaN or inf there
    (padding) changes neither the losses, the metrics nor the gradient."""
    alpha = check_alpha(alpha)
    _check_batch(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    valid = response_mask != 0
    mask = response_mask.to(log_prob.dtype)
    log_prob, old_log_prob = _where_valid(valid, log_prob), _where_valid(valid, old_log_prob)
    advantages = _where_valid(valid, advantages)
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
    for use without verl). A mask that selects no token gives a loss of 0 (with a graph, so
    backward() gives zero gradients), where verl's own division would give NaN; NaN or inf in
    a masked-out position is ignored; an empty batch is a ValueError."""
    _check_batch(losses=losses, mask=mask)
    valid = mask != 0
    mask = mask.to(losses.dtype)
    masked = _where_valid(valid, losses) * mask
    if mode == "token-mean":
        return _ratio(masked.sum(), mask.sum())
    seq_sums = masked.sum(-1)
    seqs = (mask.sum(-1) > 0).to(losses.dtype)
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = _ratio((seq_sums * seqs).sum(), seqs.sum())
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (horizon or mask.shape[-1])
        return loss
    if mode == "seq-mean-token-mean":
        return _ratio(((seq_sums / (mask.sum(-1) + 1e-8)) * seqs).sum(), seqs.sum())
    raise ValueError(f"unknown loss_agg_mode {mode!r}")
