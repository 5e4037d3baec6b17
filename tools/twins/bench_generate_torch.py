#!/usr/bin/env python3
"""PyTorch twin of `acpo bench generate --config C --batch B --prompt-len P --new-tokens N
--dtype bf16 --device cuda`: HF transformers `generate` on random weights of the config's shape,
bf16, sdpa attention, a static KV cache where the installed transformers has one, sampling at
T = 1 with no early stop. Median of --repeats after a warm-up; new tokens per second. As acpo
does, the prefill alone is also timed (the same prompts, one new token), and the decode steps'
rate is batch x (N - 1) over the run's time less the prefill's.

  python3 tools/twins/bench_generate_torch.py --config experiments/paper/configs/qwen3-1.7b.json \\
      --batch 64 --prompt-len 1024 --new-tokens 1024 --json out.json
"""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--prompt-len", type=int, default=32)
ap.add_argument("--new-tokens", type=int, default=64)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--cache", default="static", help="static or dynamic")
ap.add_argument("--warmup-tokens", type=int, help="new tokens of the warm-up run (default --new-tokens; dynamic cache only: a "
                "static cache is sized and compiled for the run's length in its warm-up)")
ap.add_argument("--json")
args = ap.parse_args()
if args.warmup_tokens is not None and not 1 <= args.warmup_tokens <= args.new_tokens:
    ap.error(f"--warmup-tokens is {args.warmup_tokens}; it is 1 to --new-tokens ({args.new_tokens})")
if args.cache == "static" and args.warmup_tokens is not None and args.warmup_tokens < args.new_tokens:
    # transformers keeps a static cache between calls and builds (and compiles for) a new one
    # only when a call needs a longer one: a shorter warm-up leaves that inside the timed run
    ap.error("--warmup-tokens below --new-tokens with a static cache would time its rebuild and recompile")
dev = torch.device("cuda")
cfg = AutoConfig.from_pretrained(args.config)
torch.manual_seed(0)
# built on the GPU: random initialisation of 1.7B parameters on the CPU takes a minute
with dev:
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa").eval()
ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), device=dev)


# The cache the runs used: the one asked for, or transformers' default (dynamic) where this
# version refuses it; the JSON records which, so a dynamic run is never judged as a static one.
used = args.cache


def run(new_tokens=args.new_tokens):
    global used
    t0 = time.perf_counter()
    with torch.no_grad():
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                  top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  pad_token_id=0, eos_token_id=None)
        if used == args.cache:
            try:
                model.generate(ids, cache_implementation=args.cache, **kw)
            except (TypeError, ValueError) as e:
                print(f"bench_generate_torch: cache_implementation={args.cache!r} refused ({e}); "
                      "transformers' default (dynamic) cache instead", file=sys.stderr)
                used = "dynamic"
                t0 = time.perf_counter()
                model.generate(ids, **kw)
        else:
            model.generate(ids, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


run(args.new_tokens if args.warmup_tokens is None else args.warmup_tokens)
secs = statistics.median(run() for _ in range(args.repeats))
run(1)
prefill = statistics.median(run(1) for _ in range(args.repeats))
tokens = args.batch * args.new_tokens
steps = max(args.new_tokens - 1, 1)
decode = max(secs - prefill, 1e-9)
row = dict(config=args.config, what="generate", target="torch/bf16", cache=used, batch=args.batch,
           prompt_len=args.prompt_len, new_tokens=args.new_tokens, seconds=secs,
           tokens_per_second=tokens / secs, prefill_seconds=prefill,
           decode_tokens_per_second=args.batch * steps / decode, step_seconds=decode / steps,
           device=torch.cuda.get_device_name(), torch=torch.__version__)
print(f"| torch generate ({used} cache) | {args.batch} x ({args.prompt_len} + {args.new_tokens}) | "
      f"{tokens / secs:.1f} new tokens/s | decode {row['decode_tokens_per_second']:.1f} tokens/s, "
      f"{1e3 * row['step_seconds']:.1f} ms a step | prefill {prefill:.3f} s |")
if args.json:
    with open(args.json, "w") as f:
        json.dump(row, f, indent=2)
