#!/usr/bin/env bash
# The costed paper plan of one GPU suite run (`acpo bench paper-plan`, issues #20, #43, #57):
# arithmetic over the rates the run measured, made on the CPU after the loan so that it costs
# the GPU's time nothing. It reads DIR's raw results and writes the next numbered call folder,
# DIR/<N>-plan/: the plan from the rates of a bf16 KV cache (measured/) and, where the run
# sampled over an FP8 KV cache too (a run of the bf16 rate's kind: the paged rollouts, else the
# dense long-tail run, else the paper shape), the same plan from that run's rate (fp8-kv/), each with the
# rates it stood on, and commands.txt naming every file it read. tools/gpu/report.py reads them.
#
#   ACPO_BIN=target/release/acpo bash tools/gpu/plan.sh results/gpu/<device>-<date>
#
# The rates, as a paper run (`acpo pipeline`) would take them: the train step at 2 x 9,220
# tokens (the paper's length) as the trainer runs it by default (the suite's `--flash-backward
# five` step is not a default's rate); where the suite timed the step with each layer's backward
# by hand (`--layer-by-hand`, which a run takes with `model.layer_backward: by-hand`), the same
# plan again from that step's rate and the bf16 plan's sampling rates (by-hand/);
# sampling with long-tailed lengths over the paged KV cache (`--paged-kv`, as many rows as a
# GRPO step's rollouts, at the batch its pool holds), else the dense cache's continuous batching
# (issue #20's comparison at a smaller batch: a stand-in should the paged engine fail), else the
# paper-shape sampling run; and for the evaluations, the paged run at their
# own shape (generate-eval), else the rollouts' rate. The plan's own text says which shape each
# rate was measured at.
set -euo pipefail
dir=${1:?usage: bash tools/gpu/plan.sh results/gpu/<device>-<date>}
[ -d "$dir" ] || { echo "plan: $dir is not a directory of GPU suite results" >&2; exit 2; }
acpo=${ACPO_BIN:-target/release/acpo}
[ -x "$acpo" ] || { echo "plan: no acpo binary at $acpo (cargo build --release, or set ACPO_BIN)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
n=$(find "$dir" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*-*' -printf '%f\n' | sed 's/-.*//' \
    | sed 's/^0*//' | sed 's/^$/0/' | sort -n | tail -1)
out="$dir/$(( ${n:-0} + 1 ))-plan"
[ -e "$out" ] && { echo "plan: $out exists already" >&2; exit 2; }
stage=$(mktemp -d "$dir/.plan-staging.XXXXXX")
trap 'rm -rf "$stage"' EXIT
python3 - "$dir" "$stage" "$repo/tools/gpu" <<'PY'
import json, sys
from pathlib import Path

root, stage = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, sys.argv[3])
# the report's walk (the calls' order, dot-folders left out) and its picks of a long-tail run's rows
from report import dense_rows, found, paged_row


def last(folder, name):
    """The last `folder/name` under root in the calls' order, at any depth."""
    files = [p for p in found(root, name) if p.parent.name == folder]
    return files[-1] if files else None


def fail(message):
    """Bad or missing input: one line naming it, exit 2, nothing written (the staging goes)."""
    print(f"plan: {message}", file=sys.stderr)
    sys.exit(2)


def rows(path):
    """A report's rows measured on CUDA in bf16, each with its number of tokens/s."""
    try:
        got = json.loads(path.read_text()) if path else []
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    if not isinstance(got, list):
        fail(f"{path}: not a list of measurements")
    cuda = [r for r in got if isinstance(r, dict) and r.get("target") == "cuda/bf16"]
    for r in cuda:
        tps = r.get("tokens_per_second")
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not isinstance(r.get("shape", ""), str):
            fail(f"{path}: a cuda/bf16 row without a number `tokens_per_second` (or a text `shape`)")
    return cuda


train_path = last("paper-9220", "train-step.json")
train = rows(train_path)
if not train:
    fail("no train step at 2 x 9,220 on CUDA in bf16 (paper-9220/train-step.json)")


def device_header(path):
    """The suite header naming the GPU and its memory (`== suite on NAME, DRIVER, N MiB`) of the
    call that wrote `path`: (its summary.txt, the line), or None."""
    for folder in path.parents:
        summary = folder / "summary.txt"
        if summary.is_file():
            for line in summary.read_text(errors="replace").splitlines():
                if line.startswith("== ") and " on " in line and line.endswith(" MiB"):
                    return summary, line
        if folder == root:
            break
    return None


def dense_row(got):
    """A long-tail run's continuous batching over the dense cache (after its waves), or None."""
    dense = dense_rows(got)
    return dense[1] if dense else None


