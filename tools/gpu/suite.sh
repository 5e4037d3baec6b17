#!/usr/bin/env bash
# The GPU suite (issues #44, #55): everything in one lent call, the sections ordered by what
# changed since the last run (the kernels and the decode step first). In fail-fast order, each
# step's raw results packed into $OUT as soon as it ends:
#
#   1 kernels    the AdamW step, every other kernel (the fused decode chain too) and, longest,
#                last, the flash kernels against float64 references and their CPU twins, timed
#                (kernels/check/*_check.cu, built by `just pack-gpu-suite`)                 gate
#   2 decode     sampling the way a paper run samples: `acpo bench generate` at 64 prompts x
#                (1,024 + SUITE_DECODE_NEW, default 1,024) with its HBM roofline; then
#                as many rows as a GRPO step samples, SUITE_TAIL_BATCH (default 1,024, every
#                prompt distinct, of 1,024 tokens), with long-tailed response lengths up to
#                SUITE_TAIL_NEW (default 2,048; most short, a tail to the limit, as a GRPO
#                run's), over the paged KV cache at the batch its pool holds (enough rows that
#                a step reads mostly the cache), beside the KV-bandwidth bound; then the
#                evaluations' shape (SUITE_EVAL_BATCH rows, default 2,048, as many as 128
#                problems x Avg@16's 16 samples, prompts of the benchmarks' mean length): the
#                bf16 rates the plan needs, first; then HF `generate` at the paper shape with
#                its static cache (tools/twins/bench_generate_torch.py, the same call's
#                reference for acpo's paper-shape run); then the paper shape and the rollouts over
#                an FP8 KV cache (--kv-cache fp8; the three paged runs predicted by `acpo bench
#                decode-predict`); then, with SUITE_TAIL_DENSE=1 (the default), waves against
#                continuous batching over the dense cache at SUITE_DENSE_BATCH rows (default
#                128, 32 at once); last, the launches of one decode step counted by ncu
#                (tools/gpu/launches.py)
#   3 step       the Qwen3-1.7B train step at 2 x 2,048 (a gate) and 2 x 9,220, `--trace`
#                (memory and seconds by phase), beside the PyTorch twin
#                (tools/twins/bench_train_torch.py; an out-of-memory exit is a result); then the
#                same steps with each layer's backward by hand (traced), and with the attention's
#                backward in 5 products (`--flash-backward five`), 2 x 9,220 first; then ncu's kernel times of
#                one train step by hand at 4 of the model's layers, most time first
#                (tools/gpu/launches.py --ends-at adamw_sq_total)
#   4 attention  one layer's attention, forward and backward, at 2 x 9,220 then 2 x 2,048:
#                `acpo bench attention`, again with the backward in 5 products, then torch's
#                sdpa (tools/twins/bench_attention_torch.py)
#   5 pipeline   `acpo pipeline` on qwen3-1.7b-grpo at paper shape, 2 steps, in the time left
#                but the tests' (its metrics are written step by step); its rollouts and
#                evaluation over the paged KV cache (`--paged-kv`; SUITE_PIPELINE_KV=dense for
#                the dense cache every earlier run used)
#   6 tests      the Rust CUDA tests (every kernel against its CPU twin, the model, training),
#                those no committed run shows passed on a GPU first
#
# SUITE_SHARES="decode=180 step=135" sets sections' shares for one call (below).
# SUITE_STEPS picks the sections (default: all, in the order above), so that a second call
# reruns only what the first left: SUITE_STEPS="pipeline tests" bash tools/gpu/suite.sh.
#
# A gate that fails stops the suite (SUITE_KEEP_GOING=1 runs on): what comes after it would
# measure broken kernels or a binary that does not start. Each section has its own share of
# SUITE_SECONDS (default 480: 8 minutes, so that one rerun fits in a lent machine's time): kernels
# 45 s, decode 150, step 165, attention 45, tests 70, the pipeline what they leave. The shares of
# the sections still to come are kept from the ones before, so a slow section cannot starve a
# later gate. Every step runs under the smaller of its own limit and what its section and the
# call leave; a step the time cut (124) is reported "cut", not failed, and stops no gate.
# Times on the last run (an H200, results/gpu/NVIDIA-H200-20261126) and the H100 before it:
# docs/CUDA.md, "The next GPU run".
#
#   bash tools/gpu/suite.sh                on the GPU machine, `target/gpu` carried:
#                                          run(command="bash tools/gpu/suite.sh", carry=["target/gpu"])
#   bash tools/gpu/suite.sh --dry-run      on any machine (CI, `.ci/run`): every build the pack does
#                                          (the checks through nvcc with the CUDA 13.0 wheels,
#                                          `-cudart shared -cudadevrt none`: the wheels have no
#                                          static runtimes) and each step's command at toy shapes on the
#                                          CPU, with the CPU binary ($ACPO_BIN, default
#                                          target/debug/acpo) and test binary ($ACPO_IT_BIN)
#
# Without $OUT (a user's own GPU: `just gpu-suite`) the results stay in
# results/gpu/<device>-<date>/; `just gpu-report DIR` makes the docs' GPU blocks from them.
set -uo pipefail
dry=0
case "${1:-}" in
    --dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
repo=$(pwd)
start=$(date +%s)
# A dry run is the CPU's (the emulator, a busy CI machine): its steps, its sections and the run
# get 20 times their time.
slow=$([ "$dry" = 1 ] && echo 20 || echo 1)
# A longer call than the default (`just gpu-suite` on a user's own GPU) scales every share and
# limit with it, so a slower GPU is not cut at a lent machine's shares.
if [ -n "${SUITE_SECONDS:-}" ] && [ "$SUITE_SECONDS" -gt $((480 * slow)) ] 2>/dev/null; then
    slow=$((SUITE_SECONDS / 480))
