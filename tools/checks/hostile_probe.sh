#!/usr/bin/env bash
# Issue #35: the issue's cases through the command line, one row each: exit code, peak resident
# memory (MiB) and the first line of what the command said. Run it with two binaries (e.g. one
# built from a commit before a fix, in a worktree, and today's) to see an item fail and pass:
#
#   bash tools/checks/hostile_probe.sh BIN [TREE]
#
# TREE is the checkout BIN was built from (its experiments/, sweeps/ and shipped archives are
# used; default: this repository). Writes only into a fresh temporary directory. Each command
# gets 120 s; exit 124 is a command that was still running then, 134 an abort, 137 a kill.
set -uo pipefail
bin="$(realpath "$1")"
tree="$(realpath "${2:-$(dirname "$0")/../..}")"
w="$(mktemp -d)"
cd "$tree"

row() {
    local name=$1
    shift
    /usr/bin/time -f "%M" -o "$w/rss" timeout 120 "$@" >"$w/out" 2>"$w/err"
    local rc=$?
    local said
    said=$(cat "$w/err" "$w/out" | grep -v '^\s*$' | grep -v 'Command exited' | head -1 | cut -c1-150)
    printf '%s | %s | %s | %s\n' "$name" "$rc" "$(($(tail -1 "$w/rss" 2>/dev/null || echo 0) / 1024))" "$said"
}

echo "case | exit | peak MiB | said"
# Items 1-2: configs with hostile sizes, then the model commands on what init accepted.
python3 - "$tree/tests/fixtures/tiny-qwen3/config.json" "$w" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
cases = {"hidden_size=2^63": ("hidden_size", 2**63), "intermediate_size=0": ("intermediate_size", 0),
         "hidden_size=0": ("hidden_size", 0), "head_dim=0": ("head_dim", 0),
         "hidden_size=1e9": ("hidden_size", 10**9), "vocab_size=1e12": ("vocab_size", 10**12),
         "num_hidden_layers=1e6": ("num_hidden_layers", 10**6), "rms_norm_eps<0": ("rms_norm_eps", -1e-6),
         "rope_theta<0": ("rope_theta", -5.0)}
for name, (field, value) in cases.items():
    c = dict(base)
    c[field] = value
    if field == "rope_theta":
        c.pop("rope_parameters", None)
    json.dump(c, open(f"{sys.argv[2]}/{name}.json", "w"))
PY
echo '{"ids": [5, 6, 7]}' >"$w/ids.jsonl"
for c in hidden_size=2^63 intermediate_size=0 hidden_size=0 head_dim=0 hidden_size=1e9 \
    vocab_size=1e12 num_hidden_layers=1e6 'rms_norm_eps<0' 'rope_theta<0'; do
    row "1-2 model init, $c" "$bin" model init --config "$w/$c.json" --out "$w/m-$c" --char-tokenizer
    if [ -d "$w/m-$c" ]; then
        row "1-2   model logprobs on it" "$bin" model logprobs --model "$w/m-$c" --input "$w/ids.jsonl" --output "$w/lp.jsonl"
    fi
done
"$bin" model init --config tests/fixtures/tiny-qwen3/config.json --out "$w/tiny" --char-tokenizer >/dev/null 2>&1
python3 -c "import json; print(json.dumps({'ids': [5] * 200000}))" >"$w/long.jsonl"
python3 -c "import json; print(json.dumps({'prompt': 'y' * (10 << 20)}))" >"$w/big.jsonl"
row "2 model logprobs, a 200k-token line" "$bin" model logprobs --model "$w/tiny" --input "$w/long.jsonl" --output "$w/lp.jsonl"
row "2 generate, a 100k-character prompt" "$bin" generate --model "$w/tiny" --prompt "$(python3 -c 'print("x" * 100000)')" --max-new-tokens 4
row "2 generate, a 10 MB prompt file" "$bin" generate --model "$w/tiny" --input "$w/big.jsonl" --max-new-tokens 4
row "2 generate --n 1e9" "$bin" generate --model "$w/tiny" --prompt "2 + 2 =" --max-new-tokens 4 --n 1000000000
mkdir -p "$w/zero"
sed -e "s#config: experiments/smoke/tiny-qwen3.json#config: $w/intermediate_size=0.json#" \
    -e "s#dir: models/smoke-qwen3-tiny#dir: $w/absent#" experiments/smoke/smoke-ppo.yaml >"$w/zero/smoke-ppo.yaml"
