"""The drop-ins, called with each framework's own signature (no framework needed): verl's
`compute_score` (sync, async, batch), TRL's `accuracy_reward`, OpenRLHF's `reward_func`, and
Math-Verify's `parse` / `verify` pair.
"""
import asyncio
import math
import os
import unittest
from pathlib import Path

from acpo import math_verify_compat, openrlhf, trl
from acpo import verl as acpo_verl


class Verl(unittest.TestCase):
    def test_compute_score_returns_what_verl_and_acpo_import_verl_read(self):
        right = acpo_verl.compute_score("math500", r"so x = \boxed{\frac{1}{2}}", "0.5", {"problem_id": "math500/7"})
        self.assertEqual(right, {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}", "data_source": "math500",
                                 "problem_id": "math500/7"})
        # the extracted answer (verl's validation votes on `pred` for maj@N); "" where none
        self.assertEqual(acpo_verl.compute_score("m", "no answer here", "3")["pred"], "")
        wrong = acpo_verl.compute_score("math500", r"\boxed{3}", "0.5", {"index": 7}, kind="signed")
        self.assertEqual((wrong["score"], wrong["acc"], wrong["problem_id"]), (-1.0, False, "7"))
        self.assertEqual(acpo_verl.compute_score("aime", r"\boxed{3}", "4")["score"], 0.0)
        # verl passes keyword arguments of its own (reward_router_address, ...): ignored
        self.assertEqual(acpo_verl.compute_score("m", r"\boxed{4}", "4", None, reward_router_address=None)["score"], 1.0)
        with self.assertRaisesRegex(ValueError, "'other' is not 'binary' or 'signed'"):
            acpo_verl.compute_score("x", r"\boxed{1}", "1", {}, kind="other")

    def test_a_verl_that_cannot_take_the_loss_is_reported_loudly(self):
        # a verl is installed (importable) but lacks the policy-loss registry: a warning and an
        # error log, not a silent HAVE_VERL = False found out from "Unsupported loss mode"
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "verl").mkdir()
            (Path(d) / "verl" / "__init__.py").write_text("")
            probe = ("import warnings\nwarnings.simplefilter('always')\nimport acpo.verl as v\n"
                     "print(v.HAVE_VERL, v.REGISTRATION_ERROR is not None)\n")
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": d})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["False", "True"])
        self.assertIn("RuntimeWarning: acpo.verl: verl is installed but the ACPO policy loss could not be registered",
                      out.stderr)
        # without verl at all: silent, the rewards work
        probe = "import acpo.verl as v; print(v.HAVE_VERL, v.REGISTRATION_ERROR)"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        if "True" not in out.stdout:  # skip the silence check where a real verl is installed
            self.assertEqual((out.stdout.split(), out.stderr), (["False", "None"], ""))

    def test_the_async_variant_judges_a_chunk_concurrently(self):
        async def chunk():
            # as verl's RewardLoopWorker: every response a task, then gather
            tasks = [asyncio.ensure_future(acpo_verl.compute_score_async("math500", rf"\boxed{{{i}}}", "3", {"index": i}))
                     for i in range(200)]
            return await asyncio.gather(*tasks)

        got = asyncio.run(chunk())
        self.assertEqual([g["acc"] for g in got], [i == 3 for i in range(200)])
        self.assertEqual(got[3]["problem_id"], "3")

    def test_the_batch_signature(self):
        got = acpo_verl.compute_score_batch(
            ["math500", "minerva", "aime"], [r"\boxed{\frac{1}{2}}", r"\boxed{3}", r"the answer is \boxed{4}"],
            ["0.5", "2", "4"], [{"problem_id": "a"}, {"index": 7}, None], kind="signed")
        self.assertEqual([g["score"] for g in got], [1.0, -1.0, 1.0])
        self.assertEqual([g["problem_id"] for g in got], ["a", "7", ""])
        self.assertEqual([g["pred"] for g in got], [r"\frac{1}{2}", "3", "4"])
        with self.assertRaisesRegex(ValueError, "2 responses with 1 data sources"):
            acpo_verl.compute_score_batch(["a"], ["x", "y"], ["1", "2"])

    def test_issue_47_values_that_are_not_text_are_refused_naming_the_argument(self):
        with self.assertRaisesRegex(TypeError, "ground_truth is None"):
            acpo_verl.compute_score("m", r"\boxed{None}", None, {})
        with self.assertRaisesRegex(TypeError, "solution_str must be str"):
            acpo_verl.compute_score("m", b"\\boxed{2}", "2", {})
        with self.assertRaisesRegex(TypeError, "solution_str must be str"):
            acpo_verl.compute_score("m", ["\\boxed{2}"], "2", {})
        with self.assertRaisesRegex(ValueError, "ground_truth is the float NaN"):
            acpo_verl.compute_score("m", r"\boxed{nan}", math.nan, {})
        with self.assertRaisesRegex(TypeError, "extra_info must be a dict"):
            acpo_verl.compute_score("m", r"\boxed{2}", "2", "id-7")
        with self.assertRaisesRegex(TypeError, r"ground_truths\[1\] is None"):
            acpo_verl.compute_score_batch(["m", "m"], [r"\boxed{1}", r"\boxed{2}"], ["1", None])

        async def one():
            return await acpo_verl.compute_score_async("m", None, "2")

        with self.assertRaisesRegex(TypeError, "solution_str must be str"):
            asyncio.run(one())


