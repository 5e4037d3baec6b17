"""Composes a launch.sh written by `acpo export verl` against the installed verl's own Hydra
config (verl/trainer/config/ppo_trainer.yaml), as `python3 -m verl.trainer.main_ppo` would, and
builds the actor's policy-loss config the way verl's workers do: every override must name a key
verl has (or add one with `+` where verl allows it), and the -AC runs' α must reach
`AcpoPolicyLossConfig`. Prints the resolved settings that matter; exit 1 on any error.

    python3 python/tests/compose_launch.py results/verl/<name>/launch.sh

The package must be installed (`pip install ./python`): `import verl` loads its `verl.plugins`
entry point, which registers the `acpo` loss and its config class, as in every verl worker.
"""
import os
import re
import shlex
import sys
from pathlib import Path


def overrides(script):
    text = Path(script).read_text()
    call = text[text.index("python3 -m verl.trainer.main_ppo"):].replace("\\\n", " ")
    words = shlex.split(call)[3:]
    env = {"DATA": "/data", "OUT": "/out"}
    return [re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), w) for w in words]


def main(script):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides(script))
    actor = cfg.actor_rollout_ref.actor
    loss = actor.policy_loss
    if loss.loss_mode == "acpo":
        from verl.utils.config import omega_conf_to_dataclass

        built = omega_conf_to_dataclass(loss)
        assert type(built).__name__ == "AcpoPolicyLossConfig", type(built)
        print(f"policy_loss: {type(built).__name__}(loss_mode={built.loss_mode}, alpha={built.alpha})")
    else:
        print(f"policy_loss: {loss.loss_mode}, clip {actor.clip_ratio_low}/{actor.clip_ratio_high}/{actor.clip_ratio_c}")
    print(f"adv_estimator={cfg.algorithm.adv_estimator} n={cfg.actor_rollout_ref.rollout.n} "
          f"train_batch_size={cfg.data.train_batch_size} ppo_mini_batch_size={actor.ppo_mini_batch_size} "
          f"lr={actor.optim.lr} steps={cfg.trainer.total_training_steps} val n={cfg.actor_rollout_ref.rollout.val_kwargs.n}")
    # the reward function the launch names, loaded as verl's reward loop loads it
    from verl.utils.import_utils import load_extern_object

    reward = cfg.reward.custom_reward_function
    fn = load_extern_object(module_path=reward.path, object_name=reward.name)
    print(f"reward: {fn.__module__}.{fn.__name__} kind={reward.reward_kwargs.kind} "
          f"manager={cfg.reward.reward_manager.source}/{cfg.reward.reward_manager.name}")
    OmegaConf.resolve(cfg.data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