fi
deadline=$((start + ${SUITE_SECONDS:-$((480 * slow))}))
cfg=experiments/paper/configs/qwen3-1.7b.json
lens=(2048 9220)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-')
if [ "$dry" = 1 ]; then
    res=$(mktemp -d)/gpu-suite
elif [ -n "${OUT:-}" ]; then
    res=$(mktemp -d)/gpu-suite
else
    res="results/gpu/${gpu:-unknown}-$(date -u +%Y%m%d)"
fi
mkdir -p "$res"
bin=$(mktemp -d)
log() { echo "$*" | tee -a "$res/summary.txt"; }
# The results travel back as one archive (no model weights), rewritten after every step so that
# a call cut at its limit still returns what it finished; the summary beside it.
save() {
    [ -n "${OUT:-}" ] && [ "$dry" = 0 ] || return 0
    # written beside and renamed, so that a call killed mid-write still returns the last whole
    # one; tar's 1 ("file changed as we read it": a step's child still writing its log) is a
    # whole archive too
    tar -czf "$OUT/.gpu-suite.tar.gz" --exclude='*.safetensors' -C "$(dirname "$res")" gpu-suite
    [ $? -le 1 ] && mv -f "$OUT/.gpu-suite.tar.gz" "$OUT/gpu-suite.tar.gz"
    cp "$res/summary.txt" "$OUT/.summary.txt" 2>/dev/null && mv -f "$OUT/.summary.txt" "$OUT/summary.txt"
}
failed=0
steps=" ${SUITE_STEPS:-kernels decode step attention pipeline tests} "
for want in $steps; do
    case "$want" in
        kernels | decode | step | attention | pipeline | tests) ;;
        *) echo "suite: SUITE_STEPS names '$want'; the sections are kernels decode step attention pipeline tests" >&2; exit 2 ;;
    esac
done
# wanted SECTION: whether SUITE_STEPS includes it.
wanted() { [[ "$steps" == *" $1 "* ]]; }
# The pipeline's samplers: checked here, before any section spends the call's time.
case "${SUITE_PIPELINE_KV:-paged}" in
    paged) pipe_kv=(--paged-kv) ;;
    dense) pipe_kv=() ;;
    *) echo "suite: SUITE_PIPELINE_KV is '${SUITE_PIPELINE_KV}'; it is paged or dense" >&2; exit 2 ;;
esac

# Each section's share of the call (seconds on a GPU; `pipeline` takes what the others leave).
order=(kernels decode step attention pipeline tests)
declare -A share=([kernels]=45 [decode]=150 [step]=165 [attention]=45 [pipeline]=0 [tests]=70)
# SUITE_SHARES="decode=180 step=135" sets some of them for one call (a lent machine's time spent
# where this call's issues need it; their sum at most SUITE_SECONDS); a share of 0 is "what the
# others leave", the pipeline's default.
for kv in ${SUITE_SHARES:-}; do
    name=${kv%%=*} secs=${kv#*=}
    if ! [[ "$name" =~ ^(kernels|decode|step|attention|pipeline|tests)$ && "$secs" =~ ^(0|[1-9][0-9]{0,4})$ ]]; then
        echo "suite: SUITE_SHARES has '$kv'; each is SECTION=SECONDS (0 to 99999), the sections ${order[*]}" >&2
        exit 2
    fi
    share[$name]=$secs
done
# The sampling runs' rows (below): a count each, checked before the call spends anything.
for name in SUITE_TAIL_BATCH SUITE_DENSE_BATCH SUITE_EVAL_BATCH; do
    value=${!name-}
    if [ -n "${!name+set}" ] && ! [[ "$value" =~ ^[1-9][0-9]{0,5}$ ]]; then
        echo "suite: $name is '$value'; it is a count of rows, 1 to 999999" >&2
        exit 2
    fi
done
case "${SUITE_TAIL_DENSE:-1}" in
    0 | 1) ;;
    *) echo "suite: SUITE_TAIL_DENSE is '${SUITE_TAIL_DENSE}'; it is 1 (the dense engines' long-tail run) or 0" >&2; exit 2 ;;