# The sampling runs a plan's rate may come from, the way a paper run samples first: the paged
# long-tail run's paged row, else the dense long-tail run's continuous batching, else the
# paper-shape run.
KINDS = (("generate-long-tail-paged", paged_row), ("generate-long-tail", dense_row),
         ("generate-paper", lambda r: r[-1] if r else None))


def sampling(suffix, kinds):
    """The first of `kinds` with a row (folders named with `suffix`): (row, its file, its kind),
    or Nones."""
    for kind, pick in kinds:
        path = last(kind + suffix, "generate.json")
        row = pick(rows(path))
        if row:
            return row, path, kind
    return None, None, None


notes = [f"train step: {train_path.relative_to(root)} ({train[-1]['tokens_per_second']:.0f} tokens/s)"]
kinds = KINDS
for kv, suffix in (("measured", ""), ("fp8-kv", "-fp8")):
    row, path, kind = sampling(suffix, kinds)
    if row is None:
        if kv == "measured":
            fail("no sampling run on CUDA in bf16 (generate-long-tail-paged, generate-long-tail or generate-paper)")
        notes.append(f"{kv}: no FP8 sampling run of the bf16 rate's kind ({kinds[0][0]}-fp8): no FP8 plan")
        continue
    # the FP8 plan from a run of the same kind as the bf16 plan's, or none: the two plans are
    # set side by side, so a rate of another shape would compare unlike things
    kinds = [k for k in KINDS if k[0] == kind]
    (stage / kv).mkdir()
    (stage / kv / "train-step.json").write_text(json.dumps([train[-1]], indent=1))
    (stage / kv / "generate.json").write_text(json.dumps([row], indent=1))
    # The GPU's memory, as the sampling call's suite header recorded it: the plan holds the rows
    # it carries to a paper run's contexts to what the sampler's pool holds there.
    header = device_header(path)
    if header:
        (stage / kv / "device.txt").write_text(f"# the header line of {header[0].relative_to(root)}\n{header[1]}\n")
    notes.append(f"{kv}: sampling {path.relative_to(root)}, the row of {row['tokens_per_second']:.0f} tokens/s "
                 f"({row.get('shape', '?')})")
    # The evaluations' own rate: the paged row of the run at their shape (bf16 alone; the FP8
    # plan's evaluations take its rollouts' rate, and its plan says so).
    if kv == "measured":
        path = last("generate-eval", "generate.json")
        ev = paged_row(rows(path))
        if ev:
            (stage / kv / "generate-eval.json").write_text(json.dumps([ev], indent=1))
            notes.append(f"{kv}: evaluations {path.relative_to(root)}, the row of "
                         f"{ev['tokens_per_second']:.0f} tokens/s ({ev.get('shape', '?')})")
# The step with each layer's backward by hand, where the suite timed it: the bf16 plan's sampling
# rates (its files, as they are) with that step's rate.
by_hand_path = last("paper-9220-by-hand", "train-step.json")
by_hand = rows(by_hand_path)
if by_hand:
    (stage / "by-hand").mkdir()
    for f in (stage / "measured").iterdir():
        (stage / "by-hand" / f.name).write_bytes(f.read_bytes())
    (stage / "by-hand" / "train-step.json").write_text(json.dumps([by_hand[-1]], indent=1))
    notes.append(f"by-hand: train step {by_hand_path.relative_to(root)} ({by_hand[-1]['tokens_per_second']:.0f} "
                 "tokens/s), the sampling rates of measured/")
else:
    notes.append("by-hand: no train step at 2 x 9,220 with each layer's backward by hand on CUDA in bf16: no by-hand plan")
(stage / "inputs.txt").write_text("\n".join(notes) + "\n")
PY
mkdir "$stage/out"
for kv in measured fp8-kv by-hand; do
    [ -d "$stage/$kv" ] || continue
    if ! "$acpo" bench paper-plan --measured "$stage/$kv" --out "$stage/out/$kv" \
        --experiments "$repo/experiments/paper" --configs "$repo/experiments/paper/configs" > /dev/null; then
        echo "plan: acpo bench paper-plan failed on the $kv rates" >&2
        exit 1
    fi
    cp "$stage/$kv"/*.json "$stage/out/$kv/"
    if [ -f "$stage/$kv/device.txt" ]; then cp "$stage/$kv/device.txt" "$stage/out/$kv/"; fi
done
{
    echo "# Computed on the CPU after the loan by tools/gpu/plan.sh with $("$acpo" --version 2>/dev/null | head -1)"
    echo "# (the checkout at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)): acpo bench paper-plan over these rates"
    sed 's/^/# /' "$stage/inputs.txt"
} > "$stage/out/commands.txt"
mv -T "$stage/out" "$out"
echo "plan: $out"
cat "$out/commands.txt"
