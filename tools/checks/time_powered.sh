#!/usr/bin/env bash
# Issues #38 and #48: a powered run from a fresh clone, timed by phase. Clones this repository's
# HEAD into a scratch directory, builds the release binary (dependencies come from
# $CARGO_TARGET_DIR when it is set, as .ci/run does), trains and reports the powered design
# (REPRODUCE.md, "Powered"), archives it, and writes the phases' wall times into
# results/<archive>.timing.{json,md} of this repository, with the archive beside them.
#
#   bash tools/checks/time_powered.sh [xs-s | m-l] [SCRATCH_DIR]
#     xs-s (default): qwen3-mini-xs and -s at 20 seeds, results/mini-powered.tar.gz (issue #38)
#     m-l:            qwen3-mini-m and -l at 23 seeds, results/mini-powered-ml.tar.gz (issue #48)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
case "${1:-xs-s}" in
    xs-s) models=qwen3-mini-xs,qwen3-mini-s seeds=20 name=mini-powered dir=powered ;;
    m-l) models=qwen3-mini-m,qwen3-mini-l seeds=23 name=mini-powered-ml dir=powered-ml ;;
    *) echo "usage: $0 [xs-s | m-l] [SCRATCH_DIR]" >&2; exit 2 ;;
esac
runs=$((2 * 4 * seeds))
scratch="${2:-$(mktemp -d)/fresh}"
t0=$(date +%s)
git clone -q "$repo" "$scratch"
cd "$scratch"
t1=$(date +%s)
cargo build --release
t2=$(date +%s)
cargo run --release -- reproduce all --scale mini --models "$models" --seeds "$seeds" \
    --results "results/$dir" --figures "figures/$dir"
t3=$(date +%s)
cargo run --release -- archive results/"$dir"/mini/*/ --out "results/$name.tar.gz" --no-checkpoints
t4=$(date +%s)
cp "results/$name.tar.gz" "results/$name.tar.gz.sha256" "$repo/results/"
printf '{"clone_s": %d, "build_s": %d, "train_and_report_s": %d, "archive_s": %d, "total_s": %d, "cpus": %d}\n' \
    $((t1-t0)) $((t2-t1)) $((t3-t2)) $((t4-t3)) $((t4-t0)) "$(nproc)" > "$repo/results/$name.timing.json"
{
    echo "| phase | wall time |"
    echo "|---|---:|"
    echo "| clone | $((t1-t0)) s |"
    echo "| release build | $((t2-t1)) s |"
    echo "| $runs runs trained and evaluated, reports | $(((t3-t2)/60)) min $(((t3-t2)%60)) s |"
    echo "| archive | $((t4-t3)) s |"
    echo "| total | $(((t4-t0)/60)) min $(((t4-t0)%60)) s |"
    echo
    echo "On $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)."
} > "$repo/results/$name.timing.md"
cat "$repo/results/$name.timing.md"
