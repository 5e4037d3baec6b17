#!/usr/bin/env python3
"""The kernels a step launches, from an ncu CSV (`ncu --metrics gpu__time_duration.sum --csv ...`,
the GPU suite). The launches are cut into segments after each launch of the kernel that ends a
step (--ends-at, a name prefix), and the steps are the segments of the most common length (the
shortest among equally common ones: the first segment also holds the program's start).

- A decode step (`acpo bench generate`, the default --ends-at sample_full): the sampler ends
  every token's forward; a run of N new tokens has N − 1 decode steps, and the prefills'
  forwards are longer, so bench generate's runs of N > 2 tokens make decode steps the majority.
- A train step (`acpo bench train-step`, --ends-at adamw_sq_total): the optimizer's norm total
  runs once a step, after the backward and before the updates, so a segment is one step's
  updates, the next step's forward and backward, and its norm (two timed steps give two).

Prints the launches a step by kernel, most kernel time first, and their kernel time; --json
writes the same as data.

    python3 tools/gpu/launches.py ncu.csv[.gz] [--ends-at PREFIX] [--json launches.json]

Standard library only. Exits 1 when the file holds no step.
"""
import argparse
import collections
import csv
import gzip
import json
import re
import sys
from pathlib import Path


def launches(path):
    """(kernel name, microseconds) of every launch in the CSV, in order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        rows = [line for line in f if line.startswith('"')]
    table = list(csv.reader(rows))
    if not table:
        return []
    head = table[0]
    name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
    out = []
    for r in table[1:]:
        # a kernel's name without its parameter list or template arguments
        kernel = re.split(r"[(<]", r[name], maxsplit=1)[0].strip()
        out.append((kernel, float(r[value].replace(",", "")) * scale.get(r[unit], 1.0)))
    return out


def steps(runs, ends_at="sample_full"):
    """The segments ending at a launch of `ends_at` that are steps: those of the most common
    length, the shortest of the equally common."""
    segments, current = [], []
    for kernel, us in runs:
        current.append((kernel, us))
        if kernel.startswith(ends_at):
            segments.append(current)
            current = []
    if not segments:
        return []
    counts = collections.Counter(len(s) for s in segments)
    top = max(counts.values())
    common = min(n for n, c in counts.items() if c == top)
    return [s for s in segments if len(s) == common]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--ends-at", default="sample_full",
                    help="the name prefix of the kernel that ends a step (default sample_full: decode steps)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.ends_at:
        ap.error("--ends-at is empty: every launch would end a step")
    if not args.csv.is_file():
        print(f"error: {args.csv} is not a file", file=sys.stderr)
        return 2
    found = steps(launches(args.csv), args.ends_at)
    if not found:
        print(f"error: {args.csv}: no step (no launch of {args.ends_at}* in the CSV)", file=sys.stderr)
        return 1
    by = collections.Counter()
    us = collections.Counter()
    for s in found:
        for kernel, t in s:
            by[kernel] += 1
            us[kernel] += t
    n = len(found)
    per_step = len(found[0])
    rows = [{"kernel": k, "launches": by[k] / n, "us": us[k] / n} for k in sorted(by, key=lambda k: (-us[k], k))]
    total_us = sum(r["us"] for r in rows)
    print("| kernel | launches a step | µs a step |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['launches']:g} | {r['us']:.1f} |")
    print()
    print(f"{args.csv}: {n} steps ending at {args.ends_at}, {per_step} launches and {total_us / 1e3:.2f} ms of kernel time a step")
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.csv), "ends_at": args.ends_at, "steps": n, "decode_steps": n,
                                         "launches_per_step": per_step, "kernel_ms_per_step": total_us / 1e3,
                                         "by_kernel": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
