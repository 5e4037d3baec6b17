#!/usr/bin/env python3
"""The kernels a decode step launches, from an ncu CSV (`ncu --metrics gpu__time_duration.sum
--csv acpo bench generate ...`, the GPU suite's decode section): the launches are cut into
segments at each launch of the sampler (`sample_full_*`, one per token drawn: the prefill's
forward and every decode step's end with one), and the decode steps are the segments of the
most common length (a run of N new tokens has N − 1 of them; the prefills' forwards are longer,
and bench generate's runs of N > 2 tokens make them the majority). Prints the launches per
decode step, by kernel, and their kernel time; --json writes the same as data.

    python3 tools/gpu/launches.py ncu.csv[.gz] [--json launches.json]

Standard library only. Exits 1 when the file holds no decode step.
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


def decode_steps(runs):
    """The segments between sampler launches that are decode steps."""
    segments, current = [], []
    for kernel, us in runs:
        current.append((kernel, us))
        if kernel.startswith("sample_full"):
            segments.append(current)
            current = []
    if not segments:
        return []
    common = collections.Counter(len(s) for s in segments).most_common(1)[0][0]
    return [s for s in segments if len(s) == common]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.csv.is_file():
        print(f"error: {args.csv} is not a file", file=sys.stderr)
        return 2
    steps = decode_steps(launches(args.csv))
    if not steps:
        print(f"error: {args.csv}: no decode step (no sampler launches in the CSV)", file=sys.stderr)
        return 1
    by = collections.Counter()
    us = collections.Counter()
    for s in steps:
        for kernel, t in s:
            by[kernel] += 1
            us[kernel] += t
    n = len(steps)
    per_step = len(steps[0])
    rows = [{"kernel": k, "launches": by[k] / n, "us": us[k] / n} for k, _ in by.most_common()]
    total_us = sum(r["us"] for r in rows)
    print("| kernel | launches a step | µs a step |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['launches']:g} | {r['us']:.1f} |")
    print()
    print(f"{args.csv}: {n} decode steps, {per_step} launches and {total_us / 1e3:.2f} ms of kernel time a step")
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.csv), "decode_steps": n,
                                         "launches_per_step": per_step, "kernel_ms_per_step": total_us / 1e3,
                                         "by_kernel": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
