#!/usr/bin/env python3
"""What an FP8 KV cache does to Avg@k: two `acpo eval` outputs of one model, one with
`--kv-cache model` and one with `--kv-cache fp8`, compared problem by problem.

Both evaluations draw sample i of a problem from the same random stream, so the difference is
paired by problem: per benchmark, Avg@k of each, their difference and its 95 % interval (normal
approximation over the problems' differences), and the problem-weighted total likewise.

    tools/checks/fp8_kv_effect.sh            # trains, exports and evaluates (about 10 min)
    python3 tools/checks/fp8_kv_effect.py BASE_DIR FP8_DIR
"""
import json
import math
import sys
from collections import defaultdict


def per_problem(path):
    """benchmark -> problem id -> (correct samples, samples)."""
    out = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
                cell = out[r["benchmark"]][r["problem_id"]]
                cell[0] += bool(r["correct"])
                cell[1] += 1
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"error: {path}:{n}: {e}")
    return out


def interval(diffs):
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = 1.96 * math.sqrt(var / n)
    return mean, mean - half, mean + half


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    base, fp8 = (per_problem(f"{d}/samples.jsonl") for d in sys.argv[1:])
    if base.keys() != fp8.keys():
        sys.exit("error: the two evaluations cover different benchmarks")
    print("| benchmark | problems | Avg@k, model dtype | Avg@k, FP8 cache | Δ (FP8 − model) | 95 % CI |")
    print("|---|---:|---:|---:|---:|---:|")
    everything = []
    for b in base:
        if base[b].keys() != fp8[b].keys():
            sys.exit(f"error: {b}: the two evaluations cover different problems")
        rows = [(base[b][p], fp8[b][p]) for p in base[b]]
        if any(x[1] != y[1] for x, y in rows):
            sys.exit(f"error: {b}: the two evaluations drew different numbers of samples")
        diffs = [100.0 * (y[0] - x[0]) / x[1] for x, y in rows]
        everything += diffs
        a = 100.0 * sum(x[0] for x, _ in rows) / sum(x[1] for x, _ in rows)
        c = 100.0 * sum(y[0] for _, y in rows) / sum(y[1] for _, y in rows)
        m, lo, hi = interval(diffs)
        print(f"| {b} | {len(rows)} | {a:.2f} % | {c:.2f} % | {m:+.2f} | [{lo:+.2f}, {hi:+.2f}] |")
    m, lo, hi = interval(everything)
    print(f"| all (problem-weighted) | {len(everything)} | | | {m:+.2f} | [{lo:+.2f}, {hi:+.2f}] |")


if __name__ == "__main__":
    main()
