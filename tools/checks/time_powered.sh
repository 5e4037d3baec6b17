#!/usr/bin/env bash
# Issue #38: the powered run from a fresh clone, timed by phase. Clones this repository's HEAD
# into a scratch directory, builds the release binary (dependencies come from
# $CARGO_TARGET_DIR when it is set, as .ci/run does), trains and reports the powered design
# (REPRODUCE.md, "Powered"), archives it, and writes the phases' wall times into
# results/mini-powered.timing.{json,md} of this repository, with the archive beside them.
#
#   bash tools/checks/time_powered.sh [SCRATCH_DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
scratch="${1:-$(mktemp -d)/fresh}"
t0=$(date +%s)
git clone -q "$repo" "$scratch"
cd "$scratch"
t1=$(date +%s)
cargo build --release
t2=$(date +%s)
cargo run --release -- reproduce all --scale mini --models qwen3-mini-xs,qwen3-mini-s --seeds 20 \
    --results results/powered --figures figures/powered
t3=$(date +%s)
cargo run --release -- archive results/powered/mini/*/ --out results/mini-powered.tar.gz --no-checkpoints
t4=$(date +%s)
cp results/mini-powered.tar.gz results/mini-powered.tar.gz.sha256 "$repo/results/"
printf '{"clone_s": %d, "build_s": %d, "train_and_report_s": %d, "archive_s": %d, "total_s": %d, "cpus": %d}\n' \
    $((t1-t0)) $((t2-t1)) $((t3-t2)) $((t4-t3)) $((t4-t0)) "$(nproc)" > "$repo/results/mini-powered.timing.json"
{
    echo "| phase | wall time |"
    echo "|---|---:|"
    echo "| clone | $((t1-t0)) s |"
    echo "| release build | $((t2-t1)) s |"
    echo "| 160 runs trained and evaluated, reports | $(((t3-t2)/60)) min $(((t3-t2)%60)) s |"
    echo "| archive | $((t4-t3)) s |"
    echo "| total | $(((t4-t0)/60)) min $(((t4-t0)%60)) s |"
    echo
    echo "On $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)."
} > "$repo/results/mini-powered.timing.md"
cat "$repo/results/mini-powered.timing.md"
