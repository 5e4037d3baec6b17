# acpo: reproduce "Advantage Clipped Policy Optimization". `just --list` is the manual.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Show the recipes.
default:
    @just --list

# Run the whole test suite (what CI runs).
[group('dev')]
test:
    cargo test

# fmt --check, clippy -D warnings, then the tests.
[group('dev')]
ci:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings
    cargo test

# Validate every experiment manifest (one line per run).
[group('reproduce')]
check path="experiments":
    cargo run --release -- check {{path}}

# Reproduce an artifact of the paper: table1, speedup, accuracy, entropy, tails or all. The
# default scale is smoke until the mini scale lands (issue #8).
[group('reproduce')]
reproduce artifact="table1" scale="smoke":
    cargo run --release -- reproduce {{artifact}} --scale {{scale}}

# Draw one figure from existing results (no training): accuracy, entropy or tails.
[group('reproduce')]
figure kind scale="smoke":
    cargo run --release -- report {{kind}} --scale {{scale}}

# Check an archive or results directory against its SHA256SUMS.
[group('reproduce')]
verify archive:
    cargo run --release -- verify {{archive}}
