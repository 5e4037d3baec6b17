# acpo: reproduce "Advantage Clipped Policy Optimization". `just --list` is the manual.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Show the recipes.
default:
    @just --list

# Run the whole test suite (the tests CI runs; `just ci` is all of CI).
[group('dev')]
test:
    cargo test

# CI, as on a clean clone (.ci/run): fmt --check, clippy -D warnings (default and cuda
# features), the tests, the Python package's tests, the generated docs' blocks.
[group('dev')]
ci:
    .ci/run

# Validate every experiment manifest (one line per run).
[group('reproduce')]
check path="experiments":
    cargo run --release -- check {{path}}

# Reproduce an artifact of the paper: table1, speedup, accuracy, entropy, tails or all, at a
# scale: mini (CPU, minutes; about 20 minutes at the shipped archive's 5 seeds: `just reproduce
# table1 mini 5`), smoke (seconds) or paper (CUDA); seeds per run (with 2 or more: the paired
# differences with 95 % intervals, and the verdict).
[group('reproduce')]
reproduce artifact="table1" scale="mini" seeds="1":
    cargo run --release -- reproduce {{artifact}} --scale {{scale}} --seeds {{seeds}}

# A grid over manifest fields x seeds, paired with a baseline (issue #23; REPRODUCE.md).
[group('reproduce')]
sweep spec:
    cargo run --release -- sweep {{spec}}

# Issue #23's study of the clipping family: the six sweeps of sweeps/ (162 runs, under half an hour
# on 2 cores), compared per family by policy updates per step (results/sweeps/study.md and
# figures/study.{png,svg}).
[group('reproduce')]
study:
    cargo run --release -- sweep sweeps/study-*.yaml --compare study

# Rebuild the study's reports from the shipped archive (verified first), no training, and
# refresh its blocks in REPRODUCE.md and figures/study.{png,svg}.
[group('reproduce')]
study-from-archive archive="results/study.tar.gz":
    cargo run --release -- sweep sweeps/study-*.yaml --compare study --from {{archive}} --doc REPRODUCE.md

# Draw one figure from existing results (no training): accuracy, entropy or tails.
[group('reproduce')]
figure kind scale="mini":
    cargo run --release -- report {{kind}} --scale {{scale}}

# The theory check: clipped policy mirror descent against Theorems 1-2, and Proposition 1.
[group('reproduce')]
pmd out="figures":
    cargo run --release -- pmd --out {{out}}

# Check an archive or results directory against its SHA256SUMS.
[group('reproduce')]
verify archive="results/mini.tar.gz":
    cargo run --release -- verify {{archive}}

# Rebuild the tables and figures from the shipped mini archive (verified first), no training,
# and refresh the generated blocks of REPRODUCE.md.
[group('reproduce')]
from-archive archive="results/mini.tar.gz":
    cargo run --release -- reproduce all --scale mini --from {{archive}} --doc REPRODUCE.md

# Issue #38's powered runs (qwen3-mini-xs and -s at 20 seeds, REPRODUCE.md "Powered"): about half
# an hour on 2 cores; then the archive.
[group('reproduce')]
powered:
    cargo run --release -- reproduce all --scale mini --models qwen3-mini-xs,qwen3-mini-s --seeds 20 --results results/powered --figures figures/powered
    cargo run --release -- archive results/powered/mini/*/ --out results/mini-powered.tar.gz --no-checkpoints

# Issue #48's powered runs of the two larger models (qwen3-mini-m and -l at 23 seeds, REPRODUCE.md
# "Powered"): about 75 minutes on 2 quiet cores; then the archive.
[group('reproduce')]
powered-ml:
    cargo run --release -- reproduce all --scale mini --models qwen3-mini-m,qwen3-mini-l --seeds 23 --results results/powered-ml --figures figures/powered-ml
    cargo run --release -- archive results/powered-ml/mini/*/ --out results/mini-powered-ml.tar.gz --no-checkpoints

