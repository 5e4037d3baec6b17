#!/usr/bin/env python3
"""PyTorch twin of `acpo bench train-step --config C --seq-len N --micro-batch B --dtype bf16
--device cuda` (issue #19): the same HF config on random weights, the same step, on the same GPU.

The step: B sequences of N tokens (--prompt-len prompt tokens, no loss on them), the GRPO-AC
loss -clamp(r*A, -2, 2) token-mean with random advantages and old log-probs, the entropy
computed as a metric, as acpo's trainer computes it, then global-norm clip 1.0 and AdamW.
Mixed precision as verl's FSDP runs it: fp32 master weights and AdamW state, bf16 autocast.
Attention: --attn sdpa (PyTorch picks its flash backend for bf16) or flash_attention_2 when
the flash-attn package is installed. --checkpointing turns on HF gradient checkpointing.

  python3 tools/twins/bench_train_torch.py --config experiments/paper/configs/qwen3-1.7b.json \\
      --seq-len 9220 --prompt-len 1024 --micro-batch 2 --checkpointing --json out.json

Prints one Markdown row; reports tokens/s, MFU (same FLOP count as acpo: perf::train_flops)
and torch.cuda.max_memory_allocated.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

PEAK_BF16 = 989.4e12  # H100/H200 SXM dense bf16 (NVIDIA datasheet), as acpo's report
PEAK_F32 = 66.9e12


def train_flops(cfg, b, t):
    """acpo's perf::train_flops: 6 per matmul parameter per token plus causal attention."""
    n = sum(p.numel() for p in MODEL.parameters())
    lookup = cfg.vocab_size * cfg.hidden_size
    matmul = n - lookup + (lookup if cfg.tie_word_embeddings else 0)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 6 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * t / 2
    return b * t * (6 * matmul + attn)


ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--seq-len", type=int, default=128)
ap.add_argument("--prompt-len", type=int, default=1)
ap.add_argument("--micro-batch", type=int, default=2)
ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
ap.add_argument("--attn", default="sdpa")
ap.add_argument("--checkpointing", action="store_true")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--json")
args = ap.parse_args()

dev = torch.device("cuda")
cfg = AutoConfig.from_pretrained(args.config)
cfg._attn_implementation = args.attn
torch.manual_seed(0)
MODEL = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation=args.attn).to(dev)
MODEL.train()
if args.checkpointing:
    MODEL.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
opt = torch.optim.AdamW(MODEL.parameters(), lr=1e-6, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
b, t, p = args.micro_batch, args.seq_len, args.prompt_len
r = t - p
ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev)
adv = torch.randn(b, r, device=dev)
old = -torch.randn(b, r, device=dev).abs()
autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16")


def step():
    with autocast:
        logits = MODEL(ids).logits[:, p - 1 : t - 1].float()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, ids[:, p:, None]).squeeze(-1)
    with torch.no_grad():
        _entropy = -(logp.exp() * logp).sum(-1).mean()
    ra = torch.exp(lp - old) * adv
    loss = -torch.clamp(ra, -2.0, 2.0).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(MODEL.parameters(), 1.0)
    opt.step()
    torch.cuda.synchronize()


step()
torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(args.repeats):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
secs = statistics.median(times)
peak = torch.cuda.max_memory_allocated()
flops = train_flops(cfg, b, t)
row = dict(
    model=args.config, what="train-step", target=f"torch/{args.dtype}", attention=args.attn,
    checkpointing=args.checkpointing, tokens=b * t, seconds=secs, tokens_per_second=b * t / secs,
    mfu=flops / secs / (PEAK_BF16 if args.dtype == "bf16" else PEAK_F32), peak_bytes=peak,
    device=torch.cuda.get_device_name(), torch=torch.__version__, repeats=args.repeats,
)
print(f"| {args.config} | torch {args.attn}{' + ckpt' if args.checkpointing else ''} | {b}x{t} | "
      f"{row['tokens_per_second']:.1f} tok/s | MFU {100 * row['mfu']:.1f} % | peak {peak / 2**30:.1f} GiB |")
if args.json:
    with open(args.json, "w") as f:
        json.dump(row, f, indent=2)
