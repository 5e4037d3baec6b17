#!/usr/bin/env bash
# Issue #48: runs a command as if the CPU's L1 data cache had another size and associativity,
# to see whether its results depend on it. gemm reads the cache geometry from
# /sys/devices/system/cpu/cpu*/cache/ (gemm_common::cache) and takes its depth blocks from it;
# this mounts a copy of that tree whose L1d entries say SIZE and WAYS, in a private mount
# namespace (root and util-linux's unshare needed; nothing outside the command sees it).
#
#   bash tools/checks/l1_geometry.sh 48K 12 -- acpo train experiments/mini/mini-xs-ppo.yaml --out /tmp/l1-48k
#
# 32K 8 is this project's machines (AMD EPYC), 48K 12 Intel since Ice Lake and AMD Zen 5. Before
# issue #48's fix the two gave different runs (REPRODUCE.md, "Known sources of nondeterminism");
# after it, the same bytes.
set -euo pipefail
if [ $# -lt 4 ] || [ "$3" != "--" ]; then
    echo "usage: $0 SIZE WAYS -- COMMAND [ARG ...]   (e.g. 48K 12)" >&2
    exit 2
fi
size=$1
ways=$2
shift 3
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT
sys=/sys/devices/system/cpu
for cpu in "$sys"/cpu[0-9]*; do
    [ -d "$cpu/cache" ] || continue
    for index in "$cpu"/cache/index*; do
        dst="$fake/$(basename "$cpu")/cache/$(basename "$index")"
        mkdir -p "$dst"
        for f in level type size ways_of_associativity coherency_line_size shared_cpu_list; do
            [ -r "$index/$f" ] && cat "$index/$f" >"$dst/$f"
        done
        if [ "$(cat "$dst/level")" = 1 ] && [ "$(cat "$dst/type")" = Data ]; then
            echo "$size" >"$dst/size"
            echo "$ways" >"$dst/ways_of_associativity"
        fi
    done
done
for f in online possible present; do
    [ -r "$sys/$f" ] && cat "$sys/$f" >"$fake/$f"
done
unshare -m --propagation private sh -c 'mount --bind "$0" /sys/devices/system/cpu && exec "$@"' "$fake" "$@"
