#!/usr/bin/env python3
"""PyTorch twin of `acpo bench attention --config C --seq-len T --micro-batch B --dtype bf16
--device cuda`: one layer's causal attention of the config's shape, q (B, H, T, D), k and v
(B, KV, T, D), through torch's scaled_dot_product_attention with its flash backend (grouped
query heads with enable_gqa), forward and forward + backward, median of --repeats after a
warm-up. Reports the same FLOP count as acpo (4*B*H*T^2*D/2 forward, 3.5x for both).

  python3 tools/twins/bench_attention_torch.py --config experiments/paper/configs/qwen3-1.7b.json \\
      --seq-len 9220 --micro-batch 2 --json out.json
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PEAK_BF16 = 989.4e12

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--seq-len", type=int, default=2048)
ap.add_argument("--micro-batch", type=int, default=2)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--json")
args = ap.parse_args()
cfg = json.load(open(args.config))
h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
d = cfg.get("head_dim") or cfg["hidden_size"] // h
b, t = args.micro_batch, args.seq_len
dev = torch.device("cuda")
q = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
dout = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16)


def run(backward):
    t0 = time.perf_counter()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if backward:
        out.backward(dout)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


run(True)
fwd = statistics.median(run(False) for _ in range(args.repeats))
both = statistics.median(run(True) for _ in range(args.repeats))
flops = 4 * b * h * d * t * t / 2
row = dict(config=args.config, batch=b, seq_len=t, heads=h, kv_heads=kv, head_dim=d,
           forward_s=fwd, forward_backward_s=both, forward_tflops=flops / fwd / 1e12,
           forward_backward_tflops=3.5 * flops / both / 1e12,
           floor_forward_s=flops / PEAK_BF16, floor_forward_backward_s=3.5 * flops / PEAK_BF16,
           device=torch.cuda.get_device_name(), torch=torch.__version__)
print(f"| torch sdpa | {b}x{t} | fwd {fwd:.4f} s ({row['forward_tflops']:.1f} TFLOP/s) | "
      f"fwd+bwd {both:.4f} s ({row['forward_backward_tflops']:.1f} TFLOP/s) |")
if args.json:
    with open(args.json, "w") as f:
        json.dump(row, f, indent=2)
