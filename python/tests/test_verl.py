"""The package in verl (issues #21, #23, #45), run by `just test-verl` (torch, verl 0.9.1 and
hydra in a venv with the package installed) and, skipping what needs them, in CI:
- the torch loss (`acpo.loss`) against fixtures written by acpo's Rust objectives
  (tests/it/verl.rs), loss and per-token gradient within 1e-6 in f64, every aggregation mode;
  skipped without torch;
- the `verl.plugins` entry point: `import verl` alone registers `acpo` in verl's policy-loss
  registry (checked in a fresh interpreter that never imports acpo); verl's own
  `get_policy_loss_fn("acpo")`, and verl's `vanilla`, `cispo` and `gspo` against acpo's;
- the reward inside verl's reward loop: `RewardLoopWorker.compute_score_batch` over the manager
  `load_reward_manager` builds from the launch's `reward.*` settings;
- the 16 paper launches of `acpo export verl` composed against verl's own Hydra config
  (needs `ACPO_BIN`, the acpo binary).
"""
import asyncio
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
FIXTURES = json.loads((HERE / "fixtures" / "policy_loss.json").read_text())

try:
    import torch
except ImportError:
    torch = None

TOL = 1e-6

# The reward settings `acpo export verl` writes (src/verl/mod.rs; tests/it/verl.rs holds the
# launches to them).
REWARD_OVERRIDES = [
    "reward.custom_reward_function.path=pkg://acpo.verl",
    "reward.custom_reward_function.name=compute_score_async",
    "reward.reward_manager.source=register",
    "reward.reward_manager.name=naive",
    "+reward.custom_reward_function.reward_kwargs.kind=signed",
]


def inputs():
    i = FIXTURES["inputs"]
    t = lambda k: torch.tensor(i[k], dtype=torch.float64)  # noqa: E731
    return t("old_log_prob"), t("log_prob"), t("advantages"), t("response_mask")


def close(test, got, want, what):
    test.assertLessEqual(abs(got - want), TOL * max(1.0, abs(want)), f"{what}: {got} vs {want}")


def check_loss_and_gradient(test, loss, log_prob, case, what):
    """`loss` (scalar tensor) and d loss / d `log_prob` against the fixture `case`."""
    loss.backward()
    close(test, loss.item(), case["loss"], f"loss, {what}")
    for g_row, w_row in zip(log_prob.grad.tolist(), case["grad_log_prob"]):
        for g, w in zip(g_row, w_row):
            close(test, g, w, f"gradient, {what}")


@unittest.skipIf(torch is None, "torch is not installed")
class LossAgainstRustFixtures(unittest.TestCase):
    def test_acpo_loss_gradient_and_metrics(self):
        from acpo.loss import acpo_token_losses, aggregate

        cases = [c for c in FIXTURES["cases"] if c["loss_mode"] == "acpo"]
        self.assertGreaterEqual(len(cases), 8)
        for c in cases:
            old, lp, adv, mask = inputs()
            lp.requires_grad_(True)
            losses, metrics = acpo_token_losses(old, lp, adv, mask, c["params"]["alpha"])
            what = f"alpha {c['params']['alpha']}, {c['loss_agg_mode']}"
            check_loss_and_gradient(self, aggregate(losses, mask, c["loss_agg_mode"]), lp, c, what)
            for name, value in metrics.items():
                close(self, value, c["metrics"][name], f"{name}, {what}")

    def test_the_gradient_is_exactly_zero_outside_alpha(self):
        from acpo.loss import acpo_token_losses, aggregate

        old, lp, adv, mask = inputs()
        lp.requires_grad_(True)
        losses, _ = acpo_token_losses(old, lp, adv, mask, 0.5)
        aggregate(losses, mask, "token-mean").backward()
        ra = (torch.exp(lp.detach() - old) * adv).abs()
        outside = (ra > 0.5) & (mask > 0)
        self.assertTrue(outside.any())
        self.assertTrue(torch.all(lp.grad[outside] == 0.0))


def verl_available():
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except Exception:
        return False
    return torch is not None


