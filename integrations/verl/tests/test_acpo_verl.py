"""Tests of the acpo_verl plug-in (issue #21), run by `just test-verl` or
`python3 -m unittest discover integrations/verl/tests`:
- the torch loss against fixtures written by acpo's Rust objectives (tests/it/verl.rs), loss
  and per-token gradient within 1e-6 in f64, every aggregation mode; skipped without torch;
- verl's own `get_policy_loss_fn("acpo")` after importing the plug-in, and verl's `vanilla`,
  `cispo` and `gspo` losses against acpo's (issue #23); skipped without verl;
- the reward function through the acpo binary (`$ACPO_BIN`); skipped without it;
- the 16 paper launches of `acpo export verl` composed against verl's own Hydra config, the -AC
  runs' policy-loss config built as `AcpoPolicyLossConfig` with α; skipped without verl/hydra.
"""
import json
import os
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
FIXTURES = json.loads((HERE / "fixtures" / "policy_loss.json").read_text())

try:
    import torch
except ImportError:
    torch = None

TOL = 1e-6


def inputs():
    i = FIXTURES["inputs"]
    t = lambda k: torch.tensor(i[k], dtype=torch.float64)
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
        from acpo_verl.loss import acpo_token_losses, aggregate

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
        from acpo_verl.loss import acpo_token_losses, aggregate

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
    def test_verl_finds_acpo_after_import_and_agrees_with_rust(self):
        import acpo_verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        self.assertTrue(acpo_verl.HAVE_VERL)
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
        import acpo_verl

        self.assertEqual(acpo_verl.AcpoPolicyLossConfig(loss_mode="acpo", alpha=3.0).alpha, 3.0)

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


@unittest.skipUnless(verl_available(), "verl is not importable")
class VerlsClippingFamily(unittest.TestCase):
    """Issue #23: acpo's CISPO and GSPO are verl's, value, gradient and metrics (f32 Rust
    against verl in f64), every aggregation mode. verl's own losses need a real ActorConfig."""

    def test_verls_cispo_and_gspo_are_acpos(self):
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
                                     ppo_mini_batch_size=4, rollout_n=1, clip_ratio=p["clip_ratio_low"],
                                     **p)
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


@unittest.skipUnless(os.environ.get("ACPO_BIN") and hydra_available(), "needs ACPO_BIN, verl and hydra")
class LaunchesComposeInVerl(unittest.TestCase):
    def test_the_sixteen_paper_launches_compose_against_verls_config(self):
        import subprocess
        import tempfile

        import compose_launch

        repo = HERE.parents[2]
        manifests = sorted((repo / "experiments" / "paper").glob("*.yaml"))
        self.assertEqual(len(manifests), 16)
        with tempfile.TemporaryDirectory() as tmp:
            for m in manifests:
                out = Path(tmp) / m.stem
                subprocess.run([os.environ["ACPO_BIN"], "export", "verl", str(m), "--out", str(out)],
                               check=True, capture_output=True)
                self.assertEqual(compose_launch.main(out / "launch.sh"), 0, m.stem)
            # a key verl does not have is refused
            bad = Path(tmp) / "bad.sh"
            bad.write_text((Path(tmp) / manifests[0].stem / "launch.sh").read_text()
                           .replace('"data.shuffle=', '"data.shufle='))
            with self.assertRaises(Exception):
                compose_launch.main(bad)


@unittest.skipUnless(os.environ.get("ACPO_BIN"), "ACPO_BIN (the acpo binary) is not set")
class Reward(unittest.TestCase):
    def test_compute_score_judges_with_acpos_verifier(self):
        from acpo_verl.reward import compute_score

        right = compute_score("math500", "so x = \\boxed{\\frac{1}{2}}", "0.5", {"problem_id": "math500/7"})
        self.assertEqual(right, {"score": 1.0, "acc": True, "data_source": "math500", "problem_id": "math500/7"})
        wrong = compute_score("math500", "\\boxed{3}", "0.5", {"problem_id": "math500/7"}, kind="signed")
        self.assertEqual((wrong["score"], wrong["acc"]), (-1.0, False))
        self.assertEqual(compute_score("aime-like", "\\boxed{3}", "4", {}, kind="binary")["score"], 0.0)
        with self.assertRaises(ValueError):
            compute_score("x", "\\boxed{1}", "1", {}, kind="other")

    def test_a_batch_is_one_judge_call_with_one_result_per_response(self):
        from acpo_verl import reward

        calls = []
        real = reward.judge

        def counting(responses, answers):
            calls.append(len(responses))
            return real(responses, answers)

        reward.judge = counting
        try:
            got = reward.compute_score_batch(
                ["math500", "minerva", "aime-like"],
                ["\\boxed{\\frac{1}{2}}", "\\boxed{3}", "the answer is \\boxed{4}"],
                ["0.5", "2", "4"],
                [{"problem_id": "a"}, {"index": 7}, None],
                kind="signed",
            )
        finally:
            reward.judge = real
        self.assertEqual(calls, [3])
        self.assertEqual([g["score"] for g in got], [1.0, -1.0, 1.0])
        self.assertEqual([g["problem_id"] for g in got], ["a", "7", ""])
        self.assertEqual(reward.compute_score_batch([], [], [], []), [])
        with self.assertRaises(ValueError):
            reward.compute_score_batch(["a"], ["x", "y"], ["1", "2"], [{}, {}])

    def test_the_coalescer_judges_concurrent_calls_together_and_fails_each_loudly(self):
        import asyncio
        from acpo_verl import reward

        batches = []

        def batch_fn(**kw):
            batches.append(len(kw["solution_strs"]))
            return reward.compute_score_batch(**kw, kind="binary")

        async def chunk(coalescer, n):
            # as verl's RewardLoopWorker.compute_score_batch: every response a task, then gather
            tasks = [asyncio.ensure_future(coalescer.submit("math500", f"\\boxed{{{i}}}", "3", {"index": i}))
                     for i in range(n)]
            return await asyncio.gather(*tasks)

        c = reward.Coalescer(batch_fn)
        got = asyncio.run(chunk(c, 40))
        self.assertEqual(batches, [40])
        self.assertEqual([g["acc"] for g in got], [i == 3 for i in range(40)])

        def failing(**kw):
            raise RuntimeError("acpo score failed on response 1 of the batch")

        with self.assertRaisesRegex(RuntimeError, "response 1"):
            asyncio.run(chunk(reward.Coalescer(failing), 3))

    def test_a_failing_judge_names_the_response(self):
        from acpo_verl import reward

        # A lone surrogate is escaped by json.dumps but is not text acpo score accepts: the
        # batch fails, and the error names the response, never a silent 0.
        with self.assertRaisesRegex(RuntimeError, "response 1 of the batch of 3"):
            reward.compute_score_batch(
                ["m"] * 3, ["\\boxed{1}", "odd \udc80", "\\boxed{2}"], ["1", "1", "2"], [{}] * 3
            )


if __name__ == "__main__":
    unittest.main()