esac
# shares_after SECTION: the shares of the wanted sections after it, kept for them.
shares_after() {
    local after=0 sum=0 s
    for s in "${order[@]}"; do
        [ "$after" = 1 ] && wanted "$s" && sum=$((sum + share[$s] * slow))
        [ "$s" = "$1" ] && after=1
    done
    echo "$sum"
}
# section NAME: starts a section; its steps end by its share's end, and before the shares of
# the sections after it.
section_end=$deadline
section() {
    local now; now=$(date +%s)
    section_end=$((deadline - $(shares_after "$1")))
    if [ "${share[$1]}" -gt 0 ] && [ $((now + share[$1] * slow)) -lt "$section_end" ]; then
        section_end=$((now + share[$1] * slow))
    fi
    log "== section $1: $((section_end > now ? section_end - now : 0)) s"
}
# step NAME SECONDS LOGFILE CMD...: runs CMD under the smaller of SECONDS and what its section
# and the call leave, logs the command and its exit (124: cut by a time limit), saves. `cut` says
# whether the time the section or the call left (not the step's own limit) stopped it.
cut=0
step() {
    local name=$1 limit=$(($2 * slow)) logfile=$3; shift 3
    local left=$((section_end - $(date +%s)))
    cut=0
    if [ "$left" -lt 10 ]; then
        cut=1
        log "== $name: cut, not run (its section's time is spent)"
        return 124
    fi
    local own=$limit
    [ "$limit" -gt "$left" ] && limit=$left
    echo "$(date -u +%H:%M:%S) $*" >> "$res/commands.txt"
    local t0; t0=$(date +%s)
    timeout "$limit" "$@" > "$res/$logfile" 2>&1
    local rc=$?
    [ $rc = 124 ] && [ "$limit" -lt "$own" ] && cut=1
    log "== $name: exit $rc in $(( $(date +%s) - t0 )) s$([ $rc = 124 ] && echo " ($([ $cut = 1 ] && echo "cut: its section's time ran out" || echo "its own limit") at ${limit} s)")"
    save
    return $rc
}
# passed RC: a step's exit counted; one the section's time cut is neither passed nor failed.
passed() {
    [ "$1" = 0 ] && return 0
    [ "$1" = 124 ] && [ "$cut" = 1 ] && return 0
    failed=1
}
# gate RC NAME: a failed gate stops the suite, unless SUITE_KEEP_GOING=1; a gate the section's
# time cut stops nothing (what needs it is cut too, or runs in its own share).
gate() {
    [ "$1" = 0 ] && return 0
    if [ "$1" = 124 ] && [ "$cut" = 1 ]; then
        log "== $2: cut (its section's time ran out), not a failure"
        return 0
    fi
    failed=1
    if [ "${SUITE_KEEP_GOING:-0}" != 1 ]; then
        log "== stopped: $2 failed (a gate; SUITE_KEEP_GOING=1 runs on)"
        finish
    fi
}
finish() {
    [ -n "${jit_pid:-}" ] && jit_wait
    save
    # A dry run's results are the binaries' own files at toy shapes: tools/gpu/report.py reads
    # them as it will read a GPU's, at the dry run's lengths (a format it no longer parses fails
    # here, not after a loan).
    if [ "$dry" = 1 ]; then
        if ACPO_REPORT_LENGTHS="${lens[*]}" python3 tools/gpu/report.py "$(dirname "$res")" \
            > "$res/report.log" 2>&1; then
            log "== tools/gpu/report.py over the dry run's results: ok"
        else
            log "== tools/gpu/report.py over the dry run's results: FAILED (see $res/report.log)"
            tail -20 "$res/report.log"
            failed=1
        fi
    fi
    echo "raw results: ${OUT:-$res}"
    echo "---- summary ----"
    cat "$res/summary.txt"
    exit $failed
}
# torch NAME SECONDS LOGFILE SCRIPT ARGS...: a PyTorch twin, where python3 has torch (the GPU
# machine); elsewhere (a dry run) it says so and skips.
torch_ok=
torch_step() {
    local name=$1 limit=$2 logfile=$3; shift 3
    # whether python3 has torch with a GPU, asked once (an import costs ~3 s a twin)
    if [ -z "$torch_ok" ]; then
        python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null \
            && torch_ok=1 || torch_ok=0
    fi
    if [ "$torch_ok" != 1 ]; then
        log "== $name: skipped (no torch with a GPU here)"
        return 0
    fi
    step "$name" "$limit" "$logfile" python3 "$@"
    tail -2 "$res/$logfile" | tee -a "$res/summary.txt"
}

# ---- 0: the machine, the binaries, the data
if [ "$dry" = 1 ]; then
    # What the GPU machine gets from `just pack-gpu-suite`, made here at toy scale: the checks
    # built by nvcc (when the toolkit installs), the CPU binaries, a tiny model's config.
    acpo=${ACPO_BIN:-${CARGO_TARGET_DIR:-target}/debug/acpo}
    [ -x "$acpo" ] || { echo "suite --dry-run: no CPU binary at $acpo (cargo build, or set ACPO_BIN)" >&2; exit 2; }
    if tools/gpu/cuda-toolkit.sh > /dev/null 2>&1; then
        step "build the kernel checks (tools/gpu/pack.sh: nvcc, CUDA 13.0 wheels)" 300 \
            build-checks.log bash tools/gpu/pack.sh checks "$bin/nvcc"
        gate $? "the nvcc build of kernels/check/*_check.cu"
    else
        log "== nvcc build of the kernel checks: skipped (the CUDA toolkit could not be set up here)"
    fi
    for check in flash adamw ops; do
        step "build ${check}_check (the emulator)" 300 "build-$check-emu.log" \
            g++ -O2 -std=c++17 -DACPO_EMU -Ikernels -x c++ "kernels/check/${check}_check.cu" \
            -o "$bin/${check}_check"
        gate $? "the emulator build of kernels/check/${check}_check.cu"
    done
    step "the pack's size (tools/gpu/pack.sh size)" 60 pack-size.log bash tools/gpu/pack.sh size
    tail -1 "$res/pack-size.log" | tee -a "$res/summary.txt"
    tiny="$bin/tiny.json"
    python3 - "$cfg" "$tiny" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
json.dump(c, open(sys.argv[2], "w"))
EOF
    cfg=$tiny
    lens=(64 96)
    device=cpu
    # The pipeline at toy lengths: the paper manifest with short prompts and responses, two
    # samples an evaluation problem, the small model of tests/it/pipeline.rs (the real
    # tokenizer's vocabulary).
    manifest="$bin/qwen3-1.7b-grpo.yaml"
    sed -e 's/max_prompt_length: 1024/max_prompt_length: 48/' \
        -e 's/max_response_length: 8196/max_response_length: 6/' \
        -e 's/max_new_tokens: 8196/max_new_tokens: 6/' -e 's/^  k: 16 /  k: 2 /' \
        experiments/paper/qwen3-1.7b-grpo.yaml > "$manifest"
    pipe_cfg=(--config tests/fixtures/pipeline-qwen3.json --device cpu)
    data=${ACPO_DATA_DIR:-}
    tokenizer=${ACPO_QWEN3_TOKENIZER:-}
    it=${ACPO_IT_BIN:-}