# Rebuild the powered runs' reports from their shipped archive (verified first) and refresh the
# `from-mini-powered/*` blocks of REPRODUCE.md (filled from results/, never the five-seed ones).
[group('reproduce')]
from-powered-archive archive="results/mini-powered.tar.gz":
    cargo run --release -- reproduce all --scale mini --from {{archive}}
    cargo run --release -- doc REPRODUCE.md --from results

# Both powered archives' runs read together (all four sizes, 8 matched pairs): one verdict with
# the step test Holm-adjusted over the 8 pairs and the pooled estimate per family, into
# results/from-mini-powered-all/ and its blocks of REPRODUCE.md.
[group('reproduce')]
from-powered-archives:
    cargo run --release -- reproduce all --scale mini --from results/mini-powered.tar.gz
    cargo run --release -- reproduce all --scale mini --from results/mini-powered-ml.tar.gz
    cargo run --release -- report table1 --runs results/from-mini-powered --runs results/from-mini-powered-ml --out results/from-mini-powered-all
    cargo run --release -- doc REPRODUCE.md --from results

# Set up the pinned CUDA 13.0 toolkit from PyPI wheels (no GPU needed) and build the CUDA binary
# target/release/acpo with the kernels of kernels/ (docs/CUDA.md).
[group('cuda')]
build-cuda:
    eval "$(tools/gpu/cuda-toolkit.sh)" && cargo build --release --features cuda

# The CUDA binary stripped and xz-compressed for a GPU machine: target/acpo-cuda.xz.
[group('cuda')]
pack-cuda: build-cuda
    mkdir -p target
    strip -o target/acpo-cuda "${CARGO_TARGET_DIR:-target}/release/acpo"
    xz -T0 -9 -f -k target/acpo-cuda

# Registers, spills and shared memory of every kernel for sm_90 (ptxas on the PTX build.rs makes,
# no GPU), into docs/CUDA.md's `kernel-resources.md` block; fails on a spill (CI checks both).
[group('cuda')]
kernel-resources:
    #!/usr/bin/env bash
    set -euo pipefail
    eval "$(tools/gpu/cuda-toolkit.sh)"
    dir="$(mktemp -d)"
    python3 tools/gpu/kernel_resources.py "$dir"
    cargo run --release -- doc docs/CUDA.md --from "$dir"

# The test suite with the cuda feature: the GPU tests run where a GPU is, and skip elsewhere.
[group('cuda')]
test-cuda:
    eval "$(tools/gpu/cuda-toolkit.sh)" && cargo test --features cuda

# What CI checks of the CUDA path: every kernels/*.cu compiles to PTX and the feature type-checks.
[group('cuda')]
check-cuda:
    eval "$(tools/gpu/cuda-toolkit.sh)" && cargo check --features cuda --all-targets

# What the GPU suite needs on a GPU machine, into target/gpu/ (tools/gpu/pack.sh): the CUDA
# binary and test binary, the kernel checks built by nvcc, the data and the tokenizer (with
# ACPO_DATA_DIR and ACPO_QWEN3_TOKENIZER set), refused above the device tool's 64 MiB.
[group('cuda')]
pack-gpu-suite: build-cuda
    bash tools/gpu/pack.sh

# The GPU suite on this machine's GPU (after `just pack-gpu-suite`), raw results in
# results/gpu/<device>-<date>/ (tools/gpu/suite.sh), without the lent call's time limit.
[group('cuda')]
gpu-suite:
    SUITE_SECONDS=100000 bash tools/gpu/suite.sh

# The GPU suite's dry run on the CPU (CI runs it): the nvcc builds of the pack, each step's
# command at toy shapes with the CPU binaries.
[group('cuda')]
gpu-suite-dry-run:
    cargo build
    ACPO_BIN="${CARGO_TARGET_DIR:-target}/debug/acpo" bash tools/gpu/suite.sh --dry-run

