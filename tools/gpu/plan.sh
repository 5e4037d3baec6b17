#!/usr/bin/env bash
# The costed paper plan of one GPU suite run (`acpo bench paper-plan`, issues #20, #43, #57):
# arithmetic over the rates the run measured, made on the CPU after the loan so that it costs
# the GPU's time nothing. It reads DIR's raw results and writes the next numbered call folder,
# DIR/<N>-plan/: the rates it stood on, the plan in bf16's cache (measured/) and, where the run
# sampled over an FP8 KV cache too, the same plan from that run's rate (fp8-kv/), and
# commands.txt naming every file it read. tools/gpu/report.py then reads them.
#
#   ACPO_BIN=target/release/acpo bash tools/gpu/plan.sh results/gpu/<device>-<date>
#
# The rates: the train step at 2 x 9,220 tokens (the paper's length), the fastest of the ways
# the suite ran it (the default, --layer-by-hand, --flash-backward five), since a paper run can
# take any of them; sampling at the memory-sized batch with long-tailed lengths, the faster of
# continuous batching over the dense cache and over the paged one (a paper run samples its
# rollouts and evaluations that way), else the paper-shape sampling run.
set -euo pipefail
dir=${1:?usage: bash tools/gpu/plan.sh results/gpu/<device>-<date>}
[ -d "$dir" ] || { echo "plan: $dir is not a directory of GPU suite results" >&2; exit 2; }
acpo=${ACPO_BIN:-target/release/acpo}
[ -x "$acpo" ] || { echo "plan: no acpo binary at $acpo (cargo build --release, or set ACPO_BIN)" >&2; exit 2; }
n=$(find "$dir" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*-*' -printf '%f\n' | sed 's/-.*//' | sort -n | tail -1)
out="$dir/$(( ${n:-0} + 1 ))-plan"
stage=$(mktemp -d "$dir/.plan-staging.XXXXXX")
trap 'rm -rf "$stage"' EXIT
python3 - "$dir" "$stage" <<'PY'
import json, re, sys
from pathlib import Path

root, stage = Path(sys.argv[1]), Path(sys.argv[2])
order = lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", str(p))]


def last(pattern):
    found = sorted(root.glob(f"*/gpu-suite/{pattern}"), key=order)
    return found[-1] if found else None


def rows(path):
    return [r for r in json.loads(path.read_text()) if r["target"] == "cuda/bf16"] if path else []


steps = [(r, p) for name in ("paper-9220", "paper-9220-by-hand", "paper-9220-five")
         for p in [last(f"{name}/train-step.json")] for r in rows(p)]
if not steps:
    sys.exit("plan: no train step at 2 x 9,220 on CUDA in bf16 (paper-9220*/train-step.json)")
train, train_path = max(steps, key=lambda s: s[0]["tokens_per_second"])


def sampling(long_tail, paper):
    """The faster continuous run of a long-tail file (its rows after the waves), else the
    paper-shape run."""
    path = last(f"{long_tail}/generate.json")
    runs = rows(path)[1:]
    if runs:
        return max(runs, key=lambda r: r["tokens_per_second"]), path
    path = last(f"{paper}/generate.json")
    got = rows(path)
    return (got[-1], path) if got else (None, None)


notes = [f"train step: {train_path.relative_to(root)} ({train['tokens_per_second']:.0f} tokens/s, the fastest way run)"]
for kv, long_tail, paper in (("measured", "generate-long-tail-paged", "generate-paper"),
                             ("fp8-kv", "generate-long-tail-paged-fp8", "generate-paper-fp8")):
    row, path = sampling(long_tail, paper)
    if row is None:
        if kv == "measured":
            sys.exit("plan: no sampling run on CUDA in bf16 (generate-long-tail-paged or generate-paper)")
        continue
    (stage / kv).mkdir()
    (stage / kv / "train-step.json").write_text(json.dumps([train], indent=1))
    (stage / kv / "generate.json").write_text(json.dumps([row], indent=1))
    notes.append(f"{kv}: sampling {path.relative_to(root)}, the row of {row['tokens_per_second']:.0f} tokens/s "
                 f"({row['shape']})")
(stage / "inputs.txt").write_text("\n".join(notes) + "\n")
PY
mkdir -p "$stage/out"
for kv in measured fp8-kv; do
    [ -d "$stage/$kv" ] || continue
    "$acpo" bench paper-plan --measured "$stage/$kv" --out "$stage/out/$kv" > /dev/null
    cp "$stage/$kv/train-step.json" "$stage/$kv/generate.json" "$stage/out/$kv/"
done
{
    echo "# Computed on the CPU after the loan by tools/gpu/plan.sh ($("$acpo" --version 2>/dev/null | head -1), the tree at"
    echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)): acpo bench paper-plan over these rates"
    sed 's/^/# /' "$stage/inputs.txt"
} > "$stage/out/commands.txt"
mv "$stage/out" "$out"
echo "plan: $out"
cat "$out/commands.txt"
