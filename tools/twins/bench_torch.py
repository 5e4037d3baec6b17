#!/usr/bin/env python3
"""PyTorch/transformers counterpart of `acpo bench generate|train-step` (src/perf/mod.rs): the same
random Qwen3 configurations and shapes, on CPU, f32, median of 3 after a warm-up.

  python3 tools/twins/bench_torch.py                 # prints a Markdown table
  python3 tools/twins/bench_torch.py --json out.json # also writes the rows as JSON (bench_compare.py)
  python3 tools/twins/bench_torch.py --tiny-only     # only the tiny model (seconds instead of minutes)
Needs torch + transformers (PyPI). Threads: torch's default (all cores), like candle.
"""
import json
import statistics
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

BATCH, PROMPT_LEN, NEW_TOKENS, TRAIN_SEQ_LEN = 8, 32, 64, 128
REPEATS = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
MODELS = {
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "qwen3-100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, head_dim=64),
}


def model_of(kw):
    cfg = Qwen3Config(**kw, tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg)


def median_time(fn):
    fn()
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


if "--tiny-only" in sys.argv:
    MODELS = {"tiny": MODELS["tiny"]}
rows = []
for name, kw in MODELS.items():
    model = model_of(kw).eval()
    n_params = sum(p.numel() for p in model.parameters())
    prompts = torch.randint(0, kw["vocab_size"], (BATCH, PROMPT_LEN))

    def gen():
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                           top_p=1.0, top_k=0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           pad_token_id=0, eos_token_id=None)

    s = median_time(gen)
    rows.append((name, n_params, "generate", BATCH * NEW_TOKENS, s))

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, kw["vocab_size"], (BATCH, TRAIN_SEQ_LEN))
    adv = torch.randn(BATCH, TRAIN_SEQ_LEN - 1)
    with torch.no_grad():
        old = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def step():
        logits = model(ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ra = torch.exp(lp - old) * adv
        loss = -torch.clamp(ra, -2.0, 2.0).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as the trainer (verl) does
        opt.step()

    s = median_time(step)
    rows.append((name, n_params, "train-step", BATCH * TRAIN_SEQ_LEN, s))

if "--json" in sys.argv:
    with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
        json.dump([dict(model=name, parameters=n, what=what, tokens=tokens, seconds=s,
                        tokens_per_second=tokens / s) for name, n, what, tokens, s in rows], f, indent=1)
print(f"# PyTorch {torch.__version__} (threads {torch.get_num_threads()})\n")
print("| model | parameters | what | tokens | seconds (median) | tokens/s |\n|---|---:|---|---:|---:|---:|")
for name, n, what, tokens, s in rows:
    print(f"| {name} | {n} | {what} | {tokens} | {s:.4f} | {tokens / s:.1f} |")
