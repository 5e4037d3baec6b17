#!/usr/bin/env bash
# The GPU checks of issues #18-#20 in one call on a lent GPU machine (docs/CUDA.md), raw results
# under $OUT (or results/gpu/<UTC time>): the machine, the CUDA test suite (every kernel against
# its CPU twin, acpo against transformers' fixtures, the four algorithms and resume on CUDA),
# tools/gpu_parity.py (a Qwen3-0.6B-shaped random model against transformers on the same GPU,
# with the real Qwen3 tokenizer when target/gpu/qwen3-tokenizer is there), and the speed
# benchmarks on CUDA in f32 and bf16 beside the CPU's.
#
# Needs target/gpu/acpo-cuda.xz and target/gpu/it-cuda.xz, made on any machine by
# `just pack-gpu-suite` and carried with the working tree:
#   run(command="bash tools/gpu_suite.sh", carry=["target/gpu"])
set -uo pipefail
repo=$(pwd)
out="${OUT:-results/gpu/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/summary.txt"; }

{ date -u; uname -a; nvidia-smi; } > "$out/machine.txt" 2>&1
# libcudart / libcublas / libcurand from the CUDA 13 wheels PyTorch brought; libcuda from the driver
cu13=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="${cu13}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$(mktemp -d)
xz -dc target/gpu/acpo-cuda.xz > "$bin/acpo" && chmod +x "$bin/acpo"
xz -dc target/gpu/it-cuda.xz > "$bin/it" && chmod +x "$bin/it"
# The test binary finds its fixtures at the path it was built in.
built_in=$(cat target/gpu/built-in 2>/dev/null || echo /work/main)
if [ "$built_in" != "$repo" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$repo" "$built_in"
fi

log "== machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
log "== commit: $(cat target/gpu/commit 2>/dev/null || echo unknown)"

"$bin/it" cuda:: --test-threads=1 > "$out/cuda_tests.log" 2>&1
log "== cuda tests: exit $? ($(grep -E '^test result' "$out/cuda_tests.log" | tail -1))"
grep -E '^(test |skipped|thread )' "$out/cuda_tests.log" | tee -a "$out/summary.txt"

tokenizer=()
[ -f target/gpu/qwen3-tokenizer/tokenizer.json ] && tokenizer=(--tokenizer target/gpu/qwen3-tokenizer)
python3 tools/gpu_parity.py --acpo "$bin/acpo" --out "$out/parity" "${tokenizer[@]}" \
    > "$out/parity.log" 2>&1
log "== parity against transformers (Qwen3-0.6B shape): exit $?"
tail -4 "$out/parity.log" | tee -a "$out/summary.txt"

for target in "cpu f32" "cuda f32" "cuda bf16"; do
    set -- $target
    for kind in train-step generate; do
        "$bin/acpo" bench "$kind" --device "$1" --dtype "$2" --repeats 5 \
            --out "$out/bench-$1-$2" > "$out/bench-$kind-$1-$2.log" 2>&1
        log "== bench $kind $1/$2: exit $?"
        tail -3 "$out/bench-$kind-$1-$2.log" | tee -a "$out/summary.txt"
    done
done
echo "raw results: $out"
