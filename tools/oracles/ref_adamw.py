#!/usr/bin/env python3
"""PyTorch reference for src/optim.rs (issue 6): torch.optim.AdamW + clip_grad_norm_ + verl's
constant-with-warmup schedule (transformers' get_constant_schedule_with_warmup: the factor is
t / warmup for the t-th step, t = 0, 1, …, then 1). Writes tests/fixtures/adamw.json.

  python3 tools/oracles/ref_adamw.py      # torch from PyPI, CPU, float32
"""
import json
import torch

torch.manual_seed(3)
params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
init = [p.detach().clone().tolist() for p in params]
cfg = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, warmup=2, clip=0.5, steps=6)
opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"], weight_decay=cfg["weight_decay"])
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: t / cfg["warmup"] if t < cfg["warmup"] else 1.0)
steps = []
for s in range(cfg["steps"]):
    scale = 0.05 if s % 2 else 3.0  # alternate: clipped (norm > 0.5) and unclipped steps
    grads = [torch.randn_like(p) * scale for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    lr_used = opt.param_groups[0]["lr"]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg["clip"])
    opt.step()
    sched.step()
    steps.append(dict(grads=[g.tolist() for g in grads], grad_norm=float(norm), lr=lr_used,
                      params=[p.detach().clone().tolist() for p in params],
                      exp_avg=[opt.state[p]["exp_avg"].tolist() for p in params],
                      exp_avg_sq=[opt.state[p]["exp_avg_sq"].tolist() for p in params]))
json.dump(dict(generator=f"tools/oracles/ref_adamw.py (torch {torch.__version__})", config=cfg, init=init, steps=steps),
          open("tests/fixtures/adamw.json", "w"))
print("wrote tests/fixtures/adamw.json")