class Trl(unittest.TestCase):
    def test_conversational_and_standard_completions(self):
        conversational = [[{"role": "assistant", "content": r"so \boxed{4}"}],
                          [{"role": "assistant", "content": r"\boxed{5}"}],
                          [{"role": "assistant", "content": r"\boxed{1}"}]]
        self.assertEqual(trl.accuracy_reward(conversational, ["4", "4", r"\sum_{k} k"]), [1.0, 0.0, None])
        self.assertEqual(trl.accuracy_reward([r"\boxed{\frac{1}{2}}", "Answer: 3"], ["0.5", "2"]), [1.0, 0.0])
        self.assertEqual(trl.accuracy_reward([], [], prompts=[]), [])

    def test_the_gold_column_is_chosen_and_a_missing_one_named(self):
        completions = [r"\boxed{4}", r"\boxed{5}"]
        # TRL passes every dataset column as a keyword
        self.assertEqual(trl.accuracy_reward(completions=completions, solution=["4", "4"], prompts=["p", "p"]),
                         [1.0, 0.0])
        by_answer = trl.make_accuracy_reward("answer")
        self.assertEqual(by_answer.__name__, "accuracy_reward_answer")
        self.assertEqual(by_answer(completions=completions, answer=["5", "5"], prompts=["p", "p"]), [0.0, 1.0])
        with self.assertRaisesRegex(TypeError, r"no 'solution' column among the dataset's columns \(answer, id\)"):
            trl.accuracy_reward(completions=completions, answer=["4", "4"], id=[1, 2], prompts=["p", "p"],
                                trainer_state=None, log_extra=None)
        with self.assertRaisesRegex(TypeError, r"answer\[1\] is None"):
            by_answer(completions, ["4", None])

    def test_the_extracted_answers_are_logged_through_log_extra(self):
        logged = {}
        out = trl.accuracy_reward([r"so \boxed{\frac12}", "no answer", r"\boxed{1}"], ["0.5", "3", r"\sum_k k"],
                                  log_extra=lambda column, values: logged.setdefault(column, []).extend(values))
        self.assertEqual(out, [1.0, 0.0, None])
        self.assertEqual(logged, {"solution": ["0.5", "3", r"\sum_k k"],
                                  "answer_parsed": [r"\frac12", "[unparseable]", "[skipped]"]})

    def test_through_trls_own_grpo_reward_call(self):
        # GRPOTrainer._calculate_rewards of the installed TRL, on a stand-in for the trainer
        # (no model needed): the keywords TRL passes, its None -> NaN, its log_extra
        try:
            import torch
            from trl import GRPOTrainer
        except Exception:
            self.skipTest("trl (and torch) are not installed")
        from collections import defaultdict
        from types import SimpleNamespace

        from accelerate import PartialState

        PartialState()  # one process, as a single-GPU launch (TRL's logging needs it)

        trainer = SimpleNamespace(
            accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
            reward_funcs=[trl.make_accuracy_reward("answer")], reward_processing_classes=[None],
            reward_func_names=["accuracy_reward_answer"], state=SimpleNamespace(global_step=0), environments=None,
            args=SimpleNamespace(report_to=[]), _pending_extra_logs=defaultdict(list),
            _pending_metrics=defaultdict(list), is_world_process_zero=lambda: True,
        )
        trainer._log_completion_extra = lambda c, v: GRPOTrainer._log_completion_extra(trainer, c, v)
        trainer._log_metric = lambda n, v: GRPOTrainer._log_metric(trainer, n, v)
        inputs = [{"prompt": [{"role": "user", "content": "q"}], "answer": a, "id": i}
                  for i, a in enumerate(["4", "4", r"\sum_k k"])]
        completions = [[{"role": "assistant", "content": c}] for c in (r"\boxed{4}", "Answer: 5", r"\boxed{1}")]
        try:
            rewards = GRPOTrainer._calculate_rewards(trainer, inputs, [x["prompt"] for x in inputs], completions,
                                                     [[1], [2], [3]])
        except AttributeError as e:  # a TRL whose reward path reads more of the trainer than this stand-in has
            self.skipTest(f"this TRL's _calculate_rewards needs more of the trainer: {e}")
        self.assertEqual(rewards[:2, 0].tolist(), [1.0, 0.0])
        self.assertTrue(math.isnan(rewards[2, 0].item()))
        self.assertEqual(trainer._pending_extra_logs["answer_parsed"], ["4", "5", "[skipped]"])

    def test_completions_that_are_not_text_are_refused(self):
        with self.assertRaisesRegex(TypeError, r"completions\[1\] must be str or a list of messages"):
            trl.accuracy_reward([r"\boxed{1}", b"\\boxed{1}"], ["1", "1"])
        with self.assertRaisesRegex(TypeError, r"completions\[0\]\[-1\]\['content'\] must be str"):
            trl.accuracy_reward([[{"role": "assistant", "content": None}]], ["1"])
        with self.assertRaisesRegex(TypeError, r"solution\[0\] is None"):
            trl.accuracy_reward([r"\boxed{1}"], [None])