else
    {
        date -u; uname -a; nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
        python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    } > "$res/machine.txt" 2>&1
    # libcudart / libcublas / libcurand: from the CUDA 13 wheels PyTorch brought, else wherever
    # the image keeps them; libcuda from the driver.
    libs=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
    for lib in libcublas.so.13 libcudart.so.13 libcurand.so.10; do
        if [ ! -e "$libs/$lib" ]; then
            # bounded: the time comes out of the first section's share
            found=$(timeout 20 find / -xdev -name "$lib" -not -path '/proc/*' -print -quit 2>/dev/null)
            [ -n "$found" ] && libs="$libs:$(dirname "$found")"
        fi
    done
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The kernels ship as PTX for compute 9.0, which the driver compiles at a process's first
    # load of each module (flash_decode's alone: ~11 s of ptxas on this project's CPU) and keeps
    # in its cache: a cache this call owns, large enough for every module, so that only the
    # first process pays, whatever the machine's home directory allows.
    export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-$bin/cuda-cache}" CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}"
    mkdir -p "$CUDA_CACHE_PATH"
    echo "CUDA_CACHE_PATH=$CUDA_CACHE_PATH CUDA_CACHE_MAXSIZE=$CUDA_CACHE_MAXSIZE" >> "$res/machine.txt"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$res/machine.txt"
    tar -xJf target/gpu/bins.tar.xz -C "$bin" && chmod +x "$bin/acpo-cuda" "$bin/it-cuda" \
        || { echo "suite: target/gpu/bins.tar.xz is missing: run \`just pack-gpu-suite\` and carry target/gpu" >&2; exit 2; }
    for f in flash_check adamw_check ops_check; do
        xz -dc "target/gpu/$f.xz" > "$bin/$f" && chmod +x "$bin/$f" \
            || { echo "suite: target/gpu/$f.xz is missing: run \`just pack-gpu-suite\` and carry target/gpu" >&2; exit 2; }
    done
    acpo=$bin/acpo-cuda
    it=$bin/it-cuda
    device=cuda
    manifest=experiments/paper/qwen3-1.7b-grpo.yaml
    pipe_cfg=()
    mkdir -p "$bin/data" "$bin/tokenizer"
    tar -xJf target/gpu/data.tar.xz -C "$bin/data" 2>/dev/null && data=$bin/data || data=
    tar -xJf target/gpu/tokenizer.tar.xz -C "$bin/tokenizer" 2>/dev/null && tokenizer=$bin/tokenizer || tokenizer=
    # The test binary finds its fixtures at the path it was built in.
    built_in=$(cat target/gpu/built-in 2>/dev/null || echo /work/main)
    if [ "$built_in" != "$repo" ] && [ ! -e "$built_in" ]; then
        mkdir -p "$(dirname "$built_in")" && ln -s "$repo" "$built_in"
    fi
fi
log "== suite on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "this machine's CPU (dry run)")"
# the pack's commit on a GPU machine (its binaries'); a dry run builds from the tree
if [ "$dry" = 1 ]; then commit=$(git rev-parse HEAD 2>/dev/null); else commit=$(cat target/gpu/commit 2>/dev/null); fi
log "== commit ${commit:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
shares=() total=0
for s in "${order[@]}"; do
    wanted "$s" || continue
    shares+=("$s $([ "${share[$s]}" -gt 0 ] && echo "$((share[$s] * slow)) s" || echo "the rest")")
    total=$((total + share[$s] * slow))
done
log "== sections: $(IFS=,; echo "${shares[*]}" | sed 's/,/, /g'); total $total s of the call's $((deadline - start)) s"
if [ "$total" -gt $((deadline - start)) ]; then
    echo "suite: the sections' shares ($total s) are more than SUITE_SECONDS ($((deadline - start)) s)" >&2
    exit 2
fi
# The driver's JIT of the PTX of acpo's kernels (and candle's), from here in the background
# while the kernel checks run on binaries of their own: each module's load timed
# (kernels-load/: what each module's JIT costs) and kept in the call's cache above. Waited for
# before the first section that runs acpo (jit_wait), so that no timed step compiles, nor sizes
# its KV pool beside this process's context; its own limit bounds the wait.
jit_pid=
if [ "$dry" = 0 ]; then
    jit=(timeout 240 "$acpo" bench kernels-load --device cuda --out "$res/kernels-load")
    echo "$(date -u +%H:%M:%S) (in the background) ${jit[*]}" >> "$res/commands.txt"
    "${jit[@]}" > "$res/kernels-load.log" 2>&1 &
    jit_pid=$!
fi
jit_wait() {
    [ -n "$jit_pid" ] || return 0
    local t0; t0=$(date +%s)
    wait "$jit_pid"
    local rc=$?
    jit_pid=
    log "== acpo bench kernels-load (in the background): exit $rc, $(grep -o '[0-9.]* s in all' "$res/kernels-load/kernels-load.md" 2>/dev/null || echo 'no report'); waited $(( $(date +%s) - t0 )) s for it"
}
save

