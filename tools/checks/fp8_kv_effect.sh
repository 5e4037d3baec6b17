#!/usr/bin/env bash
# What an FP8 KV cache does to Avg@16 at the mini scale: trains mini-m-grpo (the stand-in for
# Qwen2.5-Math-7B), exports its final policy, evaluates it at k = 16 with the KV cache in the
# model's dtype and rounded to FP8 E4M3 (`acpo eval --kv-cache fp8`), and compares the two
# problem by problem (tools/checks/fp8_kv_effect.py). Writes only into a fresh directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(mktemp -d)}"
mkdir "$out/work"
cargo build --release --quiet
acpo="${CARGO_TARGET_DIR:-target}/release/acpo"
"$acpo" train experiments/mini/mini-m-grpo.yaml --out "$out/work/runs"
run=$(ls -d "$out"/work/runs/mini/mini-m-grpo-*)
"$acpo" model export "$run" --out "$out/work/model"
# the run's manifest at k = 16, under the name its file must carry
sed 's/^  k: 1$/  k: 16/' "$run/manifest.yaml" > "$out/work/mini-m-grpo.yaml"
for kv in model fp8; do
    "$acpo" eval "$out/work/mini-m-grpo.yaml" --model "$out/work/model" --step 16 \
        --kv-cache "$kv" --out "$out/eval-$kv"
done
python3 tools/checks/fp8_kv_effect.py "$out/eval-model" "$out/eval-fp8" | tee "$out/fp8-kv-effect.md"