class OpenRlhf(unittest.TestCase):
    def test_the_response_is_the_query_less_its_prompt(self):
        prompts = [r"Example: \boxed{9}. Solve 2+2.", "What is 1/2?"]
        queries = [prompts[0] + r" It is \boxed{4}.", prompts[1] + r" \boxed{0.5}"]
        out = openrlhf.reward_func(queries, prompts, ["4", "9"])
        self.assertEqual([float(x) for x in out["rewards"]], [1.0, 0.0])
        self.assertEqual([float(x) for x in out["scores"]], [1.0, 0.0])
        self.assertEqual(out["extra_logs"], {"acpo/accuracy": 0.5})

    def test_the_response_is_found_when_the_decoding_differs_from_the_prompt(self):
        # the prompt's own example answer (42) must never be judged as the response's
        prompt = "Example: \\boxed{42}.\nSolve 6 * 7 - 40."
        response = r" It is \boxed{2}."
        queries = [
            " " + prompt + response,  # a leading space
            "<s>" + prompt + response,  # a BOS the prompt does not have
            "<s> " + prompt.replace("\n", " \n") + response,  # spaces around tokens
            prompt.replace("Solve", "Solve  ") + response,  # a doubled space
        ]
        out = openrlhf.reward_func(queries, [prompt] * 4, ["2"] * 4)
        self.assertEqual([float(x) for x in out["rewards"]], [1.0] * 4)
        out = openrlhf.reward_func(queries, [prompt] * 4, ["42"] * 4)
        self.assertEqual([float(x) for x in out["rewards"]], [0.0] * 4)
        # a prompt with a BOS the decoded query does not repeat
        self.assertEqual(openrlhf.response_of(prompt + response, "<s>" + prompt), response)
        with self.assertRaisesRegex(ValueError, r"queries\[0\] does not contain prompts\[0\]"):
            openrlhf.reward_func([r"Something else entirely: \boxed{42}"], [prompt], ["42"])

    def test_end_tokens_and_trailing_special_tokens_are_not_the_answer(self):
        # OpenRLHF decodes with skip_special_tokens=False
        p = "<|im_start|>user\nSolve.<|im_end|>\n<|im_start|>assistant\n"
        cases = [
            ("Answer: \\frac{1}{2}<|im_end|>", r"\frac{1}{2}"),
            ("Answer: p - q<|im_end|>", "p - q"),
            ("Answer: 5<|im_end|>", "5"),
            ("Answer: 5<|im_end|><|endoftext|><|endoftext|>", "5"),
            ("Answer: 7<|endoftext|>", "7"),
            ("Answer: x^2 </s>", "x^2"),
            ("Answer: 3<|eot_id|>", "3"),
            ("Answer: 3<|im_end|>\nAnswer: 4", "3"),  # nothing after the end token counts
            ("Answer: 9 <pad><pad>", "9"),
        ]
        out = openrlhf.reward_func([p + r for r, _ in cases], [p] * len(cases), [g for _, g in cases])
        self.assertEqual([float(x) for x in out["rewards"]], [1.0] * len(cases))
        self.assertEqual(openrlhf.response_of(p + "Answer: p - q<|im_end|>", p), "Answer: p - q")

    def test_with_the_real_qwen3_tokenizers_decoding(self):
        # OpenRLHF's path: the left-padded prompt + response ids decoded with
        # skip_special_tokens=False (the pad, <|endoftext|>, before the prompt; <|im_end|> after)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            self.skipTest("the tokenizers package is not installed")
        directory = os.environ.get("ACPO_QWEN3_TOKENIZER") or str(Path(__file__).resolve().parents[3] / "shared" / "tokenizers" / "qwen3")
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            self.skipTest("no Qwen3 tokenizer (ACPO_QWEN3_TOKENIZER)")
        tok = Tokenizer.from_file(str(path))
        prompt = "<|im_start|>user\nExample: \\boxed{42}. What is 1/2 + 1/4?<|im_end|>\n<|im_start|>assistant\n"
        answers = {"Answer: \\frac{3}{4}": "3/4", "Answer: p - q": "p - q", "So \\boxed{0.75}.": "\\frac34"}
        pad = tok.token_to_id("<|endoftext|>")
        queries = []
        for response in answers:
            ids = tok.encode(prompt, add_special_tokens=False).ids + tok.encode(response + "<|im_end|>", add_special_tokens=False).ids
            queries.append(tok.decode([pad, pad] + ids, skip_special_tokens=False))
        self.assertTrue(all(q.startswith("<|endoftext|><|endoftext|>") and q.endswith("<|im_end|>") for q in queries))
        out = openrlhf.reward_func(queries, [prompt] * len(queries), list(answers.values()))
        self.assertEqual([float(x) for x in out["rewards"]], [1.0] * len(answers))
        out = openrlhf.reward_func(queries, [prompt] * len(queries), ["42"] * len(answers))
        self.assertEqual([float(x) for x in out["rewards"]], [0.0] * len(answers))

    def test_through_openrlhfs_own_single_turn_executor(self):
        # OpenRLHF's SingleTurnAgentExecutor loads reward_func.py as its docs say, tokenizes the
        # prompt, stitches prompt + generated ids and decodes them with skip_special_tokens=False
        # (the generation stands in for vLLM: the response's ids with <|im_end|>)
        try:
            from openrlhf.utils.agent import SingleTurnAgentExecutor
            from transformers import AutoTokenizer
        except Exception:
            self.skipTest("openrlhf (and transformers) are not installed")
        import tempfile
        from types import SimpleNamespace

        directory = os.environ.get("ACPO_QWEN3_TOKENIZER") or str(Path(__file__).resolve().parents[3] / "shared" / "tokenizers" / "qwen3")
        if not (Path(directory) / "tokenizer.json").is_file():
            self.skipTest("no Qwen3 tokenizer (ACPO_QWEN3_TOKENIZER)")
        tok = AutoTokenizer.from_pretrained(directory)
        prompt = tok.apply_chat_template([{"role": "user", "content": r"Example: \boxed{42}. What is 1/2 + 1/4?"}],
                                         tokenize=False, add_generation_prompt=True)

        class Engine:
            def __init__(self, response):
                self.ids = tok(response + "<|im_end|>", add_special_tokens=False)["input_ids"]

            async def generate(self, prompt_ids, params, multi_modal_data=None):
                return SimpleNamespace(outputs=[SimpleNamespace(token_ids=self.ids, finish_reason="stop", logprobs=None)])

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "reward_func.py"
            path.write_text("from acpo.openrlhf import reward_func  # noqa: F401\n")
            executor = SingleTurnAgentExecutor(str(path))
            got = []
            for response, label in (("Answer: \\frac{3}{4}", "3/4"), ("Answer: p - q", "p - q"), ("So \\boxed{0.75}.", "0.75"),
                                    ("Answer: \\frac{3}{4}", "42")):
                out = asyncio.run(executor.execute(prompt, label, SimpleNamespace(max_tokens=64, logprobs=None), 4096,
                                                   tok, Engine(response)))
                got.append(float(out["reward"][0]))
        self.assertEqual(got, [1.0, 1.0, 1.0, 0.0])

    def test_what_is_not_text_is_refused(self):
        with self.assertRaisesRegex(TypeError, r"queries\[0\] must be str"):
            openrlhf.reward_func([None], ["p"], ["1"])
        with self.assertRaisesRegex(TypeError, r"labels\[0\] is None"):
            openrlhf.reward_func(["p 1"], ["p"], [None])
        with self.assertRaisesRegex(ValueError, "2 queries but 1 prompts"):
            openrlhf.reward_func(["a", "b"], ["a"], ["1", "2"])


class MathVerifyShaped(unittest.TestCase):
    def test_parse_then_verify(self):
        from acpo.math_verify_compat import parse, verify

        gold, answer = parse("$\\frac{1}{2}$"), parse(r"The answer is \boxed{0.5}.")
        self.assertIsInstance(gold, list)
        self.assertEqual(answer[0], "0.5")
        self.assertTrue(verify(gold, answer))
        self.assertFalse(verify(parse("$3$"), parse(r"\boxed{4}")))
        self.assertTrue(verify("$3$", r"\boxed{3}"))
        self.assertEqual(parse(""), [])
        # Math-Verify's timeouts have nothing to do here; other options only at their defaults
        self.assertTrue(verify(gold, answer, timeout_seconds=5))
        with self.assertRaisesRegex(ValueError, "strict=False is not implemented"):
            verify(gold, answer, strict=False)
        with self.assertRaisesRegex(TypeError, "target must be what parse"):
            verify(gold, 0.5)
        with self.assertRaisesRegex(TypeError, "pred must be str"):
            math_verify_compat.parse(None)


if __name__ == "__main__":
    unittest.main()
