#!/usr/bin/env python3
"""Independent numpy reference for src/algo (issue 3): writes tests/fixtures/objectives.json.

Reimplements verl's formulas (verl/trainer/ppo/core_algos.py: compute_gae_advantage_return,
compute_grpo_outcome_advantage, compute_policy_loss, compute_value_loss, agg_loss;
verl/utils/torch_functional.py: masked_whiten, entropy_from_logits) in float64 numpy, in the
textbook min / max / clip form, with the deviations documented in src/algo/mod.rs:
  1. a GRPO group of size 1 gets advantage 0;
  2. token-mean is exact over the mini-batch; token-mean-microbatch averages micro-batch means;
  3. seq-mean-token-sum-norm divides by a fixed horizon and the number of sequences;
  4. outputs at padding positions are 0.

Run once (not in CI):  python3 tools/oracles/ref_objectives.py > tests/fixtures/objectives.json
Needs only numpy.
"""
import json
import numpy as np

rng = np.random.default_rng(20261122)
B, T = 6, 9
lengths = [9, 7, 5, 9, 3, 1]
mask = np.zeros((B, T))
for b, n in enumerate(lengths):
    mask[b, :n] = 1.0
GARBAGE = 777.0  # padding values: must never change an output


def pad(x):
    return np.where(mask > 0, x, GARBAGE)


old_lp = pad(rng.normal(-1.5, 0.8, (B, T)))
log_prob = pad(np.where(mask > 0, old_lp + rng.normal(0, 0.45, (B, T)), 0))
adv = pad(rng.normal(0, 2.0, (B, T)))
# Planted tokens so every branch is exercised: the dual clip (Â < 0, r > c = 3) and a ratio
# between 1 + 0.2 and 1 + 0.28 with Â > 0 (clipped for PPO's ε_high, not for GRPO's).
for (b, t, dlog, a) in [(0, 2, 1.6, -1.3), (3, 4, 1.3, -0.7), (1, 1, np.log(1.25), 1.1)]:
    log_prob[b, t] = old_lp[b, t] + dlog
    adv[b, t] = a
values = pad(rng.normal(0.3, 0.5, (B, T)))
old_values = pad(np.where(mask > 0, values + rng.normal(0, 0.5, (B, T)), 0))
returns = pad(rng.normal(0.5, 1.0, (B, T)))
scores = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
token_rewards = np.zeros((B, T))
for b, n in enumerate(lengths):
    token_rewards[b, n - 1] = scores[b]
token_rewards = pad(token_rewards)
groups = [0, 0, 0, 1, 1, 2]
HORIZON = 12
MICRO = [(0, 3), (3, 6)]


def mmean(x, m):
    return float((x * m).sum() / m.sum()) if m.sum() > 0 else 0.0


def agg(loss, m, mode, mb_tokens, mb_seqs, n_micro):
    loss = np.where(m > 0, loss, 0.0)
    if mode == "token-mean":
        return loss.sum() / mb_tokens
    if mode == "token-mean-microbatch":
        return loss.sum() / m.sum() / n_micro
    if mode == "seq-mean-token-sum":
        return loss.sum(-1).sum() / mb_seqs
    if mode == "seq-mean-token-mean":
        return (loss.sum(-1) / np.maximum(m.sum(-1), 1)).sum() / mb_seqs
    if mode == "seq-mean-token-sum-norm":
        return loss.sum() / HORIZON / mb_seqs
    raise ValueError(mode)


def aggregated(loss, mode):
    """The mini-batch loss as the sum of micro-batch shares."""
    total = 0.0
    for lo, hi in MICRO:
        total += agg(loss[lo:hi], mask[lo:hi], mode, mask.sum(), B, len(MICRO))
    return float(total)