# ---- 1: the kernels against their references (on the CPU: the emulator's build, its checks)
if wanted kernels; then
section kernels
# the short checks first (a second or two each on the H200), so that the flash check, the
# longest, cannot leave them too little of the section to start
step "adamw step check" 30 adamw_check.log "$bin/adamw_check"
gate $? "the AdamW step check"
tail -6 "$res/adamw_check.log" | tee -a "$res/summary.txt"
# every other kernel against float64 (RMSNorm, SwiGLU, RoPE, softmax, log-probs, the vocabulary
# chunks, sampling), then, on a GPU, those issue #44 changed timed at Qwen3-1.7B's shapes
step "other kernels check and timings" 60 ops_check.log "$bin/ops_check"
gate $? "the other kernels check"
tail -16 "$res/ops_check.log" | tee -a "$res/summary.txt"
step "flash kernels check" 90 flash_kernels_check.log "$bin/flash_check"
gate $? "the flash kernels check"
tail -22 "$res/flash_kernels_check.log" | tee -a "$res/summary.txt"
fi

# every section from here runs acpo: the driver's compiling is done first
jit_wait

# ---- 2: decode the way a paper run samples: acpo beside HF generate (static cache) and the
# roofline, long-tailed lengths over the paged cache, then the launches of a decode step
if wanted decode; then
    section decode
    new=${SUITE_DECODE_NEW:-1024}
    gen=(--batch 64 --prompt-len 1024 --new-tokens "$new")
    # As many rows as a GRPO step of the paper's qwen3-1.7b-grpo samples (trainer.batch_size ×
    # rollout.n = 256 × 4) at the prompt limit (with the call's shorter responses, contexts
    # nearer a paper run's), so that a decode step reads mostly the KV cache: issue #57's
    # target is the KV-bandwidth bound, out of reach where the weights are most of a step's
    # bytes (few rows, short contexts). Every prompt distinct (`--group 1`): a group's rows read
    # their shared prompt blocks one after another, much of it from L2, so their counted bytes
    # would overstate what the copy rate moved (most where the prompt is most of a row's
    # context, as here; a paper run's prompt is ~7 % of it), and the plan carries the measured
    # fraction to a paper run. `acpo bench decode-predict` predicts each run's schedule at each
    # GPU's pool, its ceiling (the cache's share of its bytes) and its seconds
    # (perf::sampling::SUITE_RUNS, which a test holds to these shapes; docs/CUDA.md);
    # tools/gpu/report.py prints the measured run's ceiling. Long-tailed lengths up to
    # SUITE_TAIL_NEW (a paper run's 8,196 would not fit the call). The paged run alone.
    tail_shape=(--batch "${SUITE_TAIL_BATCH:-1024}" --group 1 --prompt-len 1024
        --new-tokens "${SUITE_TAIL_NEW:-2048}")
    # The dense engines' comparison, waves against continuous batching (issue #20), at 32 rows
    # at once (as the H100 measured it; the memory would hold all 128 rows on an H200, one wave).
    dense_shape=(--batch "${SUITE_DENSE_BATCH:-128}" --max-batch 32 --prompt-len 1024
        --new-tokens "${SUITE_TAIL_NEW:-2048}")
    # The evaluations (issue #57: the plan's rate for them measured at their own shape): as
    # many rows as an evaluation of 128 problems × Avg@16's 16 samples (eval.k), prompts of the
    # four benchmarks' mean length (121 tokens, EVAL_PROMPT_TOKENS in src/perf/plan.rs, which a
    # test recomputes from the data), distinct as above, long-tailed answers to the rollouts'
    # limit.
    eval_shape=(--batch "${SUITE_EVAL_BATCH:-2048}" --group 1 --prompt-len 121
        --new-tokens "${SUITE_TAIL_NEW:-2048}")
    if [ "$dry" = 1 ]; then
        gen=(--batch 2 --prompt-len 16 --new-tokens 8)
        tail_shape=(--batch 8 --group 4 --prompt-len 16 --new-tokens 12)
        dense_shape=(--batch 8 --max-batch 4 --prompt-len 16 --new-tokens 12)
        eval_shape=(--batch 8 --group 1 --prompt-len 12 --new-tokens 12)
    fi
    step "acpo generate qwen3-1.7b ${gen[*]}" 60 acpo-generate.log \
        "$acpo" bench generate --config "$cfg" --device "$device" --dtype bf16 "${gen[@]}" \
        --repeats 1 --out "$res/generate-paper"
    passed $?
    tail -2 "$res/acpo-generate.log" | tee -a "$res/summary.txt"
    # A GRPO step's rollouts over the paged KV cache (issue #57: as many rows as its pool holds
    # at their real lengths, a group's prompt prefilled once): the plan's rollout rate.
    step "acpo generate long-tailed lengths, paged KV cache, qwen3-1.7b ${tail_shape[*]}" 120 \
        acpo-generate-long-tail-paged.log "$acpo" bench generate --config "$cfg" --device "$device" \
        --dtype bf16 "${tail_shape[@]}" --long-tail --paged-kv --paged-only --repeats 1 \
        --out "$res/generate-long-tail-paged"
    passed $?
    tail -2 "$res/acpo-generate-long-tail-paged.log" | tee -a "$res/summary.txt"
    # Sampling at the evaluations' shape over the paged KV cache: tools/gpu/plan.sh makes it the
    # plan's evaluation rate (the rollouts' before).
    step "acpo generate at the evaluations' shape, paged KV cache, qwen3-1.7b ${eval_shape[*]}" 90 \
        acpo-generate-eval.log "$acpo" bench generate --config "$cfg" --device "$device" \
        --dtype bf16 "${eval_shape[@]}" --long-tail --paged-kv --paged-only --repeats 1 \
        --out "$res/generate-eval"
    passed $?
    tail -2 "$res/acpo-generate-eval.log" | tee -a "$res/summary.txt"
    # HF generate with its static cache at the paper shape (issue #57's ≥ 3× target), after
    # acpo's runs the plan needs: the paged engine has never run on a GPU, and the twin's
    # static cache and compile may take its whole limit.
    torch_step "torch generate (static cache) qwen3-1.7b ${gen[*]}" 120 torch-generate-static.log \
        tools/twins/bench_generate_torch.py --config "$cfg" "${gen[@]}" --repeats 1 --cache static \
        --json "$res/torch-generate-static.json"
    # The paper shape over an FP8 KV cache (issue #57: E4M3 keys and values, half the bytes a
    # decode step reads; the decode kernel's *_fp8 instances, never run on a GPU before), after
    # the bf16 rates the plan needs.
    step "acpo generate qwen3-1.7b ${gen[*]} --kv-cache fp8" 60 acpo-generate-fp8.log \
        "$acpo" bench generate --config "$cfg" --device "$device" --dtype bf16 "${gen[@]}" \
        --kv-cache fp8 --repeats 1 --out "$res/generate-paper-fp8"
    passed $?
    tail -2 "$res/acpo-generate-fp8.log" | tee -a "$res/summary.txt"
    # The rollouts again over an FP8 KV cache (E4M3 bytes, half the KV bytes a step reads, and
    # room for twice the positions): the FP8 plan's rate (issue #57's option), after the bf16
    # rates the plan needs; the paged pool of bytes never run on a GPU before.
    step "acpo generate long-tailed lengths, paged FP8 KV cache, qwen3-1.7b ${tail_shape[*]}" 90 \
        acpo-generate-long-tail-paged-fp8.log "$acpo" bench generate --config "$cfg" \
        --device "$device" --dtype bf16 "${tail_shape[@]}" --long-tail --paged-kv --paged-only \
        --kv-cache fp8 --repeats 1 --out "$res/generate-long-tail-paged-fp8"
    passed $?
    tail -2 "$res/acpo-generate-long-tail-paged-fp8.log" | tee -a "$res/summary.txt"
    # The dense cache's waves and continuous batching (SUITE_TAIL_DENSE=1, the default; issue
    # #20's comparison, which the H100 run measured: 0 skips it).
    if [ "${SUITE_TAIL_DENSE:-1}" = 1 ]; then
        step "acpo generate long-tailed lengths, dense KV cache, qwen3-1.7b ${dense_shape[*]}" 45 \
            acpo-generate-long-tail.log "$acpo" bench generate --config "$cfg" --device "$device" \
            --dtype bf16 "${dense_shape[@]}" --long-tail --repeats 1 --out "$res/generate-long-tail"
        passed $?
        tail -3 "$res/acpo-generate-long-tail.log" | tee -a "$res/summary.txt"
    fi
    # Last in the section (the rates above are what the plan needs first): the kernels one
    # decode step launches, by name, ncu over a short run (the count does not depend on the
    # lengths); tools/gpu/launches.py finds the decode steps between the sampler's launches. A dry run parses the H100's committed profile instead, so that the parser runs;
    # a GPU machine without ncu counts nothing (no older profile passes for this run's).
    profile=
    if [ "$dry" = 1 ]; then
        log "== ncu: a dry run reads the committed H100 profile instead (the parser's check)"
        profile=results/gpu/NVIDIA-H100-80GB-HBM3-20261123/5-profile/profile/ncu.csv.gz
    elif command -v ncu > /dev/null 2>&1; then
        step "ncu: the launches of a decode step (64 prompts of 64, 4 new tokens)" 40 ncu-decode.log \
            ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            "$acpo" bench generate --config "$cfg" --device "$device" \
            --dtype bf16 --batch 64 --prompt-len 64 --new-tokens 4 --repeats 1 --out "$res/generate-ncu"
        rc=$?
        passed $rc
        # a profile ncu did not finish (cut, or an ncu that cannot profile here) is not parsed
        if [ $rc = 0 ]; then
            profile=$res/ncu-decode.log
        else
            log "== ncu: the decode profile did not finish (exit $rc); its launches are not counted"
        fi
    else
        log "== ncu: not on this machine; the launches of a decode step are not counted"
    fi
    if [ -n "$profile" ]; then
        step "the launches per decode step (tools/gpu/launches.py)" 10 launches.log \
            python3 tools/gpu/launches.py "$profile" --json "$res/launches.json"
        passed $?
        tail -1 "$res/launches.log" | tee -a "$res/summary.txt"
    fi
