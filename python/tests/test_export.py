"""`acpo model export` read by transformers (needs `ACPO_BIN`, the acpo binary, and torch with
transformers; skipped without them, as in CI's fresh venv).

A random model with the mini scale's BPE tokenizer (its lm_head untied, so that a greedy
continuation is not the prompt's last token repeated) is exported; `AutoTokenizer` must
tokenize as the harness does, `AutoModelForCausalLM` must continue each prompt greedily with the
tokens `acpo generate --temperature 0` produced, and the generation config must carry the ids
and the paper's sampling.
"""
import importlib.util
import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HAVE_HF = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers"))

PROMPTS = ["x", "What is 3 * 4?", "Solve for y: 2y = 10", "(a+b)^2 = ", r"The answer is \boxed{",
           "Q: 987654321", "it's  (abc)\n\n  x's"]
NEW_TOKENS = 24


@unittest.skipUnless(os.environ.get("ACPO_BIN") and HAVE_HF, "needs ACPO_BIN and torch, transformers, tokenizers")
class ExportLoadsInTransformers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = Path(cls.tmp.name)
        config = json.loads((REPO / "experiments" / "mini" / "qwen3-mini-xs.json").read_text())
        config["tie_word_embeddings"] = False
        (tmp / "config.json").write_text(json.dumps(config))
        acpo = os.environ["ACPO_BIN"]
        run = lambda *a: subprocess.run([acpo, *a], check=True, capture_output=True, text=True)  # noqa: E731
        run("model", "init", "--config", str(tmp / "config.json"), "--bpe-tokenizer", "--seed", "3",
            "--out", str(tmp / "model"))
        cls.out = tmp / "exported"
        run("model", "export", str(tmp / "model"), "--out", str(cls.out))
        (tmp / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
        run("generate", "--model", str(cls.out), "--input", str(tmp / "prompts.jsonl"), "--temperature", "0",
            "--max-new-tokens", str(NEW_TOKENS), "--output", str(tmp / "greedy.jsonl"))
        cls.ours = [json.loads(line) for line in (tmp / "greedy.jsonl").read_text().splitlines()]
        cls.source = tmp / "model"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_auto_tokenizer_tokenizes_as_the_harness(self):
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.out)
        raw = Tokenizer.from_file(str(self.source / "tokenizer.json"))
        for p in PROMPTS:
            self.assertEqual(tok(p).input_ids, raw.encode(p).ids, p)
        # the tokenizer itself, not one that agrees on these prompts: by its config's model_type
        # transformers would pick Qwen2Tokenizer, which swaps in Qwen's pre-tokenizer
        ours, theirs = json.loads(raw.to_str()), json.loads(tok.backend_tokenizer.to_str())
        for part in ("pre_tokenizer", "model", "decoder"):
            self.assertEqual(theirs[part], ours[part], part)
        self.assertEqual((tok.eos_token, tok.eos_token_id), ("<|endoftext|>", 0))
        self.assertEqual((tok.pad_token, tok.pad_token_id), ("<|pad|>", 1))

    def test_a_greedy_continuation_equals_acpo_generate(self):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.out)
        model = AutoModelForCausalLM.from_pretrained(self.out)
        self.assertEqual(type(model).__name__, "Qwen3ForCausalLM")
        self.assertEqual(len(self.ours), len(PROMPTS))
        distinct = set()
        for ours in self.ours:
            ids = tok(ours["prompt"], return_tensors="pt").input_ids
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NEW_TOKENS, temperature=None, top_p=None, top_k=None)
            new = out[0, ids.shape[1]:].tolist()
            distinct.update(new)
            self.assertEqual(tok.decode(new, skip_special_tokens=True), ours["completion"], ours["prompt"])
            self.assertEqual(len(new), ours["num_tokens"], ours["prompt"])
        # the continuations are not one token repeated: they tell models apart
        self.assertGreater(len(distinct), 20)

    def test_the_generation_config_has_the_ids_and_the_papers_sampling(self):
        from transformers import GenerationConfig

        g = GenerationConfig.from_pretrained(self.out)
        self.assertEqual((g.eos_token_id, g.pad_token_id, g.bos_token_id), (0, 1, 0))
        self.assertEqual((g.do_sample, g.temperature, g.top_p, g.top_k), (True, 1.0, 1.0, 0))


if __name__ == "__main__":
    unittest.main()