MODES = ["token-mean", "token-mean-microbatch", "seq-mean-token-sum",
         "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def ppo_loss(eps_low, eps_high, c):
    lp = np.where(mask > 0, log_prob, 0)
    olp = np.where(mask > 0, old_lp, 0)
    a = np.where(mask > 0, adv, 0)
    neg_kl = np.clip(lp - olp, -20, 20)
    ratio = np.exp(neg_kl)
    l1 = -a * ratio
    l2 = -a * np.clip(ratio, 1 - eps_low, 1 + eps_high)
    clip1 = np.maximum(l1, l2)
    l3 = -a * c
    clip2 = np.minimum(l3, clip1)
    per_token = np.where(a < 0, clip2, clip1) * mask
    # Gradient of the per-token loss w.r.t. log pi: -A*r where the unclipped term is active.
    keep = (l1 >= l2) & ~((a < 0) & (clip1 > l3))
    grad = np.where(keep, -a * ratio, 0.0) * mask
    stats = dict(ppo_kl=mmean(-neg_kl, mask), pg_clipfrac=mmean((l2 > l1).astype(float), mask),
                 pg_clipfrac_lower=mmean(((clip1 > l3) & (a < 0)).astype(float), mask),
                 acpo_clipfrac_upper=0.0, acpo_clipfrac_lower=0.0,
                 ratio_adv_mean=mmean(ratio * a, mask),
                 ratio_adv_abs_max=float(np.max(np.abs(ratio * a) * mask)))
    return per_token, grad, stats


def acpo_loss(alpha):
    lp = np.where(mask > 0, log_prob, 0)
    olp = np.where(mask > 0, old_lp, 0)
    a = np.where(mask > 0, adv, 0)
    neg_kl = np.clip(lp - olp, -20, 20)
    ratio = np.exp(neg_kl)
    ra = ratio * a
    per_token = -np.clip(ra, -alpha, alpha) * mask
    grad = np.where(np.abs(ra) <= alpha, -ra, 0.0) * mask
    stats = dict(ppo_kl=mmean(-neg_kl, mask), pg_clipfrac=0.0, pg_clipfrac_lower=0.0,
                 acpo_clipfrac_upper=mmean((ra > alpha).astype(float), mask),
                 acpo_clipfrac_lower=mmean((ra < -alpha).astype(float), mask),
                 ratio_adv_mean=mmean(ra, mask), ratio_adv_abs_max=float(np.max(np.abs(ra) * mask)))
    return per_token, grad, stats


def _masked_inputs():
    return (np.where(mask > 0, log_prob, 0), np.where(mask > 0, old_lp, 0),
            np.where(mask > 0, adv, 0))


def _shared_stats(neg_kl, ratio, a):
    return dict(ppo_kl=mmean(-neg_kl, mask), pg_clipfrac_lower=0.0, acpo_clipfrac_upper=0.0,
                acpo_clipfrac_lower=0.0, ratio_adv_mean=mmean(ratio * a, mask),
                ratio_adv_abs_max=float(np.max(np.abs(ratio * a) * mask)))


def cispo_loss(eps_low, eps_high):
    """verl's compute_policy_loss_cispo: -sg(clip(r)) * A * log pi; every token keeps a gradient."""
    lp, olp, a = _masked_inputs()
    neg_kl = np.clip(lp - olp, -20, 20)
    ratio = np.exp(neg_kl)
    w = np.clip(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -w * a * lp * mask
    grad = -w * a * mask
    stats = _shared_stats(neg_kl, ratio, a)
    stats["pg_clipfrac"] = mmean((ratio != w).astype(float), mask)
    return per_token, grad, stats


def gspo_loss(eps_low, eps_high):
    """verl's compute_policy_loss_gspo: the sequence's length-normalised ratio s_i (log capped
    at 10), its value at every token and its gradient through the token's own log pi; then
    max(-A s, -A clip(s)). ppo_kl from the unclamped log-ratio."""
    lp, olp, a = _masked_inputs()
    d = (lp - olp) * mask
    seq = d.sum(-1) / np.maximum(mask.sum(-1), 1)
    s = np.exp(np.minimum(seq, 10.0))[:, None] * np.ones((B, T))
    l1 = -a * s
    l2 = -a * np.clip(s, 1 - eps_low, 1 + eps_high)
    per_token = np.maximum(l1, l2) * mask
    free = (seq <= 10.0)[:, None]
    grad = np.where((l1 >= l2) & free, -a * s, 0.0) * mask
    ratio = np.exp(np.clip(lp - olp, -20, 20))
    stats = _shared_stats(lp - olp, ratio, a)
    stats["pg_clipfrac"] = mmean((l2 > l1).astype(float), mask)
    return per_token, grad, stats


def unclipped_loss():
    lp, olp, a = _masked_inputs()
    neg_kl = np.clip(lp - olp, -20, 20)
    ratio = np.exp(neg_kl)
    stats = _shared_stats(neg_kl, ratio, a)
    stats["pg_clipfrac"] = 0.0
    return -ratio * a * mask, -ratio * a * mask, stats


def gae(gamma, lam, whiten):
    r = np.where(mask > 0, token_rewards, 0)
    v = np.where(mask > 0, values, 0)
    advs = np.zeros((B, T))
    nextvalues = np.zeros(B)
    lastgaelam = np.zeros(B)
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        advs[:, t] = lastgaelam
    rets = (advs + v) * mask
    if whiten:
        mean = (advs * mask).sum() / mask.sum()
        var = (((advs - mean) ** 2) * mask).sum() / mask.sum()
        var = var * mask.sum() / (mask.sum() - 1)
        advs = (advs - mean) / np.sqrt(var + 1e-8)
    return advs * mask, rets


def grpo(norm_by_std):
    out = np.zeros(B)
    for g in set(groups):
        idx = [i for i in range(B) if groups[i] == g]
        if len(idx) < 2:
            continue
        s = scores[idx]
        mean, std = s.mean(), s.std(ddof=1)
        out[idx] = (s - mean) / (std + 1e-6) if norm_by_std else s - mean
    return out[:, None] * mask


def value_loss(cliprange, mode):
    v = np.where(mask > 0, values, 0)
    ov = np.where(mask > 0, old_values, 0)
    R = np.where(mask > 0, returns, 0)
    vclip = np.clip(v, ov - cliprange, ov + cliprange)
    e1 = (v - R) ** 2
    e2 = (vclip - R) ** 2
    per = np.maximum(e1, e2)
    loss = 0.5 * aggregated(per, mode)
    grad = np.where(e2 > e1, 0.0, 2 * (v - R)) * mask  # d per_token / d V
    return dict(loss=loss, clipfrac=mmean((e2 > e1).astype(float), mask), per_token_grad=grad.tolist())


def log_softmax(z):
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


logits = rng.normal(0, 3.0, (4, 11))
tokens = rng.integers(0, 11, 4)


def token_stats(temp):
    z = logits / temp
    lsm = log_softmax(z)
    p = np.exp(lsm)
    ent = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1) - (p * z).sum(-1)
    return dict(temperature=temp, log_probs=lsm[np.arange(4), tokens].tolist(), entropy=ent.tolist())


def diagnostics(alpha, eps_low, eps_high):
    lp = np.where(mask > 0, log_prob, 0)
    olp = np.where(mask > 0, old_lp, 0)
    a = np.where(mask > 0, adv, 0)
    r = np.exp(np.clip(lp - olp, -20, 20))
    ra = (r * a)[mask > 0]
    av, rv = a[mask > 0], r[mask > 0]
    ia = np.abs(ra) <= alpha
    ip = ((av > 0) & (rv <= 1 + eps_high)) | ((av < 0) & (rv >= 1 - eps_low))
    return dict(alpha=alpha, eps_low=eps_low, eps_high=eps_high, values=ra.tolist(),
                mean=float(ra.mean()), abs_max=float(np.abs(ra).max()),
                retain_acpo=float(ia.mean()), retain_ppo=float(ip.mean()),
                second_moment_acpo=float((ra ** 2 * ia).mean()),
                second_moment_ppo=float((ra ** 2 * ip).mean()))


policy = []
for clip in [dict(kind="ratio", eps_low=0.2, eps_high=0.2, dual_clip_c=3.0),
             dict(kind="ratio", eps_low=0.2, eps_high=0.28, dual_clip_c=3.0),
             dict(kind="advantage", alpha=3.0), dict(kind="advantage", alpha=2.0),
             dict(kind="advantage", alpha=0.5),
             # issue #23's family, appended so the cases above keep their indices
             dict(kind="cispo", eps_low=0.2, eps_high=0.28),
             dict(kind="gspo", eps_low=0.2, eps_high=0.28),
             dict(kind="gspo", eps_low=3e-4, eps_high=4e-4),
             dict(kind="unclipped")]:
    if clip["kind"] == "ratio":
        per_token, grad, stats = ppo_loss(clip["eps_low"], clip["eps_high"], clip["dual_clip_c"])
    elif clip["kind"] == "cispo":
        per_token, grad, stats = cispo_loss(clip["eps_low"], clip["eps_high"])
    elif clip["kind"] == "gspo":
        per_token, grad, stats = gspo_loss(clip["eps_low"], clip["eps_high"])
    elif clip["kind"] == "unclipped":
        per_token, grad, stats = unclipped_loss()
    else:
        per_token, grad, stats = acpo_loss(clip["alpha"])
    policy.append(dict(clip=clip, per_token=per_token.tolist(), per_token_grad=grad.tolist(),
                       stats=stats, loss={m: aggregated(per_token, m) for m in MODES}))

fixture = dict(
    generator="tools/oracles/ref_objectives.py (numpy %s)" % np.__version__,
    inputs=dict(mask=mask.tolist(), log_prob=log_prob.tolist(), old_log_prob=old_lp.tolist(),
                advantages=adv.tolist(), values=values.tolist(), old_values=old_values.tolist(),
                returns=returns.tolist(), scores=scores.tolist(), token_rewards=token_rewards.tolist(),
                groups=groups, horizon=HORIZON, micro_batches=MICRO,
                logits=logits.tolist(), tokens=tokens.tolist()),
    policy=policy,
    gae=[dict(gamma=g, lam=l, whiten=w, advantages=a.tolist(), returns=r.tolist())
         for (g, l, w) in [(1.0, 1.0, True), (1.0, 1.0, False), (0.99, 0.95, True), (0.9, 0.5, False)]
         for (a, r) in [gae(g, l, w)]],
    grpo=[dict(norm_by_std=n, advantages=grpo(n).tolist()) for n in (True, False)],
    value=[dict(cliprange=0.5, mode=m, **value_loss(0.5, m)) for m in ("token-mean", "seq-mean-token-mean")],
    token=[token_stats(1.0), token_stats(0.7)],
    diagnostics=diagnostics(2.0, 0.2, 0.28),
)
print(json.dumps(fixture))