fi

# ---- 3: the train step, memory and time by phase, beside the twin
wanted step && section step
wanted step && for len in "${lens[@]}"; do
    step "acpo train-step qwen3-1.7b 2x$len --trace" 120 "acpo-train-$len.log" \
        "$acpo" bench train-step --config "$cfg" --device "$device" --dtype bf16 \
        --seq-len "$len" --prompt-len "$((len / 2 < 1024 ? len / 2 : 1024))" --micro-batch 2 \
        --checkpointing --trace --repeats 1 --out "$res/paper-$len"
    rc=$?
    tail -2 "$res/acpo-train-$len.log" | tee -a "$res/summary.txt"
    [ "$len" = "${lens[0]}" ] && gate $rc "the train step at 2 x $len"
    torch_step "torch train-step qwen3-1.7b 2x$len" 90 "torch-train-$len.log" \
        tools/twins/bench_train_torch.py --config "$cfg" --seq-len "$len" \
        --prompt-len "$((len / 2 < 1024 ? len / 2 : 1024))" --micro-batch 2 --checkpointing \
        --repeats 2 --json "$res/torch-train-$len.json"
done
# The same steps with another backward (issue #59), after every autograd step and its twin so
# that they never take those steps' time: each layer's backward written out by hand (item 2,
# `by-hand`), then the attention's backward in 5 products (item 3, `five`: dQ added up in
# key-block order inside the dK/dV kernel). The side-by-side decides whether either becomes the
# GPU's default. Neither has run in the step on a GPU before: a failure fails the suite (a time
# cut does not). The by-hand step is traced too (one more step after the timed one): its phases
# and each layer's parts beside the autograd step's, so that the run says which line moved.
wanted step && for variant in "by-hand --layer-by-hand --trace" "five --flash-backward five"; do
    read -r name flags <<<"$variant"
    # the paper's length first: the by-hand plan (tools/gpu/plan.sh) and issue #59's memory
    # target read it, and what the section's time cuts is the shorter one
    for len in "${lens[1]}" "${lens[0]}"; do
        # shellcheck disable=SC2086 # $flags: the variant's flags, one word each
        step "acpo train-step qwen3-1.7b 2x$len $flags" 90 "acpo-train-$len-$name.log" \
            "$acpo" bench train-step --config "$cfg" --device "$device" --dtype bf16 \
            --seq-len "$len" --prompt-len "$((len / 2 < 1024 ? len / 2 : 1024))" --micro-batch 2 \
            --checkpointing $flags --repeats 1 --out "$res/paper-$len-$name"
        passed $?
        tail -2 "$res/acpo-train-$len-$name.log" | tee -a "$res/summary.txt"
    done
