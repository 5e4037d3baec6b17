#!/usr/bin/env bash
# Every GPU check of issues #18-#20 (and #24) on one GPU machine, raw results in one directory:
# the machine, the CUDA test suite (every kernel against its CPU twin, acpo against transformers'
# fixtures, the four algorithms and resume on CUDA), tools/gpu/parity.py (a Qwen3-0.6B-shaped
# random model against transformers on the same GPU, with the real Qwen3 tokenizer when
# target/gpu/qwen3-tokenizer is there), the speed benchmarks on CUDA in f32 and bf16 beside the
# CPU's; the paper-shape train step of Qwen3-1.7B against tools/twins/bench_train_torch.py at 2k and 9k
# tokens, flash attention against torch's sdpa, sampling at batch 64 × (1k + 1k) beside HF
# generate and the costed paper plan (#19, #20); then continuous batching on long-tailed lengths
# and the peak memory at 9k with each saving turned off.
#
#   bash tools/gpu/suite.sh [checks|tests|paper|sampling|extra|pipeline|all]   (default all)
#
# Sections: checks = tests (the CUDA tests) + parity + the built-in benches; paper = the
# train-step and attention comparisons + sampling (HF generate, acpo generate, the paper plan);
# extra = long-tailed sampling and peak memory with each saving off, the train step's memory
# by phase (--trace); pipeline = `acpo pipeline` on qwen3-1.7b-grpo and qwen3-1.7b-ppo (paper
# shapes, random weights, batch sizes / PIPE_DIVISOR (default 64), PIPE_STEPS steps (default 2),
# one evaluation of PIPE_EVAL_LIMIT problems per benchmark (default 1)), one run after the other
# so that one run's checkpoint is on the disk at a time, then one report of both. Shapes that a first GPU
# showed too slow for one call come from the environment: GEN_NEW (new tokens of the sampling
# comparison, default 1024), TORCH_CACHES (default static), LT_BATCH / LT_NEW / LT_SLOTS (long
# tail, default 256 / 1024 / 64), MEM_LEN (default 9220, "" for none), TRAIN_LENS (the train
# step and attention lengths, default "2048 9220"), TRAIN_STEP_JSON (the plan's train rate).
#
# A lent device call has 10 minutes and brings back 8 files, so a lease runs the sections as
# separate calls, each ending inside SUITE_SECONDS (default 540; a step that would overrun is
# cut and logged as such) and packing its directory into $OUT/gpu-suite-<section>.tar.gz after
# every step. Without $OUT (a user's own GPU: `just gpu-suite`) the results stay in
# results/gpu/<device>-<date>/. `just gpu-report DIR` makes the GPU blocks of the docs from them.
#
# Needs target/gpu/acpo-cuda.xz and target/gpu/it-cuda.xz, made on any machine by
# `just pack-gpu-suite` and carried with the working tree:
#   run(command="bash tools/gpu/suite.sh checks", carry=["target/gpu"])
set -uo pipefail
section="${1:-all}"
case "$section" in checks|tests|paper|sampling|extra|pipeline|all) ;; *) echo "usage: $0 [checks|tests|paper|sampling|extra|pipeline|all]" >&2; exit 2;; esac
repo=$(pwd)
start=$(date +%s)
deadline=$((start + ${SUITE_SECONDS:-540}))
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-')
if [ -n "${OUT:-}" ]; then
    res=$(mktemp -d)/gpu-suite
else
    res="results/gpu/${gpu:-unknown}-$(date -u +%Y%m%d)"
