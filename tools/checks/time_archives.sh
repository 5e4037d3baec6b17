#!/usr/bin/env bash
# Issues #38 and #48: the shipped archives made from one commit, in one fresh clone, each timed by
# phase. Clones this repository's HEAD into a scratch directory and builds the release binary once
# (dependencies come from $CARGO_TARGET_DIR when it is set, as .ci/run does); then, for each
# archive named, in the order given: trains and reports it with its documented command (README,
# REPRODUCE.md, the justfile), archives it without checkpoints, and copies the archive, its
# .sha256 and its wall times (results/<archive>.timing.{json,md}) into this repository.
#
#   bash tools/checks/time_archives.sh ARCHIVE ...
#     SCRATCH=DIR: where the clone goes; COMMIT=REV: the commit to check out there (default HEAD),
#     to add an archive to those an earlier call made at REV
#     mini             the README's main job: 16 manifests x 5 seeds, results/mini.tar.gz
#     study            issue #23's clipping study: the six sweeps, results/study.tar.gz
#     mini-powered     qwen3-mini-xs and -s at 20 seeds (issue #38), results/mini-powered.tar.gz
#     mini-powered-ml  qwen3-mini-m and -l at 23 seeds (issue #48), results/mini-powered-ml.tar.gz
#
# A powered archive made after `mini` in the same call starts from the main job's runs of its
# models (seeds 1-5: the same manifests at the same commit, so the same runs; `reproduce` reuses
# a finished run and trains the rest); its timing says how many it reused.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -gt 0 ] || { echo "usage: $0 ARCHIVE ... (mini, study, mini-powered, mini-powered-ml)" >&2; exit 2; }
for a in "$@"; do
    case "$a" in mini | study | mini-powered | mini-powered-ml) ;; *)
        echo "$0: unknown archive '$a' (mini, study, mini-powered, mini-powered-ml)" >&2; exit 2 ;;
    esac
done
scratch="${SCRATCH:-$(mktemp -d)/fresh}"
t0=$(date +%s)
git clone -q "$repo" "$scratch"
cd "$scratch"
git checkout -q "${COMMIT:-HEAD}"
t1=$(date +%s)
cargo build --release
t2=$(date +%s)
commit=$(git rev-parse --short HEAD)

# Runs of results/mini/ whose manifest is one of the models $1 (comma-separated), copied under $2.
reuse_main_runs() {
    local n=0 d model
    [ -d results/mini ] || { echo 0; return; }
    mkdir -p "$2"
    for d in results/mini/*/; do
        model=$(sed -n 's/^name: mini-\([a-z]*\)-.*/qwen3-mini-\1/p' "$d/manifest.yaml")
        case ",$1," in *",$model,"*) cp -r "$d" "$2/"; n=$((n + 1)) ;; esac
    done
    echo "$n"
}

for a in "$@"; do
    reused=0
    case "$a" in
        mini)
            what="80 runs trained and evaluated (the README's main job), reports"
            train=(reproduce all --scale mini --seeds 5)
            runs="results/mini/*/" ;;
        study)
            what="162 runs of the six sweeps trained and evaluated, reports"
            train=(sweep sweeps/study-*.yaml --compare study)
            runs="results/sweeps/*/mini/*/" ;;
        mini-powered | mini-powered-ml)
            if [ "$a" = mini-powered ]; then
                models=qwen3-mini-xs,qwen3-mini-s seeds=20 dir=powered
            else
                models=qwen3-mini-m,qwen3-mini-l seeds=23 dir=powered-ml
            fi
            reused=$(reuse_main_runs "$models" "results/$dir/mini")
            what="$((8 * seeds)) runs ($reused reused from the main job above), reports"
            train=(reproduce all --scale mini --models "$models" --seeds "$seeds"
                --results "results/$dir" --figures "figures/$dir")
            runs="results/$dir/mini/*/" ;;
    esac
    s0=$(date +%s)
    cargo run --release -- "${train[@]}"
    s1=$(date +%s)
    # shellcheck disable=SC2086 # the run directories, globbed now that they exist
    cargo run --release -- archive $runs --out "results/$a.tar.gz" --no-checkpoints
    s2=$(date +%s)
    cp "results/$a.tar.gz" "results/$a.tar.gz.sha256" "$repo/results/"
    printf '{"build_s": %d, "train_and_report_s": %d, "runs_reused": %d, "archive_s": %d, "cpus": %d, "commit": "%s"}\n' \
        $((t2 - t1)) $((s1 - s0)) "$reused" $((s2 - s1)) "$(nproc)" "$commit" > "$repo/results/$a.timing.json"
    {
        echo "| phase | wall time |"
        echo "|---|---:|"
        echo "| release build (once, before every archive of the call) | $((t2 - t1)) s |"
        echo "| $what | $(((s1 - s0) / 60)) min $(((s1 - s0) % 60)) s |"
        echo "| archive | $((s2 - s1)) s |"
        echo
        echo "On $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $commit, from a fresh clone (tools/checks/time_archives.sh $*)."
    } > "$repo/results/$a.timing.md"
    cat "$repo/results/$a.timing.md"
done
echo "clone $((t1 - t0)) s; all done in $((($(date +%s) - t0) / 60)) min"