class Config(dict):
    """The parts of verl's ActorConfig the policy losses read."""

    def __getattr__(self, k):
        return self[k]

    def get(self, k, default=None):
        return dict.get(self, k, default)


@unittest.skipUnless(verl_available(), "verl is not importable")
class ThroughVerl(unittest.TestCase):
    def test_importing_verl_registers_acpo_through_the_entry_point(self):
        # a fresh interpreter that imports verl only, as a Ray worker does
        probe = (
            "import sys, verl\n"
            "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
            "fn = get_policy_loss_fn('acpo')\n"
            "print(fn.__module__, 'acpo.verl' in sys.modules)\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False,
                             env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["acpo.verl", "True"])
        # and verl's switch turns it off, so the registration is the entry point's doing
        off = subprocess.run([sys.executable, "-c", "import verl, sys; print('acpo.verl' in sys.modules)"],
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"})
        self.assertEqual(off.stdout.split(), ["False"], off.stderr)

    def test_verls_acpo_loss_agrees_with_rust(self):
        import verl  # noqa: F401  (the entry point registers acpo)
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        fn = get_policy_loss_fn("acpo")
        for c in [c for c in FIXTURES["cases"] if c["loss_mode"] == "acpo"]:
            old, lp, adv, mask = inputs()
            lp.requires_grad_(True)
            config = Config(policy_loss=Config(alpha=c["params"]["alpha"]), global_batch_info={})
            loss, metrics = fn(
                old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                loss_agg_mode=c["loss_agg_mode"], config=config, rollout_is_weights=None,
            )
            check_loss_and_gradient(self, loss, lp, c, f"verl acpo, {c['loss_agg_mode']}")
            close(self, metrics["actor/acpo_clipfrac"], c["metrics"]["actor/acpo_clipfrac"], "clipfrac")

    def test_the_config_class_carries_alpha(self):
        from acpo.verl import HAVE_VERL, AcpoPolicyLossConfig

        self.assertTrue(HAVE_VERL)
        self.assertEqual(AcpoPolicyLossConfig(loss_mode="acpo", alpha=3.0).alpha, 3.0)

    def test_verls_vanilla_loss_is_acpos_ratio_clip(self):
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        fn = get_policy_loss_fn("vanilla")
        for c in [c for c in FIXTURES["cases"] if c["loss_mode"] == "vanilla"]:
            old, lp, adv, mask = inputs()
            lp.requires_grad_(True)
            p = c["params"]
            config = Config(clip_ratio=p["clip_ratio_low"], global_batch_info={}, **p)
            loss, metrics = fn(
                old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                loss_agg_mode=c["loss_agg_mode"], config=config, rollout_is_weights=None,
            )
            check_loss_and_gradient(self, loss, lp, c, f"verl vanilla, {c['loss_agg_mode']}")
            close(self, metrics["actor/pg_clipfrac"], c["metrics"]["actor/pg_clipfrac"], "pg_clipfrac")

    def test_verls_cispo_and_gspo_are_acpos(self):
        """Issue #23: value, gradient and metrics (f32 Rust against verl in f64), every
        aggregation mode. verl's own losses need a real ActorConfig."""
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config import ActorConfig

        for mode in ("cispo", "gspo"):
            fn = get_policy_loss_fn(mode)
            cases = [c for c in FIXTURES["cases"] if c["loss_mode"] == mode]
            self.assertGreaterEqual(len(cases), 4, mode)
            for c in cases:
                old, lp, adv, mask = inputs()
                lp.requires_grad_(True)
                p = c["params"]
                config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1,
                                     ppo_mini_batch_size=4, rollout_n=1, clip_ratio=p["clip_ratio_low"], **p)
                loss, metrics = fn(
                    old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                    loss_agg_mode=c["loss_agg_mode"], config=config, rollout_is_weights=None,
                )
                what = f"verl {mode} {p}, {c['loss_agg_mode']}"
                check_loss_and_gradient(self, loss, lp, c, what)
                for name in ("actor/pg_clipfrac", "actor/ppo_kl"):
                    close(self, metrics[name], c["metrics"][name], f"{name}, {what}")