done

# The kernels of one train step, by name and time, so that the next change fixes what ranks
# first: ncu over Qwen3-1.7B's shapes with 4 of its 28 layers (the layers repeat; 4 keep ncu's
# per-launch cost short), each layer's backward by hand, two timed steps; tools/gpu/launches.py
# cuts them at the optimizer's norm total. Last in the section: a cut costs nothing above. A
# dry run has no train-step profile (the parser's check is the decode section's).
if wanted step; then
    cfg4="$bin/qwen3-1.7b-4-layers.json"
    python3 - "$cfg" "$cfg4" <<'EOF4'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = min(4, c["num_hidden_layers"])
json.dump(c, open(sys.argv[2], "w"))
EOF4
    if [ "$dry" = 0 ] && command -v ncu > /dev/null 2>&1; then
        step "ncu: the kernels of a train step by hand, 4 layers of qwen3-1.7b, 2x2048" 60 ncu-train.log \
            ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            "$acpo" bench train-step --config "$cfg4" --device "$device" --dtype bf16 --seq-len 2048 \
            --prompt-len 1024 --micro-batch 2 --checkpointing --layer-by-hand --repeats 2 \
            --out "$res/train-ncu"
        rc=$?
        passed $rc
        if [ $rc = 0 ]; then
            step "the kernels of a train step (tools/gpu/launches.py --ends-at adamw_sq_total)" 10 \
                train-kernels.log python3 tools/gpu/launches.py "$res/ncu-train.log" \
                --ends-at adamw_sq_total --json "$res/train-kernels.json"
            passed $?
            tail -1 "$res/train-kernels.log" | tee -a "$res/summary.txt"
        else
            log "== ncu: the train step's profile did not finish (exit $rc); its kernels are not parsed"
        fi
    elif [ "$dry" = 1 ]; then
        # the parser on a synthetic profile: a start and a warm-up step, then two steps of six
        # launches (237 µs each: the updates, two products, a norm, the optimizer's two sums)
        step "tools/gpu/launches.py --ends-at adamw_sq_total on tools/gpu/fixtures/ncu-train-step.csv" 10 \
            train-kernels.log python3 tools/gpu/launches.py tools/gpu/fixtures/ncu-train-step.csv \
            --ends-at adamw_sq_total --json "$res/train-kernels.json"
        gate $? "the train-step profile's parser"
        step "the parser's steps: 2 of 6 launches, 237 µs, gemm first" 10 train-kernels-check.log \
            python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(not (j["steps"] == 2 and j["launches_per_step"] == 6 and abs(j["kernel_ms_per_step"] - 0.237) < 1e-9 and j["by_kernel"][0]["kernel"] == "gemm"))' \
            "$res/train-kernels.json"
        gate $? "the train-step profile's parser"
        step "acpo train-step, the profile's command without ncu (4 layers at most)" 60 train-ncu-dry.log \
            "$acpo" bench train-step --config "$cfg4" --device "$device" --dtype bf16 \
            --seq-len "${lens[0]}" --prompt-len "$((lens[0] / 2))" --micro-batch 2 --checkpointing \
            --layer-by-hand --repeats 2 --out "$res/train-ncu"
        passed $?
    else
        log "== ncu: not on this machine; the kernels of a train step are not profiled"
    fi
fi