fi
mkdir -p "$res"
log() { echo "$*" | tee -a "$res/summary.txt"; }
# The results travel back as one archive (no model weights), rewritten after every step so that
# a call cut at its limit still returns what it finished.
save() {
    [ -n "${OUT:-}" ] || return 0
    tar -czf "$OUT/gpu-suite-$section.tar.gz" --exclude='*.safetensors' -C "$(dirname "$res")" gpu-suite
    cp "$res/summary.txt" "$OUT/summary-$section.txt" 2>/dev/null
}
# step NAME SECONDS LOGFILE CMD...: runs CMD under the smaller of SECONDS and what the deadline
# leaves, logs the exact command and its exit (124: cut by the time limit), saves.
step() {
    local name=$1 limit=$2 logfile=$3; shift 3
    local left=$((deadline - $(date +%s) - 15))
    if [ "$left" -lt 20 ]; then log "== $name: not run (the call's time is spent)"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "$(date -u +%H:%M:%S) $*" >> "$res/commands.txt"
    local t0; t0=$(date +%s)
    timeout "$limit" "$@" > "$res/$logfile" 2>&1
    local rc=$?
    log "== $name: exit $rc in $(( $(date +%s) - t0 )) s$([ $rc = 124 ] && echo " (cut at ${limit} s)")"
    save
    return $rc
}

{
    date -u; uname -a; nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} > "$res/machine.txt" 2>&1
# libcudart / libcublas / libcurand: from the CUDA 13 wheels PyTorch brought, else wherever the
# image keeps them; libcuda from the driver.
libs=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
for lib in libcublas.so.13 libcudart.so.13 libcurand.so.10; do
    if [ ! -e "$libs/$lib" ]; then
        found=$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)
        [ -n "$found" ] && libs="$libs:$(dirname "$found")"
    fi