def hydra_available():
    try:
        import hydra  # noqa: F401
    except ImportError:
        return False
    return verl_available()


class CharTokenizer:
    """Token ids are characters: what verl's reward managers decode."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


@unittest.skipUnless(hydra_available(), "verl and hydra are not importable")
class InVerlsRewardLoop(unittest.TestCase):
    def test_the_reward_runs_in_verls_reward_loop_worker(self):
        import numpy as np
        from hydra import compose, initialize_config_dir
        import verl
        from verl import DataProto
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
        from verl.trainer.ppo.reward import load_reward_manager

        config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = compose(config_name="ppo_trainer", overrides=REWARD_OVERRIDES)
        # (response, gold, problem id); the chunk padded to one response length, as verl's is
        items = [(r"so \boxed{\frac{1}{2}}", "0.5", "math500/1"), (r"\boxed{3}", "4", "math500/2"),
                 (r"Answer: 22099999999999998951424", "22099999999999998951424", "dapo/3")]
        width, prompt = 40, 5
        responses = torch.zeros(len(items), width, dtype=torch.long)
        mask = torch.zeros(len(items), prompt + width, dtype=torch.long)
        for i, (text, _, _) in enumerate(items):
            responses[i, : len(text)] = torch.tensor([ord(c) for c in text])
            mask[i, : prompt + len(text)] = 1
        data = DataProto.from_dict(
            tensors={"responses": responses, "attention_mask": mask},
            non_tensors={
                "data_source": np.array(["math500", "math500", "dapo"], dtype=object),
                "reward_model": np.array([{"ground_truth": g} for _, g, _ in items], dtype=object),
                "extra_info": np.array([{"problem_id": p} for _, _, p in items], dtype=object),
            },
        )
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            # verl's worker less its __init__ (which loads a tokenizer from a model path)
            worker = RewardLoopWorker.__new__(RewardLoopWorker)
            worker.config, worker.loop = config, loop
            worker.reward_manager = load_reward_manager(config, CharTokenizer())
            self.assertEqual(type(worker.reward_manager).__name__, "NaiveRewardManager")
            out = loop.run_until_complete(worker.compute_score_batch(data))
        finally:
            loop.close()
            asyncio.set_event_loop(None)
        self.assertEqual([o["reward_score"] for o in out], [1.0, -1.0, 1.0])
        self.assertEqual([o["reward_extra_info"]["problem_id"] for o in out], [p for _, _, p in items])
        self.assertEqual(out[0]["reward_extra_info"]["data_source"], "math500")
        # the extracted answer, on which verl's validation votes for maj@N
        self.assertEqual([o["reward_extra_info"]["pred"] for o in out],
                         [r"\frac{1}{2}", "3", "22099999999999998951424"])


@unittest.skipUnless(os.environ.get("ACPO_BIN") and hydra_available(), "needs ACPO_BIN, verl and hydra")
class LaunchesComposeInVerl(unittest.TestCase):
    def test_the_sixteen_paper_launches_compose_against_verls_config(self):
        import tempfile

        import compose_launch

        repo = HERE.parents[1]
        manifests = sorted((repo / "experiments" / "paper").glob("*.yaml"))
        self.assertEqual(len(manifests), 16)
        with tempfile.TemporaryDirectory() as tmp:
            for m in manifests:
                out = Path(tmp) / m.stem
                subprocess.run([os.environ["ACPO_BIN"], "export", "verl", str(m), "--out", str(out)],
                               check=True, capture_output=True)
                text = (out / "launch.sh").read_text()
                for override in REWARD_OVERRIDES[:4]:  # the kind is the manifest's
                    self.assertIn(f'"{override}"', text, m.stem)
                self.assertEqual(compose_launch.main(out / "launch.sh"), 0, m.stem)
            # a key verl does not have is refused
            bad = Path(tmp) / "bad.sh"
            bad.write_text((Path(tmp) / manifests[0].stem / "launch.sh").read_text()
                           .replace('"data.shuffle=', '"data.shufle='))
            with self.assertRaises(Exception):
                compose_launch.main(bad)


if __name__ == "__main__":
    unittest.main()
