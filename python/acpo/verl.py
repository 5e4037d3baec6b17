"""acpo in verl: the reward judged by acpo's verifier, and the ACPO policy loss.

Reward (verl's signature, `reward.custom_reward_function` in the launch):

    reward.custom_reward_function.path=pkg://acpo.verl
    reward.custom_reward_function.name=compute_score_async      # or compute_score
    +reward.custom_reward_function.reward_kwargs.kind=binary    # or signed (±1)

verl 0.9's reward loop (`RewardLoopWorker`, its `naive` manager) calls the function once per
response, every response of a chunk as its own task: `compute_score_async` judges each on the
loop's thread pool with the GIL released, so a chunk is judged on every core, in this process
(no `acpo` binary, no subprocess, no signal-based timeout: the judgement's work is bounded).
`compute_score` is the same, synchronous (verl runs it on that thread pool itself).
`compute_score_batch` judges a whole batch on every core, with the argument lists of verl's
legacy `BatchRewardManager` (verl < 0.9); verl 0.9.1's reward loop does not call it (its
managers are naive, rate_limited, dapo, remote and gdpo, each calling a per-response
`compute_score`), so with verl 0.9.1 use `compute_score_async`.

Each result is a dict: `score` (1 / 0, or 1 / −1 with kind=signed), `acc`, `pred` (the answer
extracted from the response, "" where none was found: verl's validation votes on it for maj@N),
and `data_source` and `problem_id` (from `extra_info`), which verl writes into its validation
dumps, where `acpo import verl` finds them. Wrong types raise, naming the argument: a `solution_str` that is
not `str`, a `ground_truth` that is None, bytes, a list or NaN (never a score of 0 in silence).

Policy loss: with verl and torch installed, importing this module registers `acpo` in verl's
policy-loss registry (where verl is installed but the registration fails, a RuntimeWarning and
an error on the `acpo.verl` logger say why, and `REGISTRATION_ERROR` holds it: verl itself logs
a failed plug-in only at DEBUG, and the launch would fail later with "Unsupported loss mode") and defines `AcpoPolicyLossConfig` (verl's `PolicyLossConfig` with ACPO's
α). The package's `verl.plugins` entry point imports it whenever verl is imported, in every
Ray worker, so a launch needs only

    actor_rollout_ref.actor.policy_loss._target_=acpo.verl.AcpoPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=acpo
    +actor_rollout_ref.actor.policy_loss.alpha=2.0
"""
import asyncio
import functools
import importlib.util
import logging
import warnings
from collections.abc import Mapping

from . import _native
from ._batch import as_list

KINDS = ("binary", "signed")


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"acpo.verl: reward kind {kind!r} is not 'binary' or 'signed'")


def _problem_id(extra_info, what):
    if extra_info is None:
        return ""
    if not isinstance(extra_info, Mapping):
        raise TypeError(f"acpo.verl: {what} must be a dict or None, not {type(extra_info).__name__}")
    return str(extra_info.get("problem_id", extra_info.get("index", "")))


def _result(correct, extracted, data_source, problem_id, kind):
    score = 1.0 if correct else (0.0 if kind == "binary" else -1.0)
    return {"score": score, "acc": bool(correct), "pred": extracted or "", "data_source": data_source,
            "problem_id": problem_id}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, kind="binary", **kwargs):
    """One response judged against its gold answer (verl's `compute_score` signature)."""
    _check_kind(kind)
    problem_id = _problem_id(extra_info, "extra_info")
    verdict = _native.judge(ground_truth, solution_str, gold_name="ground_truth", answer_name="solution_str")
    return _result(verdict[0], verdict[1], data_source, problem_id, kind)


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, kind="binary", **kwargs):
    """`compute_score` for verl's reward loop: judged on the event loop's thread pool (the GIL
    released), so the loop and the other responses of the chunk go on meanwhile."""
    loop = asyncio.get_running_loop()
    call = functools.partial(compute_score, data_source, solution_str, ground_truth, extra_info, kind=kind)
    return await loop.run_in_executor(None, call)


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, kind="binary", **kwargs):
    """A batch judged on every core (the argument lists of verl's legacy `BatchRewardManager`;
    verl 0.9.1's reward loop does not call it)."""
    _check_kind(kind)
    data_sources = as_list(data_sources, "data_sources", "acpo.verl")
    solution_strs = as_list(solution_strs, "solution_strs", "acpo.verl")
    ground_truths = as_list(ground_truths, "ground_truths", "acpo.verl")
    extra_infos = [None] * len(data_sources) if extra_infos is None else as_list(extra_infos, "extra_infos", "acpo.verl")
    verdicts = _native.judge_all(ground_truths, solution_strs, gold_name="ground_truths", answer_name="solution_strs")
    if not len(data_sources) == len(extra_infos) == len(verdicts):
        raise ValueError(
            f"acpo.verl: {len(verdicts)} responses with {len(data_sources)} data sources "
            f"and {len(extra_infos)} extra infos"
        )
    ids = [_problem_id(e, f"extra_infos[{i}]") for i, e in enumerate(extra_infos)]
    return [_result(v[0], v[1], d, p, kind) for v, d, p in zip(verdicts, data_sources, ids)]


#: Why `loss_mode=acpo` could not be registered in an installed verl (None where it was, or
#: where verl is not installed).
REGISTRATION_ERROR = None

try:  # the policy loss, where verl and torch are installed
    from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
    from verl.workers.config.actor import PolicyLossConfig

    import torch

    from .loss import acpo_token_losses
except Exception as error:  # the reward functions above still work
    HAVE_VERL = False
    if importlib.util.find_spec("verl") is not None:
        REGISTRATION_ERROR = f"{type(error).__name__}: {error}"
        _message = (
            f"acpo.verl: verl is installed but the ACPO policy loss could not be registered "
            f"({REGISTRATION_ERROR}); a launch with policy_loss.loss_mode=acpo will fail with "
            f"'Unsupported loss mode'. acpo's loss needs torch and verl >= 0.9 "
            f"(verl.trainer.ppo.core_algos.register_policy_loss, verl.workers.config.actor.PolicyLossConfig)."
        )
        logging.getLogger(__name__).error(_message)
        warnings.warn(_message, RuntimeWarning, stacklevel=2)
else:
    HAVE_VERL = True
    from dataclasses import dataclass

    @dataclass
    class AcpoPolicyLossConfig(PolicyLossConfig):
        """verl's policy-loss config with ACPO's threshold α (verl rejects unknown keys)."""

        alpha: float = 2.0

    @register_policy_loss("acpo")
    def compute_policy_loss_acpo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        """verl's policy-loss signature; α from `config.policy_loss.alpha` (paper eq. 5)."""
        if config is None:
            raise ValueError("the acpo loss needs the actor config (policy_loss.alpha)")
        losses, metrics = acpo_token_losses(
            old_log_prob, log_prob, advantages, response_mask, config.policy_loss.alpha
        )
        if rollout_is_weights is not None:
            # weights of masked-out positions (padding) may be anything, NaN included
            losses = losses * torch.where(response_mask != 0, rollout_is_weights, torch.zeros_like(rollout_is_weights))
        loss = agg_loss(
            loss_mat=losses,
            loss_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            **config.global_batch_info,
        )
        return loss, metrics