done
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$res/machine.txt"
bin=$(mktemp -d)
xz -dc target/gpu/acpo-cuda.xz > "$bin/acpo" && chmod +x "$bin/acpo"
# The test binary finds its fixtures at the path it was built in.
built_in=$(cat target/gpu/built-in 2>/dev/null || echo /work/main)
if [ "$built_in" != "$repo" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$repo" "$built_in"
fi

log "== section $section on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
log "== commit $(cat target/gpu/commit 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
save

if [ "$section" = checks ] || [ "$section" = tests ] || [ "$section" = all ]; then
xz -dc target/gpu/it-cuda.xz > "$bin/it" && chmod +x "$bin/it"
step "cuda tests" 300 cuda_tests.log "$bin/it" cuda:: --test-threads=1 --nocapture
grep -E '^(test |skipped|thread |test result)|relative error' "$res/cuda_tests.log" | tee -a "$res/summary.txt"
# The flash kernels alone against a float64 reference, and timed beside the row kernel.
step "flash kernels check" 90 flash_kernels_check.log bash -c \
    "nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels kernels/check/flash_check.cu -o $bin/fa && $bin/fa"
tail -14 "$res/flash_kernels_check.log" | tee -a "$res/summary.txt"
fi

if [ "$section" = checks ] || [ "$section" = all ]; then

tokenizer=()
[ -f target/gpu/qwen3-tokenizer/tokenizer.json ] && tokenizer=(--tokenizer target/gpu/qwen3-tokenizer)
step "parity against transformers (Qwen3-0.6B shape)" 150 parity.log \
    python3 tools/gpu/parity.py --acpo "$bin/acpo" --out "$res/parity" "${tokenizer[@]}"
tail -4 "$res/parity.log" | tee -a "$res/summary.txt"

# The built-in sizes (issue #4's tiny and ~100M models) on CUDA, and on this machine's CPU.
for target in "cuda f32" "cuda bf16" "cpu f32"; do
    set -- $target
    for kind in train-step generate; do
        step "bench $kind $1/$2" 90 "bench-$kind-$1-$2.log" \
            "$bin/acpo" bench "$kind" --device "$1" --dtype "$2" --repeats 5 --out "$res/bench-$1-$2"
        tail -3 "$res/bench-$kind-$1-$2.log" | tee -a "$res/summary.txt"
    done
done
fi

cfg=experiments/paper/configs/qwen3-1.7b.json
if [ "$section" = paper ] || [ "$section" = all ]; then
# Side by side, one sequence length at a time: the torch twin, then acpo, both with
# checkpointing (what fits at 9k), GRPO micro-batch of 2, prompt 1,024.
for len in ${TRAIN_LENS:-2048 9220}; do
    step "torch train-step qwen3-1.7b 2x$len" 150 "torch-train-$len.log" \
        python3 tools/twins/bench_train_torch.py --config "$cfg" --seq-len "$len" --prompt-len 1024 \
        --micro-batch 2 --checkpointing --repeats 2 --json "$res/torch-train-$len.json"
    tail -2 "$res/torch-train-$len.log" | tee -a "$res/summary.txt"
    step "acpo train-step qwen3-1.7b 2x$len" 150 "acpo-train-$len.log" \
        "$bin/acpo" bench train-step --config "$cfg" --device cuda --dtype bf16 \
        --seq-len "$len" --prompt-len 1024 --micro-batch 2 --checkpointing --repeats 1 \
        --out "$res/paper-$len"
    tail -2 "$res/acpo-train-$len.log" | tee -a "$res/summary.txt"
done
# The attention kernel alone against torch's sdpa (flash backend), same shapes.
for len in ${TRAIN_LENS:-2048 9220}; do
    step "torch sdpa attention qwen3-1.7b 2x$len" 60 "torch-attention-$len.log" \
        python3 tools/twins/bench_attention_torch.py --config "$cfg" --seq-len "$len" \
        --micro-batch 2 --json "$res/torch-attention-$len.json"
    tail -1 "$res/torch-attention-$len.log" | tee -a "$res/summary.txt"
    step "acpo flash attention qwen3-1.7b 2x$len" 60 "acpo-attention-$len.log" \
        "$bin/acpo" bench attention --config "$cfg" --device cuda --dtype bf16 \
        --seq-len "$len" --micro-batch 2 --repeats 3 --out "$res/attention-$len"
    tail -2 "$res/acpo-attention-$len.log" | tee -a "$res/summary.txt"
done
fi

if [ "$section" = paper ] || [ "$section" = sampling ] || [ "$section" = all ]; then
# Sampling (issue #20): batch 64, 1k prompt + GEN_NEW new tokens (the issue's shape is 1k; on the
# first H100 neither side finished it in 150 s), acpo's engine beside HF generate.
# HF generate with each cache (static compiles the model first: over 150 s on the first H100).
new=${GEN_NEW:-1024}
for cache in ${TORCH_CACHES:-static}; do
    step "torch generate ($cache cache) qwen3-1.7b 64x(1024+$new)" 240 "torch-generate-$cache.log" \
        python3 tools/twins/bench_generate_torch.py --config "$cfg" --batch 64 --prompt-len 1024 \
        --new-tokens "$new" --repeats 1 --cache "$cache" --json "$res/torch-generate-$cache.json"
    tail -1 "$res/torch-generate-$cache.log" | tee -a "$res/summary.txt"
done
step "acpo generate qwen3-1.7b 64x(1024+$new)" 240 acpo-generate.log \
    "$bin/acpo" bench generate --config "$cfg" --device cuda --dtype bf16 --batch 64 \
    --prompt-len 1024 --new-tokens "$new" --repeats 1 --out "$res/generate-paper"
tail -2 "$res/acpo-generate.log" | tee -a "$res/summary.txt"
# The costed paper plan from the two measured rates (the longest train step measured here, or
# TRAIN_STEP_JSON; batch-64 sampling).
mkdir -p "$res/measured"
train=${TRAIN_STEP_JSON:-$res/paper-9220/train-step.json}
cp "$train" "$res/measured/train-step.json" 2>/dev/null
cp "$res/generate-paper/generate.json" "$res/measured/" 2>/dev/null
step "paper plan" 30 paper-plan.log \
    "$bin/acpo" bench paper-plan --measured "$res/measured" --out "$res/measured"
fi

if [ "$section" = extra ] || [ "$section" = all ]; then
# Long-tailed response lengths (256 prompts, ≤ 1k new tokens, 64 at once): waves against
# continuous batching.
lt_batch=${LT_BATCH:-256} lt_new=${LT_NEW:-1024} lt_slots=${LT_SLOTS:-64}
step "acpo generate long tail ${lt_batch}x(128+≤$lt_new), $lt_slots slots (waves vs continuous)" 240 \
    acpo-generate-long-tail.log \
    "$bin/acpo" bench generate --config "$cfg" --device cuda --dtype bf16 --batch "$lt_batch" \
    --prompt-len 128 --new-tokens "$lt_new" --max-batch "$lt_slots" --long-tail --repeats 1 \
    --out "$res/generate-long-tail"
tail -3 "$res/acpo-generate-long-tail.log" | tee -a "$res/summary.txt"
# Peak memory at MEM_LEN (default 9k) with one saving off at a time (an out-of-memory exit is a
# result too).
mem_len=${MEM_LEN-9220}
[ -n "$mem_len" ] && for off in "--attention composed --checkpointing" "--vocab-chunk 0 --checkpointing" ""; do
    name=$(echo "${off:-no-checkpointing}" | tr -c 'a-z0-9\n' '-')
    step "acpo train-step qwen3-1.7b 2x$mem_len ${off:-without checkpointing}" 90 \
        "acpo-train-$mem_len-$name.log" \
        "$bin/acpo" bench train-step --config "$cfg" --device cuda --dtype bf16 \
        --seq-len "$mem_len" --prompt-len 1024 --micro-batch 2 --repeats 1 $off \
        --out "$res/paper-$mem_len-$name"
    tail -2 "$res/acpo-train-$mem_len-$name.log" | tee -a "$res/summary.txt"
done
# Where the train step's memory goes, phase by phase (issue #33).
step "acpo train-step qwen3-1.7b 2x2048 --trace" 120 acpo-train-trace.log \
    "$bin/acpo" bench train-step --config "$cfg" --device cuda --dtype bf16 --seq-len 2048 \
    --prompt-len 1024 --micro-batch 2 --repeats 1 --checkpointing --trace --out "$res/paper-trace"
tail -4 "$res/acpo-train-trace.log" | tee -a "$res/summary.txt"
fi

if [ "$section" = pipeline ] || [ "$section" = all ]; then
# A paper run end to end at its shapes on random weights (issue #34), with the real tokenizer
# and the prepared data packed into target/gpu (`just pack-gpu-suite`).
pipe=(--divisor "${PIPE_DIVISOR:-64}" --steps "${PIPE_STEPS:-2}" --eval-limit "${PIPE_EVAL_LIMIT:-1}"
      --micro-batch "${PIPE_MICRO:-2}"
      --tokenizer target/gpu/qwen3-tokenizer --data-dir target/gpu/data --results "$res/pipeline-results"
      --models "$bin/models")
for run in qwen3-1.7b-grpo qwen3-1.7b-ppo; do
    step "acpo pipeline $run" 540 "pipeline-$run.log" \
        "$bin/acpo" pipeline "experiments/paper/$run.yaml" "${pipe[@]}" --out "$res/pipeline-$run"
    tail -3 "$res/pipeline-$run.log" | tee -a "$res/summary.txt"
    # the checkpoint's weights go before the next run's (64 GB of disk); its metrics stay
    find "$res/pipeline-results" -name '*.safetensors' -path '*checkpoints*' -delete
done
step "acpo pipeline report" 60 pipeline-report.log \
    "$bin/acpo" pipeline experiments/paper/qwen3-1.7b-grpo.yaml experiments/paper/qwen3-1.7b-ppo.yaml \
    "${pipe[@]}" --report-only --out "$res/pipeline"
tail -3 "$res/pipeline-report.log" | tee -a "$res/summary.txt"
fi
save
echo "raw results: ${OUT:-$res}"
echo "---- summary ----"
cat "$res/summary.txt"