# ---- 4: one layer's attention, acpo beside torch's sdpa
wanted attention && section attention
# The paper's length first (issue #59's attention target is at 2 × 9,220), each length's acpo
# runs before sdpa's, whose import costs seconds: what the section's time cuts is the twin at
# 2 × 2,048 first.
wanted attention && for len in "${lens[1]}" "${lens[0]}"; do
    step "acpo flash attention qwen3-1.7b 2x$len" 45 "acpo-attention-$len.log" \
        "$acpo" bench attention --config "$cfg" --device "$device" --dtype bf16 \
        --seq-len "$len" --micro-batch 2 --repeats 3 --out "$res/attention-$len"
    rc=$?
    tail -2 "$res/acpo-attention-$len.log" | tee -a "$res/summary.txt"
    gate $rc "acpo bench attention"
    # the same layer with the backward in 5 products (issue #59 item 3)
    step "acpo flash attention qwen3-1.7b 2x$len --flash-backward five" 30 \
        "acpo-attention-$len-five.log" "$acpo" bench attention --config "$cfg" --device "$device" \
        --dtype bf16 --seq-len "$len" --micro-batch 2 --flash-backward five --repeats 3 \
        --out "$res/attention-$len-five"
    passed $?
    tail -2 "$res/acpo-attention-$len-five.log" | tee -a "$res/summary.txt"
    torch_step "torch sdpa attention qwen3-1.7b 2x$len" 45 "torch-attention-$len.log" \
        tools/twins/bench_attention_torch.py --config "$cfg" --seq-len "$len" --micro-batch 2 \
        --json "$res/torch-attention-$len.json"
done

# ---- 5: a paper run end to end on random weights, in the time left but the tests'
if ! wanted pipeline; then
    :
elif [ -n "$data" ] && [ -n "$tokenizer" ]; then
    section pipeline
    log "== the pipeline's samplers: ${SUITE_PIPELINE_KV:-paged} KV cache"
    step "acpo pipeline qwen3-1.7b-grpo (2 steps)" 600 pipeline-qwen3-1.7b-grpo.log \
        "$acpo" pipeline "$manifest" "${pipe_cfg[@]}" \
        --divisor 64 --steps 2 --eval-limit 1 --micro-batch 2 --tokenizer "$tokenizer" \
        --data-dir "$data" --results "$res/pipeline-results" --models "$bin/models" \
        --out "$res/pipeline" "${pipe_kv[@]}"
    tail -3 "$res/pipeline-qwen3-1.7b-grpo.log" | tee -a "$res/summary.txt"
else
    log "== acpo pipeline: skipped (no prepared data or no Qwen3 tokenizer: ACPO_DATA_DIR, ACPO_QWEN3_TOKENIZER)"
fi

# ---- 6: the Rust CUDA tests
if ! wanted tests; then
    :
elif [ -n "$it" ]; then
    section tests
    # The tests no GPU has passed yet first (the committed runs' cuda_tests.log say which have:
    # this tree's results/gpu), then those a GPU has passed, in one log, so that what the
    # section's time cuts is a test a GPU already passed. Each run prints its own `test result`.
    # (names of any depth; the listing's own count checks the parse, else the binary runs whole)
    listing=$("$it" cuda:: --list 2>/dev/null)
    listed=$(sed -n 's/^\(cuda::[A-Za-z0-9_:]*\): test$/\1/p' <<<"$listing" | LC_ALL=C sort)
    count=$(sed -n 's/^\([0-9][0-9]*\) tests\{0,1\}, .*/\1/p' <<<"$listing")
    # A test a GPU has passed: one a committed log started in a run that reached its `test
    # result` line (a run cut or crashed passed nothing), less those its list of failures names.
    logs=(results/gpu/*/*/gpu-suite/cuda_tests.log)
    before=$(LC_ALL=C comm -23 \
        <(awk '/^running /{n=0} /^test cuda::/{b[n++]=$2} /^test result/{for(i=0;i<n;i++)print b[i]; n=0}' \
            "${logs[@]}" 2>/dev/null | LC_ALL=C sort -u) \
        <(sed -n 's/^    \(cuda::[A-Za-z0-9_:]*\)$/\1/p' "${logs[@]}" 2>/dev/null | LC_ALL=C sort -u))
    if [ -z "$listed" ] || [ "$(grep -c . <<<"$listed")" != "$count" ]; then
        log "== cuda tests: the binary's list not read (${count:-no} tests); run whole"
        step "cuda tests" 300 cuda_tests.log "$it" cuda:: --test-threads=1 --nocapture
    else
        first=$(LC_ALL=C comm -23 <(echo "$listed") <(echo "$before") | grep .)
        again=$(LC_ALL=C comm -12 <(echo "$listed") <(echo "$before") | grep .)
        log "== cuda tests: $(grep -c . <<<"$first") no GPU has passed first, then $(grep -c . <<<"$again") again"
        # Each run's exit on a line of its own once it ends (a run the time limit kills writes
        # none), after how many runs the log holds: tools/gpu/report.py tells a cut run, whose
        # `test result` line is missing, from a crashed one.
        # shellcheck disable=SC2016 # the runs' script, single-quoted
        step "cuda tests" 300 cuda_tests.log env IT="$it" FIRST="$first" AGAIN="$again" bash -c '
            echo "cuda test runs: $(( (${#FIRST} > 0) + (${#AGAIN} > 0) ))"
            rc=0
            run() {
                [ $# -gt 0 ] || return 0
                "$IT" --exact --test-threads=1 --nocapture "$@"
                local e=$?
                echo "cuda test run exit: $e"
                [ $e = 0 ] || rc=1
            }
            run $FIRST  # (the names, one word each)
            run $AGAIN
            exit $rc'
    fi
    passed $?
    grep -E '^(test |skipped|thread |test result)|relative error' "$res/cuda_tests.log" | tee -a "$res/summary.txt"
else
    log "== cuda tests: skipped (no test binary: ACPO_IT_BIN)"
fi

finish
