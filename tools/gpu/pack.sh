#!/usr/bin/env bash
# What tools/gpu/suite.sh needs on a GPU machine, into target/gpu/ (`just pack-gpu-suite`, after
# `just build-cuda`): the CUDA binary and the CUDA test binary, stripped, in one tar.xz; the
# kernel checks (kernels/check/*_check.cu) built for sm_90 by nvcc from the CUDA 13.0 wheels; the
# prepared data ($ACPO_DATA_DIR) and the Qwen3 tokenizer ($ACPO_QWEN3_TOKENIZER) as tar.xz; the
# commit and the build path. Then the size of what a device call carries (the working tree and
# target/gpu), refused above the device tool's 64 MiB.
#
#   bash tools/gpu/pack.sh              the whole pack (the CUDA release binary built first)
#   bash tools/gpu/pack.sh checks DIR   only the kernel checks, into DIR (the suite's dry run)
#   bash tools/gpu/pack.sh size         only the size check
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu
limit=$((64 << 20))

# The kernel checks, built by nvcc for Hopper. The wheels ship the shared CUDA runtime only (no
# libcudart_static.a, nor the device runtime libcudadevrt.a, both nvcc's defaults), so they link
# the runtime shared and no device runtime (no kernel launches another): -cudart shared
# -cudadevrt none.
checks() {
    local dir=$1
    mkdir -p "$dir"
    eval "$(tools/gpu/cuda-toolkit.sh)"
    for check in flash adamw ops; do
        nvcc -O3 -std=c++17 -arch=sm_90 -cudart shared -cudadevrt none -Ikernels \
            "kernels/check/${check}_check.cu" -o "$dir/${check}_check"
    done
}

# Bytes a device call carries: tracked files and untracked ones git does not ignore, and
# target/gpu.
size() {
    local tree gpu
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
        | awk '{s += $1} END {print s + 0}')
    gpu=$( (du -sb "$out" 2>/dev/null || echo 0) | cut -f1)
    gpu=${gpu:-0}
    awk -v t="$tree" -v g="$gpu" -v d="$out" 'BEGIN {
        printf "carried: working tree %.1f MiB + %s %.1f MiB = %.1f MiB (limit 64 MiB)\n",
            t / 1048576, d, g / 1048576, (t + g) / 1048576 }'
    if [ $((tree + gpu)) -gt "$limit" ]; then
        echo "pack.sh: over the device tool's 64 MiB: the call would be refused" >&2
        return 1
    fi
}

case "${1:-all}" in
    checks) checks "${2:?pack.sh checks DIR}"; exit 0 ;;
    size) size; exit $? ;;
    all) ;;
    *) echo "usage: $0 [checks DIR | size]" >&2; exit 2 ;;
esac

rm -rf "$out" && mkdir -p "$out"
strip -o "$out/acpo-cuda" "${CARGO_TARGET_DIR:-target}/release/acpo"
eval "$(tools/gpu/cuda-toolkit.sh)"
cargo test --features cuda --no-run --message-format=json \
    | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "it"]' \
    | head -1 | xargs -I{} strip -o "$out/it-cuda" {}
checks "$out"
xz -T0 -9 -f "$out/flash_check" "$out/adamw_check" "$out/ops_check"
# The two Rust binaries share most of their code (the library, candle's and our PTX): one xz
# stream with a window wider than either finds the second's copy in the first (24 MB against
# 31 MB as two files), room in the call's 64 MiB for the data and the tokenizer. One thread:
# xz's threads cut the stream into blocks that cannot see each other.
tar -cf - -C "$out" acpo-cuda it-cuda | xz -T1 --lzma2=preset=9e,dict=192MiB > "$out/bins.tar.xz"
rm "$out/acpo-cuda" "$out/it-cuda"
if [ -n "${ACPO_DATA_DIR:-}" ]; then
    tar -cJf "$out/data.tar.xz" -C "$ACPO_DATA_DIR" $(cd "$ACPO_DATA_DIR" && ls *.jsonl)
fi
if [ -n "${ACPO_QWEN3_TOKENIZER:-}" ]; then
    tar -cJf "$out/tokenizer.tar.xz" -C "$ACPO_QWEN3_TOKENIZER" tokenizer.json tokenizer_config.json
fi
git rev-parse HEAD > "$out/commit"
pwd > "$out/built-in"
ls -l "$out"
size
