#!/usr/bin/env bash
# The GPU checks of issues #18-#20 in one call on a lent GPU machine (docs/CUDA.md), raw results
# under $OUT (or results/gpu/<UTC time>): the machine, the CUDA test suite (every kernel against
# its CPU twin, acpo against transformers' fixtures, the four algorithms and resume on CUDA),
# tools/gpu_parity.py (a Qwen3-0.6B-shaped random model against transformers on the same GPU,
# with the real Qwen3 tokenizer when target/gpu/qwen3-tokenizer is there), and the speed
# benchmarks on CUDA in f32 and bf16 beside the CPU's; then (issue #19) the paper-shape train step
# of Qwen3-1.7B against tools/bench_train_torch.py at 2k and 9k tokens, and its peak memory with
# each of flash attention / checkpointing / vocabulary chunks turned off; and sampling at
# batch 64 × (1k + 1k) beside HF generate (issue #20).
#
#   bash tools/gpu_suite.sh [checks|paper|all]   (default all; a call has 10 minutes, so a
#                                                 lease runs `checks` and `paper` as two calls)
#
# Needs target/gpu/acpo-cuda.xz and target/gpu/it-cuda.xz, made on any machine by
# `just pack-gpu-suite` and carried with the working tree:
#   run(command="bash tools/gpu_suite.sh", carry=["target/gpu"])
set -uo pipefail
section="${1:-all}"
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

if [ "$section" = checks ] || [ "$section" = all ]; then
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
fi

if [ "$section" = paper ] || [ "$section" = all ]; then
cfg=experiments/paper/configs/qwen3-1.7b.json
# Side by side, one sequence length at a time: the torch twin, then acpo, both with
# checkpointing (what fits at 9k), GRPO micro-batch of 2, prompt 1,024.
for len in 2048 9220; do
    timeout 240 python3 tools/bench_train_torch.py --config "$cfg" --seq-len "$len" --prompt-len 1024 \
        --micro-batch 2 --checkpointing --repeats 2 --json "$out/torch-train-$len.json" \
        > "$out/torch-train-$len.log" 2>&1
    log "== torch train-step qwen3-1.7b 2x$len: exit $?"
    tail -2 "$out/torch-train-$len.log" | tee -a "$out/summary.txt"
    timeout 240 "$bin/acpo" bench train-step --config "$cfg" --device cuda --dtype bf16 \
        --seq-len "$len" --prompt-len 1024 --micro-batch 2 --checkpointing --repeats 1 \
        --out "$out/paper-$len" > "$out/acpo-train-$len.log" 2>&1
    log "== acpo train-step qwen3-1.7b 2x$len: exit $?"
    tail -2 "$out/acpo-train-$len.log" | tee -a "$out/summary.txt"
done
# The attention kernel alone against torch's sdpa (flash backend), same shapes.
for len in 2048 9220; do
    timeout 120 python3 tools/bench_attention_torch.py --config "$cfg" --seq-len "$len" \
        --micro-batch 2 --json "$out/torch-attention-$len.json" > "$out/torch-attention-$len.log" 2>&1
    log "== torch sdpa attention qwen3-1.7b 2x$len: exit $?"
    tail -1 "$out/torch-attention-$len.log" | tee -a "$out/summary.txt"
    timeout 120 "$bin/acpo" bench attention --config "$cfg" --device cuda --dtype bf16 \
        --seq-len "$len" --micro-batch 2 --repeats 3 --out "$out/attention-$len" \
        > "$out/acpo-attention-$len.log" 2>&1
    log "== acpo flash attention qwen3-1.7b 2x$len: exit $?"
    tail -2 "$out/acpo-attention-$len.log" | tee -a "$out/summary.txt"
done
# Sampling (issue #20): batch 64, 1k prompt + 1k new tokens, acpo's engine beside HF generate.
timeout 300 python3 tools/bench_generate_torch.py --config "$cfg" --batch 64 --prompt-len 1024 \
    --new-tokens 1024 --repeats 1 --json "$out/torch-generate.json" > "$out/torch-generate.log" 2>&1
log "== torch generate qwen3-1.7b 64x(1024+1024): exit $?"
tail -1 "$out/torch-generate.log" | tee -a "$out/summary.txt"
timeout 300 "$bin/acpo" bench generate --config "$cfg" --device cuda --dtype bf16 --batch 64 \
    --prompt-len 1024 --new-tokens 1024 --repeats 1 --out "$out/generate-paper" \
    > "$out/acpo-generate.log" 2>&1
log "== acpo generate qwen3-1.7b 64x(1024+1024): exit $?"
tail -2 "$out/acpo-generate.log" | tee -a "$out/summary.txt"
# The costed paper plan from the two measured rates (9k-token train step, batch-64 sampling).
mkdir -p "$out/measured"
cp "$out/paper-9220/train-step.json" "$out/generate-paper/generate.json" "$out/measured/" 2>/dev/null
"$bin/acpo" bench paper-plan --measured "$out/measured" --out "$out/measured" > "$out/paper-plan.log" 2>&1
log "== paper plan: exit $?"
# Long-tailed response lengths (256 prompts, ≤ 2k new tokens, 64 at once): waves against
# continuous batching.
timeout 300 "$bin/acpo" bench generate --config "$cfg" --device cuda --dtype bf16 --batch 256 \
    --prompt-len 256 --new-tokens 2048 --max-batch 64 --long-tail --repeats 1 \
    --out "$out/generate-long-tail" > "$out/acpo-generate-long-tail.log" 2>&1
log "== acpo generate long tail (waves vs continuous): exit $?"
tail -3 "$out/acpo-generate-long-tail.log" | tee -a "$out/summary.txt"
# Peak memory at 9k with one saving off at a time (an out-of-memory exit is a result too).
for off in "--attention composed --checkpointing" "--vocab-chunk 0 --checkpointing" ""; do
    name=$(echo "${off:-no-checkpointing}" | tr -c 'a-z0-9\n' '-')
    timeout 200 "$bin/acpo" bench train-step --config "$cfg" --device cuda --dtype bf16 \
        --seq-len 9220 --prompt-len 1024 --micro-batch 2 --repeats 1 $off \
        --out "$out/paper-9220-$name" > "$out/acpo-train-9220-$name.log" 2>&1
    log "== acpo train-step qwen3-1.7b 2x9220 ${off:-without checkpointing}: exit $?"
    tail -2 "$out/acpo-train-9220-$name.log" | tee -a "$out/summary.txt"
done
fi
echo "raw results: $out"