# The CPU traces of the Qwen3-1.7B train step the GPU memory prediction is made from, into
# results/cpu-memory/ (about an hour on 2 busy cores), then the prediction.
[group('cuda')]
memory-trace:
    cargo build --release
    bash tools/checks/memory_trace.sh
    just memory-predict

# docs/CUDA.md's predicted peak memory from the traces in results/cpu-memory/.
[group('cuda')]
memory-predict:
    cargo run --release -- bench memory-predict --measured results/cpu-memory --out results/cpu-memory --doc docs/CUDA.md

# docs/CUDA.md's predicted decode attention times (its bytes at the copy rates of results/gpu/)
# and the GPU suite's paged sampling runs (the engine's schedule at each GPU's pool).
[group('cuda')]
decode-predict:
    cargo run --release -- bench decode-predict --measured results/gpu --out "$(mktemp -d)" --doc docs/CUDA.md

# docs/CUDA.md's predicted tensor-core attention times: a model fitted to the kernels timed in
# results/gpu/.
[group('cuda')]
attention-predict:
    cargo run --release -- bench attention-predict --measured results/gpu --out "$(mktemp -d)" --doc docs/CUDA.md

# The costed paper plan of one run of the GPU suite, on the CPU after the loan: the next
# numbered folder of DIR, from the rates the run measured (tools/gpu/plan.sh says which).
[group('cuda')]
gpu-plan DIR:
    cargo build --release
    ACPO_BIN="${CARGO_TARGET_DIR:-target}/release/acpo" bash tools/gpu/plan.sh {{DIR}}

# The GPU blocks of docs/CUDA.md and REPRODUCE.md from one run of the GPU suite: its report
# files (gpu-results.md, gpu-targets.md, gpu-step-parts.md), then the docs' blocks filled from them.
[group('cuda')]
gpu-report DIR:
    python3 tools/gpu/report.py {{DIR}}
    cargo run --release -- doc docs/CUDA.md REPRODUCE.md --from {{DIR}}

# Fill the generated blocks of documents from a folder of reports (`acpo doc`; --check: exit 1
# when a block is stale).
[group('reproduce')]
doc from *docs:
    cargo run --release -- doc {{docs}} --from {{from}}

# Two result directories of the same runs compared (eval, metrics less timings, tails): what a
# change that must not move a number is checked with (tools/checks/compare_runs.py).
[group('dev')]
compare-runs base new scale="mini":
    python3 tools/checks/compare_runs.py {{base}} {{new}} {{scale}}

# The Python package's tests (python/) in a fresh venv with the package installed from here,
# as CI runs them.
[group('dev')]
test-python:
    rm -rf target/python-venv && python3 -m venv target/python-venv
    target/python-venv/bin/pip install --quiet --disable-pip-version-check ./python
    target/python-venv/bin/python -m unittest discover -s python/tests -t python/tests -v

# The Python package's tests with torch and verl 0.9.1 from PyPI in a venv
# (~/.cache/acpo/verl-venv; several GB: torch, verl and its dependencies): the loss against the
# fixtures of acpo's Rust objectives, the `verl.plugins` entry point, the reward in verl's reward
# loop, the 16 paper launches composed against verl's config (docs/VERL.md).
[group('verl')]
test-verl:
    cargo build
    test -x ~/.cache/acpo/verl-venv/bin/python || python3 -m venv ~/.cache/acpo/verl-venv
    ~/.cache/acpo/verl-venv/bin/pip install --quiet --disable-pip-version-check torch verl==0.9.1 hydra-core
    ~/.cache/acpo/verl-venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
    ACPO_BIN="${CARGO_TARGET_DIR:-target}/debug/acpo" ~/.cache/acpo/verl-venv/bin/python -m unittest discover -s python/tests -t python/tests -v
    cargo test --test it verl
