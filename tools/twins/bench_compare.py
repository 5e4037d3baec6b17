#!/usr/bin/env python3
"""acpo vs PyTorch/transformers on the same configurations (issue #4's speed targets), measured
in alternation so that a noisy machine (a shared VM) slows both sides alike.

  python3 tools/twins/bench_compare.py --acpo target/release/acpo --python /path/to/venv/bin/python \\
      [--rounds 3] [--out results/bench] [--tiny-only]

Each round runs `acpo bench train-step`, `acpo bench generate` and tools/twins/bench_torch.py once;
the table gives the median over rounds of each side's tokens/s (each itself a median of 3) and
their ratio, and is written to OUT/compare.md with the raw rounds in OUT/compare.json.
Targets: train step >= 1.0x PyTorch CPU, generation >= 2x HF `generate`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TARGET = {"train-step": 1.0, "generate": 2.0}

ap = argparse.ArgumentParser()
ap.add_argument("--acpo", default="target/release/acpo")
ap.add_argument("--python", default=sys.executable, help="a Python with torch + transformers")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--out", default="results/bench")
ap.add_argument("--tiny-only", action="store_true", help="only the tiny model (seconds per round)")
args = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))

tiny = ["--tiny-only"] if args.tiny_only else []
rounds = []
with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
        got = {"acpo": {}, "torch": {}}
        for kind in ["train-step", "generate"]:
            subprocess.run([args.acpo, "bench", kind, "--out", tmp] + tiny, check=True, stdout=subprocess.DEVNULL)
            for row in json.load(open(os.path.join(tmp, f"{kind}.json"))):
                got["acpo"][f"{row['model']} {row['what']}"] = row["tokens_per_second"]
        tj = os.path.join(tmp, "torch.json")
        subprocess.run([args.python, os.path.join(here, "bench_torch.py"), "--json", tj] + tiny, check=True,
                       stdout=subprocess.DEVNULL)
        for row in json.load(open(tj)):
            got["torch"][f"{row['model']} {row['what']}"] = row["tokens_per_second"]
        rounds.append(got)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} {got['acpo'][k]:.0f}/{got['torch'][k]:.0f}" for k in got["acpo"]), file=sys.stderr)

lines = [f"# acpo vs PyTorch (CPU, f32), median of {args.rounds} alternating rounds\n",
         f"Machine: {os.cpu_count()} CPU threads. acpo: `acpo bench train-step|generate`; PyTorch: "
         "`tools/twins/bench_torch.py` (transformers `generate` for generation).\n",
         "| model | what | acpo tokens/s | PyTorch tokens/s | ratio | target | met |",
         "|---|---|---:|---:|---:|---:|---|"]
for key in rounds[0]["acpo"]:
    a = statistics.median(r["acpo"][key] for r in rounds)
    t = statistics.median(r["torch"][key] for r in rounds)
    model, what = key.split(" ")
    ratios = [r["acpo"][key] / r["torch"][key] for r in rounds]
    lines.append(f"| {model} | {what} | {a:.1f} | {t:.1f} | {a / t:.2f}x "
                 f"(rounds {min(ratios):.2f}-{max(ratios):.2f}) | {TARGET[what]:.1f}x | "
                 f"{'yes' if a / t >= TARGET[what] else 'no'} |")
os.makedirs(args.out, exist_ok=True)
open(os.path.join(args.out, "compare.md"), "w").write("\n".join(lines) + "\n")
json.dump(rounds, open(os.path.join(args.out, "compare.json"), "w"), indent=1)
print("\n".join(lines))
