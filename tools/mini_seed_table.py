#!/usr/bin/env python3
"""Mean ± std over seeds of the mini scale's Table 1 (issue #8).

Usage: python3 tools/mini_seed_table.py RESULTS_DIR [RESULTS_DIR ...]
Each RESULTS_DIR holds run directories (results/mini, or one made with --results for other
seeds, see tools/make_mini_manifests.py --seed). Per run: weighted accuracy at step 0, at the
best evaluation (as Table 1 picks it) and at the last evaluation; then mean ± sample std over the
runs of each (model, method). Weights are the benchmarks' paper sizes, as everywhere.
"""
import json
import pathlib
import re
import statistics
import sys

W = {"math500": 500, "minerva": 272, "olympiadbench": 675, "aime-like": 230}
ORDER = ["xs", "s", "m", "l"]
METHODS = ["ppo", "ppo-ac", "grpo", "grpo-ac"]


def weighted(e):
    return 100 * sum(b["avg_at_k"] * W[b["benchmark"]] for b in e["benchmarks"]) / sum(W.values())


runs = {}
for root in sys.argv[1:]:
    for d in sorted(pathlib.Path(root).glob("mini-*")):
        m = re.match(r"mini-(xs|s|m|l)-(ppo-ac|grpo-ac|ppo|grpo)(-seed\d+)?-[0-9a-f]{12}$", d.name)
        if not m or not (d / "eval.jsonl").exists():
            continue
        evals = [json.loads(l) for l in (d / "eval.jsonl").read_text().splitlines() if l.strip()]
        acc = [weighted(e) for e in evals]
        runs.setdefault((m.group(1), m.group(2)), []).append((acc[0], max(acc), acc[-1]))


def ms(xs):
    if len(xs) < 2:
        return f"{xs[0]:.1f}"
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}"


print("| model | method | seeds | step 0 | best (Table 1) | last | last − step 0 |")
print("|---|---|---|---|---|---|---|")
for size in ORDER:
    for method in METHODS:
        r = runs.get((size, method))
        if not r:
            continue
        print(
            f"| qwen3-mini-{size} | {method.upper()} | {len(r)} | {ms([x[0] for x in r])} | "
            f"{ms([x[1] for x in r])} | {ms([x[2] for x in r])} | {ms([x[2] - x[0] for x in r])} |"
        )
