#!/usr/bin/env bash
# The CPU traces docs/CUDA.md's predicted GPU memory is made from (issue #44; `just
# memory-trace`): the Qwen3-1.7B train step (prompt 1,024, checkpointing, flash attention,
# vocabulary chunks of 8,192) traced by phase on the CPU in f32, at its layer shapes with 1 or 2
# layers and a vocabulary of 16,384 or 32,768 (results/cpu-memory/configs/), at two lengths, and
# with each saving turned off in turn, and with every saving on and each layer's backward by hand
# (`--layer-by-hand`, issue #59). The bytes are the counting allocator's (src/device.rs):
# the tensors alive, as a GPU's pool counts them.
# `acpo bench memory-predict --measured results/cpu-memory` turns them into the prediction.
#
#   bash tools/checks/memory_trace.sh           every run (about an hour on 2 busy cores)
#   ONLY="all-l1-v16384-2048 ..." bash tools/checks/memory_trace.sh     the runs named
#
# ACPO_BIN: the binary (default target/release/acpo).
set -euo pipefail
cd "$(dirname "$0")/../.."
acpo=${ACPO_BIN:-target/release/acpo}
out=results/cpu-memory
# name  config  sequences  tokens  memory flags. One sequence a micro-batch and one layer keep
# the CPU's time down (a 1.7B-shaped layer's step at 2 × 2,048 takes about 15 minutes on a busy
# 2-core machine); the prediction scales by the tokens and the layers, and the 2 × 2,048 run of
# all savings checks it.
runs=(
    "all-b1-t1536      l1-v16384 1 1536 --attention flash --vocab-chunk 8192 --checkpointing"
    "all-b1-t2048      l1-v16384 1 2048 --attention flash --vocab-chunk 8192 --checkpointing"
    "all-b1-t2048-v32k l1-v32768 1 2048 --attention flash --vocab-chunk 8192 --checkpointing"
    "noflash-b1-t2048  l1-v16384 1 2048 --attention composed --vocab-chunk 8192 --checkpointing"
    "nochunk-b1-t2048  l1-v16384 1 2048 --attention flash --vocab-chunk 0 --checkpointing"
    "nockpt-b1-t2048   l1-v16384 1 2048 --attention flash --vocab-chunk 8192"
    "nockpt-b1-t2048-l2 l2-v16384 1 2048 --attention flash --vocab-chunk 8192"
    "all-b2-t2048      l1-v16384 2 2048 --attention flash --vocab-chunk 8192 --checkpointing"
    "byhand-b1-t1536   l1-v16384 1 1536 --attention flash --vocab-chunk 8192 --checkpointing --layer-by-hand"
    "byhand-b1-t2048   l1-v16384 1 2048 --attention flash --vocab-chunk 8192 --checkpointing --layer-by-hand"
    "byhand-b1-t2048-v32k l1-v32768 1 2048 --attention flash --vocab-chunk 8192 --checkpointing --layer-by-hand"
)
for run in "${runs[@]}"; do
    set -- $run
    name=$1 config=$2 sequences=$3 tokens=$4
    shift 4
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    echo "== $name"
    "$acpo" bench train-step --config "$out/configs/$config.json" --device cpu --dtype f32 \
        --seq-len "$tokens" --prompt-len 1024 --micro-batch "$sequences" --batch "$sequences" \
        --repeats 1 --trace "$@" \
        --out "$out/$name"
done
