"""acpo's plug-in for verl (issue #21): the policy loss `acpo` (paper eq. 5) with its config
class carrying α, and (in `acpo_verl/reward.py`) the reward function that judges answers with
acpo's verifier. `acpo export verl` writes launches that use both:

    actor_rollout_ref.model.external_lib=acpo_verl
    actor_rollout_ref.actor.policy_loss._target_=acpo_verl.AcpoPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=acpo
    +actor_rollout_ref.actor.policy_loss.alpha=2.0
    reward.custom_reward_function.path=<this directory>/acpo_verl/reward.py

Importing this package without verl installed gives the torch loss only (`acpo_verl.loss`),
and without torch the reward function only (`acpo_verl.reward`).
"""
from dataclasses import dataclass

try:
    from .loss import acpo_token_losses, aggregate  # noqa: F401
    from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
    from verl.workers.config.actor import PolicyLossConfig
except ImportError:  # no verl (torch-only use, tests) or no torch (the reward function)
    HAVE_VERL = False
else:
    HAVE_VERL = True

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
        """verl's policy-loss signature; α from `config.policy_loss.alpha`."""
        assert config is not None, "the acpo loss needs the actor config (policy_loss.alpha)"
        alpha = float(config.policy_loss.alpha)
        losses, metrics = acpo_token_losses(old_log_prob, log_prob, advantages, response_mask, alpha)
        if rollout_is_weights is not None:
            losses = losses * rollout_is_weights
        loss = agg_loss(
            loss_mat=losses,
            loss_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            **config.global_batch_info,
        )
        return loss, metrics