row "1 check, a manifest naming intermediate_size 0" "$bin" check "$w/zero/smoke-ppo.yaml"
row "1 train, the same manifest" "$bin" train "$w/zero/smoke-ppo.yaml" --out "$w/results"

# Item 5: a generated block named by an absolute path.
printf 'a\n<!-- begin: table1.md -->\nold\n<!-- end: table1.md -->\n<!-- begin: /etc/hostname -->\nx\n<!-- end: /etc/hostname -->\n' >"$w/doc.md"
if "$bin" doc --help >/dev/null 2>&1; then
    mkdir -p "$w/gen" && echo '| t |' >"$w/gen/table1.md"
    row "5 a block named /etc/hostname" "$bin" doc "$w/doc.md" --from "$w/gen"
else
    row "5 a block named /etc/hostname" "$bin" reproduce all --scale mini --from results/mini.tar.gz --results "$w/r5" --doc "$w/doc.md"
fi
grep -qF "$(cat /etc/hostname)" "$w/doc.md" && echo "5   the document now holds /etc/hostname" || echo "5   the document holds no outside file"

# Item 6: two run directories swapped inside the shipped study archive.
mkdir -p "$w/st" && tar xzf results/study.tar.gz -C "$w/st"
a=study-grpo-ac-p0-8fb518744558
b=study-grpo-ac-p5-8ba00bd0f941
"$bin" sweep sweeps/study-grpo-ac.yaml --from results/study.tar.gz --results "$w/r-orig" >/dev/null 2>&1
mv "$w/st/$a" "$w/st/tmp" && mv "$w/st/$b" "$w/st/$a" && mv "$w/st/tmp" "$w/st/$b"
"$bin" archive "$w"/st/study-* --out "$w/swapped.tar.gz" >/dev/null 2>&1
row "6 sweep --from, two runs swapped" "$bin" sweep sweeps/study-grpo-ac.yaml --from "$w/swapped.tar.gz" --results "$w/r-swap"
cmp -s "$w/r-orig/from-study/sweeps/study-grpo-ac/sweep.md" "$w/r-swap/from-swapped/sweeps/study-grpo-ac/sweep.md" \
    && echo "6   sweep.md as from the original" || echo "6   sweep.md differs from the original"

# Item 7: a text grid value with a newline.
mkdir -p "$w/g7" && cp experiments/smoke/smoke-grpo-ac.yaml experiments/smoke/smoke-grpo.yaml "$w/g7/"
printf 'name: inj\nbase: %s/g7/smoke-grpo-ac.yaml\nbaseline: %s/g7/smoke-grpo.yaml\nseeds: 1\ngrid:\n  algorithm.policy_loss: ["cispo\\nalgorithm:\\n  alpha: 9"]\n' "$w" "$w" >"$w/inj.yaml"
row "7 a grid text value with a newline" "$bin" sweep "$w/inj.yaml" --results "$w/r7"

# Item 8.
row "8 export verl --gpus 0" "$bin" export verl experiments/paper/qwen3-1.7b-grpo.yaml --gpus 0 --out "$w/e0"
python3 - "$w" <<'PY'
import sys
w = sys.argv[1]
values = ", ".join(str(i + 1) for i in range(1000))
open(f"{w}/big.yaml", "w").write(
    f"name: big\nbase: {w}/g7/smoke-grpo-ac.yaml\nbaseline: {w}/g7/smoke-grpo.yaml\nseeds: 1\ngrid:\n"
    f"  algorithm.alpha: [{values}]\n  actor.epochs: [{values}]\n")
PY
row "8 a sweep of 10^6 points" "$bin" sweep "$w/big.yaml" --results "$w/r8"
cp results/study.tar.gz "$w/trailer.tar.gz"
python3 -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[-5] ^= 0xff; open(p, 'wb').write(bytes(b))" "$w/trailer.tar.gz"
row "8 verify, a corrupt gzip trailer, no sidecar" "$bin" verify "$w/trailer.tar.gz"
"$bin" reproduce all --scale mini --from results/mini.tar.gz --results "$w/r8b" >/dev/null 2>&1
row "8 verify what --from unpacked and reported into" "$bin" verify "$w/r8b/from-mini"
mkfifo "$w/pipe"
row "8 score --input a pipe" "$bin" score --input "$w/pipe"
row "8 generate --input a pipe" "$bin" generate --model "$w/tiny" --input "$w/pipe"
rm -rf "$w"
