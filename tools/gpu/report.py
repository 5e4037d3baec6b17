#!/usr/bin/env python3
"""The GPU rows of docs/CUDA.md and REPRODUCE.md from one run of tools/gpu/suite.sh (issue #24):
reads every raw file under a results/gpu/<device>-<date>/ directory (one sub-directory per device
call; where a check ran in several calls, the later call's result counts) and writes there
gpu-results.md (every measurement), gpu-targets.md (the CUDA issues' targets beside what was
measured) and gpu-step-parts.md (the train step by kind of work, and the step predicted for the
code since). Every number comes from the raw files. The docs quote the two files through their
`<!-- begin: NAME -->` blocks, filled by the binary's one filler (`acpo doc`, src/report/doc.rs):

    python3 tools/gpu/report.py results/gpu/NVIDIA-H100-80GB-HBM3-20261123
    acpo doc docs/CUDA.md REPRODUCE.md --from results/gpu/NVIDIA-H100-80GB-HBM3-20261123

With --check it writes nothing and exits 1 when the committed files differ from the raw results.

Standard library only.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

# The repository this script is in: the committed files a report sets beside the raw results
# (the model's config, the CPU-predicted memory) are read from it, wherever it runs from.
REPO = Path(__file__).resolve().parents[2]


def call_order(path):
    """A path's sort key with its numbers compared as numbers: call `10-…` after `2-…`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def plan_file(root, name):
    """The last costed plan's `name` (paper-plan.json or .md) from the rates of a bf16 KV cache
    (`measured/`: tools/gpu/plan.sh's, and the calls' before it), or None."""
    plans = [p for p in found(root, name) if p.parent.name == "measured"]
    return plans[-1] if plans else None


def sibling_plan_file(plan, kind):
    """The plan tools/gpu/plan.sh made beside `plan` (its `kind/` sibling), or None: `fp8-kv`,
    from the rate sampled over an FP8 KV cache; `by-hand`, from the train step with each layer's
    backward by hand and the same sampling rates."""
    other = plan.parent.parent / kind / plan.name if plan else None
    return other if other and other.is_file() else None


# The words for the suite's step with each layer's backward by hand (`--layer-by-hand`).
BY_HAND = "each layer's backward by hand"

# The train step's two lengths, 2 × SHORT and 2 × LONG tokens (tools/gpu/suite.sh's `lens`): the
# paper's, or a dry run's toy ones (ACPO_REPORT_LENGTHS="64 96"), so that the suite's dry run
# reads the binaries' own files through every section.
SHORT, LONG = (tuple(int(x) for x in os.environ["ACPO_REPORT_LENGTHS"].split())
               if os.environ.get("ACPO_REPORT_LENGTHS") else (2048, 9220))
LENGTHS = (SHORT, LONG)


def gpu_name(root):
    """The device the run's calls ran on, as nvidia-smi named it in the summary, or None."""
    head = next((l for l in summary_lines(root) if l.startswith(("== section", "== suite on"))), "")
    return head.split(" on ", 1)[-1].split(",")[0].strip() if " on " in head else None


def found(root, pattern):
    """The files under root matching `pattern` (rglob's), in the calls' order (they are
    numbered), leaving out what a dot-folder holds (a command's staging, never a result)."""
    return sorted((p for p in root.rglob(pattern)
                   if not any(part.startswith(".") for part in p.relative_to(root).parts[:-1])), key=call_order)


def latest(root, name):
    """The last file called `name` under root, in the calls' order (they are numbered)."""
    files = found(root, name)
    return files[-1] if files else None


def load(path):
    return json.loads(path.read_text()) if path else None


def summary_lines(root):
    lines = []
    for s in found(root, "summary.txt"):
        lines += s.read_text().splitlines()
    return lines


def fmt(x, digits=1):
    return f"{x:,.{digits}f}"


def mfu(row):
    """A train step's MFU in percent, or "—" where it has none (a CPU's step: no peak to count
    against)."""
    return "—" if row.get("mfu") is None else f"{100 * row['mfu']:.1f} %"


def machine(root, lines):
    head = next((l for l in lines if l.startswith(("== section", "== suite on"))), "")
    gpu = head.split(" on ", 1)[-1] if " on " in head else "unknown"
    commits = sorted({l[10:].rsplit(", ", 1)[0] for l in lines if l.startswith("== commit ")})
    m = latest(root, "machine.txt")
    sw = ""
    if m:
        sw = next((l for l in m.read_text().splitlines() if l.startswith("torch ")), "")
    return f"{gpu}; {sw}; binaries of {' and of '.join(commits) or 'an unknown commit'}"


def test_results(text):
    """(passed, failed, how it ended: "ok", "FAILED" or "cut") over every `test result` line of a
    test log: the suite runs the tests no GPU has passed first, then the rest, each run printing
    its own line, and says first how many runs the log holds (`cuda test runs: N`; one where it
    does not say) and after each run that ended its exit (`cuda test run exit: E`; a run the time
    limit killed says none). A run that ended without success is FAILED (a crash prints no
    result line); one missing, cut. None for a log with neither a result nor an exit (its first
    run cut before its end)."""
    results = [l for l in text.splitlines() if l.startswith("test result")]
    counts = [re.search(r"(\d+) passed; (\d+) failed", l) for l in results]
    exits = [int(e) for e in re.findall(r"^cuda test run exit: (\d+)$", text, re.M)]
    if not (results or exits) or not all(counts):
        return None
    runs = re.search(r"^cuda test runs: (\d+)$", text, re.M)
    if any(l.startswith("test result: FAILED") for l in results) or any(exits):
        ended = "FAILED"
    elif len(results) < (int(runs.group(1)) if runs else 1):
        ended = "cut"
    else:
        ended = "ok"
    return sum(int(m.group(1)) for m in counts), sum(int(m.group(2)) for m in counts), ended


def tests_table(root):
    out = ["| call | CUDA tests | result |", "|---|---|---|"]
    for log in found(root, "cuda_tests.log"):
        text = log.read_text()
        got = test_results(text)
        result = f"{got[2]}. {got[0]} passed; {got[1]} failed" if got else "no result"
        failed = [l.split()[1] for l in text.splitlines() if l.startswith("test ") and l.endswith("FAILED")]
        call = log.relative_to(root).parts[0]
        out.append(f"| {call} | {result.split('.')[0]} "
                   f"| {', '.join(f'`{f}`' for f in failed) or 'all pass'} |")
    errs = []
    last = latest(root, "cuda_tests.log")
    if last:
        errs = [l.split(" ... ")[-1] for l in last.read_text().splitlines() if "relative error" in l]
    return out, errs


def parity_table(root):
    p = load(latest(root, "parity.json"))
    if not p:
        return ["parity: not run"]
    out = [f"Random Qwen3-0.6B-shaped model, sequences of {p['sequences']} tokens (real Qwen3 tokenizer), "
           f"acpo on CUDA against transformers {p['transformers']} on the same GPU:", "",
           "| dtype | max abs Δ log-prob | max abs Δ entropy |", "|---|---:|---:|"]
    for r in p["rows"]:
        out.append(f"| {r['dtype']} | {r['max_abs_log_prob_diff']:.2e} | {r['max_abs_entropy_diff']:.2e} |")
    return out


def builtin_benches(root):
    rows = {}
    for f in found(root, "bench-*/*.json"):
        for r in load(f):
            rows[(r["model"], r["what"], r["target"])] = r["tokens_per_second"]
    if not rows:
        return ["built-in benches: not run"]
    out = ["| model | what | cpu/f32 (16 cores) | cuda/f32 | cuda/bf16 | cuda/bf16 ÷ cpu |",
           "|---|---|---:|---:|---:|---:|"]
    for model, what in sorted({(m, w) for m, w, _ in rows}):
        get = lambda t: rows.get((model, what, t))
        cells = [fmt(get(t)) if get(t) else "—" for t in ("cpu/f32", "cuda/f32", "cuda/bf16")]
        ratio = f"{get('cuda/bf16') / get('cpu/f32'):.1f}×" if get("cpu/f32") and get("cuda/bf16") else "—"
        out.append(f"| {model} | {what} | {' | '.join(cells)} | {ratio} |")
    out.append("")
    out.append("tokens/s; train-step: 4 × 128 tokens, generate: 8 prompts × (32 + 64).")
    return out


def train_runs(root, length):
    """The acpo and torch train steps at 2 × `length` (None where absent) and whether acpo's
    ran out of memory."""
    torch = load(latest(root, f"torch-train-{length}.json"))
    acpo = step_run(root, length)
    log = latest(root, f"acpo-train-{length}.log")
    oom = log is not None and "OUT_OF_MEMORY" in log.read_text()
    return acpo, torch, oom


def step_run(root, length, variant=""):
    """acpo's train step at 2 × `length` (`paper-LENGTH`), or run as `variant` says
    (`paper-LENGTH-VARIANT`), or None."""
    d = latest(root, f"paper-{length}{'-' + variant if variant else ''}")
    return load(d / "train-step.json")[0] if d and (d / "train-step.json").exists() else None


def variant_run(root, length, variant=""):
    """acpo's train step at 2 × `length` run as `variant` says (`step_run`), and where it has no
    result but its log exists, how it ended: "out of memory", else that it did not finish
    (failed, or cut by the call's time); (None, None) for a step the run did not start."""
    got = step_run(root, length, variant)
    if got:
        return got, None
    log = latest(root, f"acpo-train-{length}{'-' + variant if variant else ''}.log")
    if log is None:
        return None, None
    if "OUT_OF_MEMORY" in log.read_text():
        return None, "out of memory"
    return None, f"did not finish (failed or cut; {log.name})"


def attention_run(root, length, variant=""):
    """`acpo bench attention` at 2 × `length` (`attention-LENGTH[-VARIANT]`): (forward s, its
    TFLOP/s, forward + backward s, its TFLOP/s), or None."""
    d = latest(root, f"attention-{length}{'-' + variant if variant else ''}")
    acpo = load(d / "attention.json")[0] if d and (d / "attention.json").exists() else None
    m = re.search(r"forward ([\d.]+) s \(([\d.]+) TFLOP/s\), forward \+ backward ([\d.]+) s \(([\d.]+) TFLOP/s\)",
                  acpo["shape"]) if acpo else None
    return tuple(float(x) for x in m.groups()) if m else None


def train_step(root, lines):
    out = ["| tokens | acpo tokens/s | acpo MFU | acpo peak GiB | torch tokens/s | torch MFU | torch peak GiB | acpo ÷ torch (target ≥ 1) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for length in LENGTHS:
        acpo, torch, oom = train_runs(root, length)
        if acpo:
            a = (fmt(acpo["tokens_per_second"]), mfu(acpo),
                 f"{acpo['memory']['peak'] / 2**30:.1f}")
        elif oom:
            a = ("out of memory", "—", "> 78")
        else:
            a = ("not run", "—", "—")
        t = (fmt(torch["tokens_per_second"]), mfu(torch),
             f"{torch['peak_bytes'] / 2**30:.1f}") if torch else ("not run", "—", "—")
        ratio = f"{acpo['tokens_per_second'] / torch['tokens_per_second']:.2f}×" if acpo and torch else "—"
        out.append(f"| 2 × {length} | {' | '.join(a)} | {' | '.join(t)} | {ratio} |")
        # The same step with each layer's backward by hand (`--layer-by-hand`) and with the
        # attention's backward in 5 products (`--flash-backward five`), issue #59, where the run
        # has them: a row each beside the same twin.
        for variant, label in (("by-hand", "layer backward by hand"),
                               ("five", "attention backward in 5 products")):
            v = step_run(root, length, variant)
            if v:
                cells = (fmt(v["tokens_per_second"]), mfu(v),
                         f"{v['memory']['peak'] / 2**30:.1f}")
                ratio = f"{v['tokens_per_second'] / torch['tokens_per_second']:.2f}×" if torch else "—"
                out.append(f"| 2 × {length}, {label} | {' | '.join(cells)} | {' | '.join(t)} | {ratio} |")
    out.append("")
    out.append("Qwen3-1.7B shape, random weights, bf16 with fp32 masters, prompt 1,024, gradient "
               "checkpointing on both sides; acpo with flash attention and vocabulary chunks of 8,192, "
               "torch with sdpa (`tools/twins/bench_train_torch.py`).")
    return out


def train_phases(root):
    """The train step's memory and time by phase (`acpo bench train-step --trace`, the suite of
    issue #44; and the step with each layer's backward by hand, `--layer-by-hand --trace`), the
    decoder layers' phases summed; nothing for a run without a trace."""
    out = []
    for length, variant in ((SHORT, ""), (LONG, ""), (SHORT, "by-hand"), (LONG, "by-hand")):
        acpo = step_run(root, length, variant)
        if not acpo or not acpo.get("trace"):
            continue
        rows, layers = [], None
        for m in acpo["trace"][1:]:
            secs, peak = m.get("seconds") or 0.0, (m.get("peak") or 0) / 2**30
            if re.match(r"layer \d+:", m["phase"]):
                n, s, p = layers or (0, 0.0, 0.0)
                layers = (n + 1, s + secs, max(p, peak))
                if not rows or rows[-1][0] != "layers":
                    rows.append(("layers", None, None))
                continue
            rows.append((m["phase"], secs, peak))
        if not out:
            out += ["Where the train step's time and memory go (`--trace`: each phase's wall time once the GPU "
                    "has finished it, and the most memory in use during it):", ""]
        label = f", {BY_HAND}" if variant else ""
        out += [f"| 2 × {length}{label}: phase | seconds | peak GiB |", "|---|---:|---:|"]
        for name, secs, peak in rows:
            if name == "layers":
                n, secs, peak = layers
                name = f"{n} layers: recompute and backward (summed)"
            out.append(f"| {name} | {secs:.3f} | {peak:.1f} |")
        out.append("")
    return out


def attention(root):
    out = ["| tokens | acpo forward s (TFLOP/s) | torch sdpa forward s (TFLOP/s) | acpo fwd+bwd s (TFLOP/s) | torch fwd+bwd s (TFLOP/s) | acpo ÷ torch time, fwd+bwd |",
           "|---|---:|---:|---:|---:|---:|"]
    for length in LENGTHS:
        torch = load(latest(root, f"torch-attention-{length}.json"))
        for variant, label in (("", ""), ("five", ", backward in 5 products")):
            got = attention_run(root, length, variant)
            if not got:
                if not variant:
                    out.append(f"| 2 × {length} | not run | {'' if torch else 'not run'} | | | |")
                continue
            # acpo's times stand without the twin (a call whose time cut sdpa); the ratio needs both
            f, ft, fb, fbt = got
            tf, tfb = ((f"{torch['forward_s']:.4f} ({torch['forward_tflops']:.0f})",
                        f"{torch['forward_backward_s']:.4f} ({torch['forward_backward_tflops']:.0f})")
                       if torch else ("not run", "not run"))
            ratio = f"{fb / torch['forward_backward_s']:.1f}×" if torch else "—"
            out.append(f"| 2 × {length}{label} | {f:.4f} ({ft:.1f}) | {tf} | {fb:.4f} ({fbt:.1f}) | {tfb} | {ratio} |")
    out.append("")
    out.append("One layer's attention, 16 query heads over 8 KV heads of 128, bf16, causal; the backward "
               "in 7 products (the pair of kernels) unless the row says 5 (`--flash-backward five`).")
    # With checkpointing a layer's attention runs forward twice (the pass, its recomputation)
    # and backward once: its share of the measured 2k train step.
    got, step = attention_run(root, SHORT), step_run(root, SHORT)
    if got and step:
        cfg = json.loads((REPO / "experiments/paper/configs/qwen3-1.7b.json").read_text())
        secs = step["seconds"]
        attn = cfg["num_hidden_layers"] * (got[0] + got[2])
        out += ["", f"In acpo's 2 × 2048 train step ({secs:.2f} s), attention takes "
                f"{cfg['num_hidden_layers']} layers × (forward + forward and backward) = {attn:.2f} s, "
                f"{100 * attn / secs:.0f} % of it."]
    return out


# The decoder layer's element-wise forward, in elements moved per token (read + written) by its
# passes outside the matrix products and the attention: the two RMSNorms (x in, y out), QK-norm
# and RoPE on q and k, v's and the attention output's transposed copies, the two residual adds
# (two in, one out) and SwiGLU (gate and up in, one out).
def forward_elementwise_elems(st):
    h, q, kv, i = st["hidden"], st["heads"] * st["head_dim"], st["kv_heads"] * st["head_dim"], st["intermediate"]
    return 2 * h + 2 * (q + kv) + 2 * (q + kv) + 2 * kv + 2 * q + 2 * 3 * h + 2 * h + 3 * i


def layer_matmul_params(st):
    h, q, kv, i = st["hidden"], st["heads"] * st["head_dim"], st["kv_heads"] * st["head_dim"], st["intermediate"]
    return h * q + 2 * h * kv + q * h + 3 * h * i


# Element passes (reads + writes of one element of y) of the old seed, `(y*g).sum_all().backward()`,
# outside its one-block sum: the product (2 in, 1 out); in the backward, the ones of y's shape
# (a zero fill, then zeros + ones: 1 + 3), 1·g (3), y's gradient (a zero fill and an add: 1 + 3),
# g's unused gradient 1·y (3) and its zero fill and add (1 + 3).
OLD_SEED_PASSES = 3 + (1 + 3) + 3 + (1 + 3) + 3 + (1 + 3)
# The new seed (`fused::backward_seed`): the product and its rows' sums (3 + 1) forward; g·1 (2),
# y's zero fill and add (1 + 3) in the backward. Its forward alone is its own line.
NEW_SEED_VALUE_PASSES = 3 + 1
NEW_SEED_BACKWARD_PASSES = 2 + (1 + 3)


def flash_kernel_ms(root, length):
    """flash_check's tensor-core forward and backward at B2 T`length` (ms), or None."""
    check = latest(root, "flash_kernels_check.log")
    if not check:
        return None
    for l in check.read_text().splitlines():
        m = re.match(rf"time mma fwd\s+B2 H\d+ KV\d+ T{length} past0 D\d+: forward ([\d.]+) ms.*?; backward ([\d.]+) ms", l)
        if m:
            return float(m.group(1)), float(m.group(2))
    return None


def flash_check_both(root, kernel, length):
    """flash_check's forward + backward of `kernel` (`mma`: the backward in 7 products, `mma5`:
    in 5) at B2 T`length`: (ms, TFLOP/s), or None."""
    check = latest(root, "flash_kernels_check.log")
    name = "mma fwd" if kernel == "mma" else kernel
    for l in check.read_text().splitlines() if check else []:
        m = re.match(rf"time {name}\s+B2 H\d+ KV\d+ T{length} past0 D\d+: .*forward \+ backward ([\d.]+) ms, ([\d.]+) TFLOP/s", l)
        if m:
            return float(m.group(1)), float(m.group(2))
    return None


# kernels/check/flash_check.cu's lines for the pipelined decode (`timing`, `timing_pipe`,
# `timing_pipe_fp8`), one shape each: B rows of `past` cached keys and the new one.
DECODE_SHAPE = r"B(\d+) H\d+ KV\d+(?: T1)? past(\d+) D\d+"
DECODE_LINES = {
    "split": re.compile(rf"time decode\s+{DECODE_SHAPE}: forward ([\d.]+) ms"),
    "pipe": re.compile(rf"time decode pipe\s+{DECODE_SHAPE}: forward ([\d.]+) ms"),
    "predicted": re.compile(rf"predicted decode pipe {DECODE_SHAPE}: ([\d.]+) ms at the copy rate measured here "
                            r"\((\d+) GB/s; ([\d.]+) MB\); measured at ([\d.]+) % of it(?:.*, ([\d.]+) % on K, V, Q "
                            r"and O alone)?"),
    "fp8": re.compile(rf"time decode pipe fp8\s+{DECODE_SHAPE}: forward ([\d.]+) ms"),
    "fp8_predicted": re.compile(rf"predicted decode pipe fp8 {DECODE_SHAPE}: ([\d.]+) ms at the copy rate measured "
                                r"here \((\d+) GB/s; ([\d.]+) MB\); measured at ([\d.]+) % of it"),
    "any_g": re.compile(r"decode pipe compiled for G (\d+) B(\d+) past(\d+): ([\d.]+) ms; the instance for any G: "
                        r"([\d.]+) ms"),
    "chunks": re.compile(r"decode pipe chunks a block B(\d+) past(\d+) \(host (\d+)\):(.*)"),
}


def decode_kernel_times(root):
    """The pipelined decode attention timed by flash_check (issue #57), one dict a shape in the
    log's order, keyed by (B, keys): `pipe` ms, its `predicted` ms at the `copy` GB/s measured
    there, `percent` of that rate, the split-K kernel's `split` ms, the FP8 instance's, the
    instance for any grouping beside the one compiled for the model's (`g`, `any_g` ms) and the
    chunks-per-block sweep (`host` and `chunks`, {n: ms}); {} where the run did not time it."""
    check = latest(root, "flash_kernels_check.log")
    shapes = {}
    for line in check.read_text().splitlines() if check else []:
        for kind, pattern in DECODE_LINES.items():
            m = pattern.match(line)
            if not m:
                continue
            if kind == "any_g":
                g, b, past, ms, any_g = m.groups()
                shapes.setdefault((int(b), int(past) + 1), {}).update(g=int(g), any_g=float(any_g))
            elif kind == "chunks":
                b, past, host, rest = m.groups()
                sweep = {int(n): float(ms) for n, ms in re.findall(r"(\d+): ([\d.]+) ms", rest)}
                shapes.setdefault((int(b), int(past) + 1), {}).update(host=int(host), chunks=sweep)
            else:
                b, past, ms, *rest = m.groups()
                got = shapes.setdefault((int(b), int(past) + 1), {})
                got[kind] = float(ms)
                if rest:
                    prefix = "fp8_" if kind == "fp8_predicted" else ""
                    got.update({prefix + "copy": float(rest[0]), prefix + "mb": float(rest[1]),
                                prefix + "percent": float(rest[2])})
                    if len(rest) > 3 and rest[3] is not None:
                        got["kvqo_percent"] = float(rest[3])
            break
    return {key: got for key, got in shapes.items() if "pipe" in got}


def decode_kernels(root):
    """The pipelined decode attention's table (issue #57): each shape's time beside its bytes at
    the copy rate measured in the same call, the split-K kernel it replaces, the FP8 instance,
    the instance for any grouping and the chunks-per-block sweep; nothing for a run before it."""
    shapes = decode_kernel_times(root)
    if not shapes:
        return []
    us = lambda got, key: f"{1000 * got[key]:.1f} µs" if key in got else "—"
    copy = next(iter(shapes.values())).get("copy")
    out = ["", "The pipelined decode attention, one launch a layer as a decode step runs it "
           "(`kernels/flash_decode.cu`, timed by `kernels/check/flash_check.cu`; Qwen3-1.7B's heads, bf16, median "
           f"of 7); predicted: the bytes it must move at the copy rate measured in the same call "
           f"({fmt(copy, 0) if copy else '—'} GB/s); the target (issue #57) is 80 % of it, judged on K, V, Q "
           "and O alone (the chunks' partials, statistics and valid bits it also moves are its own overhead):", "",
           "| B × keys | one launch, compiled for the model's G | every byte at the copy rate | of the copy rate, "
           "every byte | on K, V, Q and O | the instance for any G | split-K, its first valid keys and combine "
           "(before) | FP8 cache | FP8, of the copy rate |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda got, key: f"{got[key]:.1f} %" if key in got else "—"
    for (b, keys), got in shapes.items():
        out.append(f"| {b} × {keys:,} | {us(got, 'pipe')} | {us(got, 'predicted')} | {pct(got, 'percent')} "
                   f"| {pct(got, 'kvqo_percent')} | {us(got, 'any_g')} | {us(got, 'split')} | {us(got, 'fp8')} "
                   f"| {pct(got, 'fp8_percent')} |")
    sweeps = [(b, keys, got) for (b, keys), got in shapes.items() if got.get("chunks")]
    if sweeps:
        out += ["", "Chunks of 128 keys a block (the host's choice, `FDP_FILL_BLOCKS`, marked; it changes no "
                "bit of a result):", ""]
        out += [f"- {b} × {keys:,}: " + "; ".join(f"{n}{' (host)' if n == got['host'] else ''}: {1000 * t:.1f} µs"
                                                   for n, t in got["chunks"].items()) for b, keys, got in sweeps]
    return out


def copy_bandwidth(root):
    """The device's measured copy rate (bytes/s), from the sampling run's roofline."""
    d = latest(root, "generate-paper")
    g = load(d / "generate.json") if d and (d / "generate.json").exists() else None
    return g[0]["roofline"]["copy_gb_per_s"] * 1e9 if g else None


# `--trace`'s parts (src/device.rs), as the binary names them.
PART_ATTENTION = ("forward: attention", "backward: attention")
PART_PRODUCTS = ("forward: matrix products", "backward: matrix products")
PART_SEED = "backward seed"
PART_TO_MASTERS = "backward: weight gradients to the masters"
PART_ELEMENTWISE = ("forward: element-wise", "backward: element-wise")
PART_ONE_REST = "backward: matrix products and element-wise"  # autograd's backward, unsplit
AFTER_LAST_PART = "gradients into the sums (after the last part)"


def part_seconds(marks, pred, name):
    return sum(p["seconds"] for m in marks if pred(m["phase"]) for p in m.get("parts", []) if p["name"] == name)


def is_layer_phase(phase):
    """Whether a trace's phase is a decoder layer's recompute and backward."""
    return re.match(r"layer \d+:", phase) is not None


def phase_seconds(marks, start):
    """The seconds of the trace's phases whose names start with `start`."""
    return sum(m.get("seconds") or 0 for m in marks if m["phase"].startswith(start))


def optimizer_seconds(marks):
    """AdamW, the bf16 copy of the weights and the gradient sums: their phases' seconds."""
    return (phase_seconds(marks, "actor mini-batch 0: the optimizer step") + phase_seconds(marks, "micro-batch ")
            + phase_seconds(marks, "actor mini-batch 0: the compute copy"))


def layer_parts(marks):
    """Each part's seconds summed over the layers' marks that have parts, and the time after each
    one's last part (its gradients into the sums), in the trace's order."""
    parts = {}
    for m in marks:
        if is_layer_phase(m["phase"]) and m.get("parts"):
            for p in m["parts"]:
                parts[p["name"]] = parts.get(p["name"], 0.0) + p["seconds"]
            rest = (m.get("seconds") or 0) - sum(p["seconds"] for p in m["parts"])
            parts[AFTER_LAST_PART] = parts.get(AFTER_LAST_PART, 0.0) + rest
    return parts


def in_ms(seconds):
    """Seconds as whole milliseconds for a table, "—" for none."""
    return "—" if seconds is None else f"{1e3 * seconds:,.0f}"


def one_block_rate(a2048):
    """Elements a second of candle's one-block sum, the old seed, from the 2 × 2,048 traced step's
    embedding phase (mostly the tied lm_head's seed, V·H elements, and the embedding's, N·H); the
    phase does other work too, so the rate is a lower bound. None without that run, its trace or
    a timed embedding phase."""
    if not (a2048 and a2048.get("trace") and a2048.get("settings")):
        return None
    st = a2048["settings"]
    emb = sum(m.get("seconds") or 0 for m in a2048["trace"] if m["phase"].startswith("embedding:"))
    if emb <= 0:
        return None
    return (st["vocab"] * st["hidden"] * st["tied"] + st["batch"] * st["seq_len"] * st["hidden"]) / emb


def bench_attention_prediction(root, bw):
    """`acpo bench attention`'s forward + backward beside the same without its old seed (a sum of
    the output's B·H·T·D elements in one block, at the rate of the 2 × 2,048 step's embedding
    phase, and its element passes at the copy rate; `backward_seed`'s instead), never below the
    kernels' own measured time, the kernels alone and sdpa; rows only for runs whose bench still
    summed (before `backward_seed`)."""
    a2048, _, _ = train_runs(root, SHORT)
    one_block = one_block_rate(a2048)
    if not (one_block and bw):
        return []
    if any(p["name"] == PART_SEED for m in a2048["trace"] for p in m.get("parts", [])):
        return []
    e = 2 if a2048["settings"]["compute"] == "bf16" else 4
    pat = re.compile(r"(\d+)×(\d+), (\d+) heads over \d+ KV heads of (\d+); .*forward \+ backward ([\d.]+) s")
    rows = []
    for length in LENGTHS:
        d = latest(root, f"attention-{length}")
        acpo = load(d / "attention.json")[0] if d and (d / "attention.json").exists() else None
        m = pat.search(acpo["shape"]) if acpo else None
        kern = flash_kernel_ms(root, length)
        torch = load(latest(root, f"torch-attention-{length}.json"))
        if not (m and kern):
            continue
        b, t, h, dh, both = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(5))
        elems = b * h * t * dh
        pred = both - elems / one_block - elems * OLD_SEED_PASSES * e / bw + \
            elems * (NEW_SEED_VALUE_PASSES + NEW_SEED_BACKWARD_PASSES) * e / bw
        # The one-block rate is a lower bound (its phase does other work), so the seed taken out
        # can be too large: the bench never runs faster than its kernels alone.
        floor = sum(kern) / 1e3
        shown = f"{1e3 * floor:.1f} (the kernels' floor)" if pred < floor else f"{1e3 * pred:.1f}"
        sdpa = f"{1e3 * torch['forward_backward_s']:.1f}" if torch else "—"
        rows.append(f"| 2 × {length:,} | {1e3 * both:.1f} | {shown} | {sum(kern):.1f} | {sdpa} |")
    return rows


def step_accounting(root):
    """The train step's time by kind of work at 2 × 2,048 and 2 × 9,220, from the raw
    results: measured where the run timed it (the step, its phases and, in a trace with parts, each
    layer's parts; the attention kernels alone in flash_check), estimated from FLOPs and bytes at
    the run's own rates where it did not; and the step predicted for the code that seeds each
    backward with its output gradient, where the run's code still summed."""
    bw = copy_bandwidth(root)
    cols, notes = {}, []
    for length in LENGTHS:
        acpo, torch, _ = train_runs(root, length)
        kern = flash_kernel_ms(root, length)
        if not (acpo and acpo.get("trace") and acpo.get("settings") and kern and bw):
            continue
        st, marks = acpo["settings"], acpo["trace"]
        e = 2 if st["compute"] == "bf16" else 4
        layers, n = st["layers"], st["batch"] * st["seq_len"]
        nr = st["batch"] * (st["seq_len"] - st["prompt_len"])
        vh = st["vocab"] * st["hidden"]
        f, b = (x / 1e3 for x in kern)
        attention = layers * (2 * f + b)
        fwd_flops = 2 * n * layer_matmul_params(st) * layers
        flops = 4 * fwd_flops + 8 * nr * vh
        timed = part_seconds(marks, lambda p: p.startswith("forward without a graph"), PART_PRODUCTS[0])
        if timed > 0:
            rate, rate_note = fwd_flops / timed, "measured: the forward's products, timed by the trace"
        else:
            elementwise = layers * n * forward_elementwise_elems(st) * e / bw
            rate = fwd_flops / (phase_seconds(marks, "forward without a graph") - layers * f - elementwise)
            rate_note = ("the forward's rate once its attention kernels and its element-wise passes at the copy "
                         "rate are taken out: an upper bound on the products' time")
        matmul = flops / rate
        seeded = [(n * st["hidden"], layers + 1)] + ([(vh, 1)] if st["tied"] else [])
        seed_elems = sum(x * k for x, k in seeded)
        new_code = any(p["name"] == PART_SEED for m in marks for p in m.get("parts", []))
        if new_code:
            seeds = part_seconds(marks, is_layer_phase, PART_SEED)
            seed_note = "measured: the layers' `backward seed` parts"
        else:
            one_block = one_block_rate(train_runs(root, SHORT)[0])
            if not one_block:
                notes.append(f"2 × {length:,}: not accounted (the old seed's rate needs the 2 × 2,048 "
                             "traced step's embedding phase).")
                continue
            seeds = seed_elems / one_block
            seed_note = (f"estimate: {seed_elems / 1e6:,.0f} M elements summed in one block at "
                         f"{one_block / 1e9:.1f}e9 elements/s, the rate of the 2 × 2,048 embedding phase")
        adamw = optimizer_seconds(marks)
        step = acpo["seconds"]
        other = step - attention - matmul - seeds - adamw
        col = {"attention": attention, "matmul": matmul, "seeds": seeds, "other": other, "adamw": adamw,
               "step": step, "estimated": {"matmul"} | (set() if new_code else {"seeds"})}
        if not new_code:
            old_passes = seed_elems * OLD_SEED_PASSES * e / bw
            new_value = seed_elems * NEW_SEED_VALUE_PASSES * e / bw
            new_bwd = seed_elems * NEW_SEED_BACKWARD_PASSES * e / bw
            pred = dict(col, seeds=new_value, other=other - old_passes + new_bwd)
            pred["step"] = sum(pred[k] for k in ("attention", "matmul", "seeds", "other", "adamw"))
            col["predicted"] = pred
        if torch:
            t = load(latest(root, f"torch-attention-{length}.json"))
            twin_attn = layers * (t["forward_s"] + t["forward_backward_s"]) if t else None
            col["twin"] = (twin_attn, torch["seconds"])
        col["parts"] = layer_parts(marks)
        cols[length] = col
        notes.append(f"2 × {length:,}: products {flops / 1e12:,.0f} TFLOP at {rate / 1e12:,.0f} TFLOP/s ({rate_note}); "
                     f"seeds: {seed_note}.")
    if not cols:
        by_hand = by_hand_accounting(root)
        return ("The step's accounting: not measured in this run (it needs the traced step, flash_check's kernel "
                "times and the sampling run's copy rate).\n" + "".join(f"\n{l}" for l in by_hand) + ("\n" if by_hand else ""))
    lens = sorted(cols)
    head = "| part of the step (ms) | " + " | ".join(
        f"2 × {l:,} measured | 2 × {l:,} predicted, seeded by `backward_seed`" for l in lens) + " | the twin |"
    out = [head, "|---|" + "---:|---:|" * len(lens) + "---|"]
    names = [("attention", "attention kernels (forward, recompute, backward; flash_check's kernel times)"),
             ("matmul", "cuBLAS matrix products (estimate: FLOPs at the rate below)"),
             ("seeds", "backward seeds (the layers', the embedding's and the tied lm_head's)"),
             ("other", "other element-wise passes, zero fills, adds and casts (the rest)"),
             ("adamw", "AdamW, the bf16 copy, the gradient sums (their phases)"),
             ("step", "step (measured; predicted: the sum)")]
    for key, label in names:
        cells = []
        for l in lens:
            c = cols[l]
            measured = in_ms(c[key]) + (" (estimate)" if key in c["estimated"] else "")
            cells += [measured, in_ms(c["predicted"][key]) if "predicted" in c else "—"]
        twin = ""
        if key == "attention":
            twin = "sdpa " + " / ".join(in_ms(cols[l].get("twin", (None, None))[0]) for l in lens)
        elif key == "other":
            rest = [cols[l]["twin"][1] - cols[l]["twin"][0] if cols[l].get("twin", (None,))[0] else None for l in lens]
            twin = "the rest of the twin " + " / ".join(in_ms(r) for r in rest)
        elif key == "step":
            twin = " / ".join(in_ms(cols[l].get("twin", (None, None))[1]) for l in lens)
        out.append(f"| {label} | {' | '.join(cells)} | {twin} |")
    saved = [f"2 × {l:,}: {1e3 * (cols[l]['step'] - cols[l]['predicted']['step']):,.0f} ms "
             f"({cols[l]['step'] / cols[l]['predicted']['step']:.2f}× the step's speed)"
             for l in lens if "predicted" in cols[l]]
    out.append("")
    out += [f"- {n}" for n in notes]
    out.append(f"- Bytes at the run's measured copy rate, {bw / 1e9:,.0f} GB/s (the sampling run's roofline). "
               f"The prediction takes out the old seed's one-block sums and its {OLD_SEED_PASSES} element passes a seeded "
               f"tensor and adds `backward_seed`'s {NEW_SEED_VALUE_PASSES} (its value) and {NEW_SEED_BACKWARD_PASSES} "
               "(its backward).")
    if saved:
        out.append(f"- Predicted time saved a step: {'; '.join(saved)}.")
    bench = bench_attention_prediction(root, bw)
    if bench:
        out += ["", "| one layer's attention, forward + backward (ms) | `acpo bench attention` measured "
                "| predicted, seeded by `backward_seed` | the kernels alone (flash_check) | torch sdpa |",
                "|---|---:|---:|---:|---:|", *bench]
    for l in lens:
        if cols[l]["parts"]:
            out += ["", f"| 2 × {l:,}: the {layers} layers' recompute and backward by part (`--trace`, summed) | ms |",
                    "|---|---:|", *[f"| {k} | {in_ms(v)} |" for k, v in cols[l]["parts"].items()]]
    by_hand = by_hand_accounting(root, {l: c["step"] for l, c in cols.items()})
    if by_hand:
        out += ["", *by_hand]
    return "\n".join(out) + "\n"


def by_hand_accounting(root, autograd_steps=None):
    """The traced step with each layer's backward by hand (`paper-LENGTH-by-hand`, issue #59) by
    kind of work, from the trace's parts (src/device.rs) in the forward without a graph and the
    layers' recompute and backward: the attention's kernels, the layers' matrix products, the
    seeds' values, the layers' element-wise passes and their weights' gradients handed to the
    fp32 masters (the cast cuBLAS with beta = 1 into the sums would save), each measured; the
    head's products estimated at the layers' measured rate; the optimizer's phases; and the rest
    of the traced step (the head's other work, the embedding's backward, the layers' gradients
    into the sums, the trace's waits). Its own table, not columns beside the autograd step's
    accounting, whose attention is flash_check's kernels alone and whose rest is estimated from
    the untraced step; that step's time (`autograd_steps`, seconds by length) and the twin's are
    set beside. Nothing where the by-hand step was not traced with its backward in parts."""
    cols = {}
    for length in LENGTHS:
        run = step_run(root, length, "by-hand")
        if not (run and run.get("trace") and run.get("settings")):
            continue
        marks, st = run["trace"], run["settings"]
        names = {p["name"] for m in marks for p in m.get("parts", [])}
        if PART_PRODUCTS[1] not in names or PART_ONE_REST in names:
            continue  # a binary whose by-hand backward was one part
        layer_like = lambda ph: is_layer_phase(ph) or ph.startswith("forward without a graph")
        part = lambda *names: sum(part_seconds(marks, layer_like, name) for name in names)
        traced = sum(m.get("seconds") or 0 for m in marks)
        n, nr = st["batch"] * st["seq_len"], st["batch"] * (st["seq_len"] - st["prompt_len"])
        layer_flops = 4 * 2 * n * layer_matmul_params(st) * st["layers"]
        products = part(*PART_PRODUCTS)
        head = 8 * nr * st["vocab"] * st["hidden"] * products / layer_flops if products > 0 else 0.0
        col = {"attention": part(*PART_ATTENTION), "matmul": products + head, "seeds": part(PART_SEED),
               "elementwise": part(*PART_ELEMENTWISE), "to_masters": part(PART_TO_MASTERS),
               "adamw": optimizer_seconds(marks),
               "traced": traced, "step": run["seconds"]}
        col["other"] = traced - sum(col[k] for k in ("attention", "matmul", "seeds", "elementwise", "to_masters",
                                                     "adamw"))
        torch = train_runs(root, length)[1]
        col["twin"] = torch["seconds"] if torch else None
        col["autograd"] = (autograd_steps or {}).get(length)
        col["parts"] = layer_parts(marks)
        cols[length] = col
    if not cols:
        return []
    lens = sorted(cols)
    out = [f"The step with {BY_HAND} (`--layer-by-hand --trace`) by kind of work, each measured by its own "
           "parts of the trace but the head's products:", "",
           "| part of the traced step (ms) | " + " | ".join(f"2 × {l:,}" for l in lens) + " |",
           "|---|" + "---:|" * len(lens)]
    rows = [("attention", "attention kernels (forward, recompute, backward)"),
            ("matmul", "matrix products (the layers' measured, the head's at their rate)"),
            ("seeds", "the seeds' values"),
            ("elementwise", "the layers' element-wise passes (forward, recompute, backward)"),
            ("to_masters", "the layers' weight gradients to their fp32 masters (what cuBLAS with beta = 1 would save)"),
            ("adamw", "AdamW, the bf16 copy, the gradient sums (their phases)"),
            ("other", "the rest: the head's other work, the embedding's backward, the layers' gradients into "
                      "the sums, the trace's waits"),
            ("traced", "the traced step (the sum)")]
    for key, label in rows:
        out.append(f"| {label} | {' | '.join(in_ms(cols[l][key]) for l in lens)} |")
    out.append(f"| the step untraced (the rate's) | {' | '.join(in_ms(cols[l]['step']) for l in lens)} |")
    out.append(f"| the autograd step untraced | {' | '.join(in_ms(cols[l]['autograd']) for l in lens)} |")
    out.append(f"| the twin | {' | '.join(in_ms(cols[l]['twin']) for l in lens)} |")
    ratios = []
    for l in lens:
        c = cols[l]
        said = [f"{c['twin'] / c['step']:.2f}× the twin's speed (target ≥ 1.0)"] if c["twin"] else []
        said += [f"{c['autograd'] / c['step']:.2f}× the autograd step's"] if c["autograd"] else []
        if said:
            ratios.append(f"2 × {l:,}: {', '.join(said)}")
    out.append("")
    out.append("- The traced step waits for the device at every part (on a GPU, time the untraced step overlaps "
               "with the host's launches), so its sum is not the untraced step's time, which is the rate's; the "
               "head's products are its 8·(response tokens)·V·H FLOPs at the layers' measured product rate. The seed's "
               "own backward and the attention's gradients added into candle's store are element-wise passes here, as "
               "they are in the autograd step's rest.")
    if ratios:
        out.append(f"- {'; '.join(ratios)}.")
    for l in lens:
        out += ["", f"| 2 × {l:,}, {BY_HAND}: the layers' recompute and backward by part (`--trace`, summed) | ms |",
                "|---|---:|", *[f"| {k} | {in_ms(v)} |" for k, v in cols[l]["parts"].items()]]
    return out


def decode_rate(row):
    """New tokens/s of the decode steps alone (prefill left out), where the run measured it."""
    r = row.get("roofline", row)
    return r.get("decode_tokens_per_second")


def sampling_shape(acpo):
    """(batch, prompt length, new tokens) of an `acpo bench generate` row, from its shape's
    words (`generate_shape` in src/perf/generate.rs), or None."""
    m = re.match(r"(\d+) prompts of (\d+) \+ (\d+) new tokens", acpo.get("shape") or "")
    return tuple(int(x) for x in m.groups()) if m else None


def hf_runs(root, acpo):
    """The HF generate runs of acpo's sampling shape: the same prompts, prompt length and new
    tokens (only the tokens where acpo's row does not say its shape)."""
    torches = [load(p) for p in found(root, "torch-generate-*.json")]
    shape = sampling_shape(acpo)
    if shape is None:
        return [t for t in torches if t["new_tokens"] * t["batch"] == acpo["tokens"]]
    return [t for t in torches if (t["batch"], t["prompt_len"], t["new_tokens"]) == shape]


def versus_hf(acpo, same):
    """acpo over the fastest HF run of its shape: on decode tokens/s where every run measured
    them, else on all new tokens/s; and whether it was on decode."""
    if decode_rate(acpo) and all(decode_rate(t) for t in same):
        return decode_rate(acpo) / max(decode_rate(t) for t in same), True
    return acpo["tokens_per_second"] / max(t["tokens_per_second"] for t in same), False


def generate(root, lines):
    out = []
    d = latest(root, "generate-paper")
    acpo = load(d / "generate.json")[0] if d and (d / "generate.json").exists() else None
    if acpo:
        r = acpo["roofline"]
        same = hf_runs(root, acpo)
        dec = lambda row: fmt(decode_rate(row)) if decode_rate(row) else "—"
        pre = lambda row: f"{row['prefill_seconds']:.3f}" if "prefill_seconds" in row else "—"
        step = lambda row: f"{1000 * row['step_seconds']:.1f}" if "step_seconds" in row else "—"
        out += ["| engine | shape | new tokens/s, all | prefill s | decode tokens/s | ms per decode step | of the HBM roofline |",
                "|---|---|---:|---:|---:|---:|---:|",
                f"| acpo | {acpo['shape']} | {fmt(acpo['tokens_per_second'])} | {pre(r)} | {dec(acpo)} "
                f"| {step(r)} | {100 * r['fraction']:.1f} % (target ≥ 50 %) |"]
        # the same shape over an FP8 KV cache (`--kv-cache fp8`, issue #57): its roofline
        # counts K and V at one byte a number
        d8 = latest(root, "generate-paper-fp8")
        fp8 = load(d8 / "generate.json")[0] if d8 and (d8 / "generate.json").exists() else None
        if fp8:
            r8 = fp8["roofline"]
            out.append(f"| acpo, FP8 KV cache | {fp8['shape']} | {fmt(fp8['tokens_per_second'])} | {pre(r8)} "
                       f"| {dec(fp8)} | {step(r8)} | {100 * r8['fraction']:.1f} % of its own bytes |")
        for t in same:
            out.append(f"| HF generate ({t['cache']} cache) | {t['batch']} prompts of {t['prompt_len']} + "
                       f"{t['new_tokens']} new tokens | {fmt(t['tokens_per_second'])} | {pre(t)} | {dec(t)} | {step(t)} | — |")
        if same:
            x, on_decode = versus_hf(acpo, same)
            ratio = (f"decode {x:.2f}× (target ≥ 3×)" if on_decode
                     else f"{x:.2f}× of all new tokens/s (target ≥ 3× decode)")
            all_tokens = acpo["tokens_per_second"] / max(t["tokens_per_second"] for t in same)
            out += ["", f"acpo ÷ HF generate: {ratio}; all new tokens/s, prefill included: "
                    f"{all_tokens:.2f}×. Decode: the run's time less "
                    f"its prefill's (the same prompts sampled for one token), over the other N − 1 tokens, on both "
                    f"sides. Roofline: {r['bytes_per_step'] / 1e9:.1f} GB of weights + mean KV cache per decode step "
                    f"against a measured device copy of {r['copy_gb_per_s']:,.0f} GB/s."]
        share = host_share(r)
        if share:
            out += ["", f"acpo's decode at this shape:{share}"]
        if fp8 and decode_rate(fp8) and decode_rate(acpo):
            out += ["", f"The FP8 KV cache's decode over the bf16 cache's: {decode_rate(fp8) / decode_rate(acpo):.2f}× "
                    f"({r8['bytes_per_step'] / 1e9:.1f} GB a decode step against {r['bytes_per_step'] / 1e9:.1f})."]
    dense = long_tail_dense(root)
    if dense:
        waves, cont = dense
        out += ["", "| long-tailed lengths | waves tokens/s | continuous batching tokens/s | gain |",
                "|---|---:|---:|---:|",
                f"| {cont['shape'].split(': ')[0]} | {fmt(waves['tokens_per_second'])} "
                f"| {fmt(cont['tokens_per_second'])} | {cont['tokens_per_second'] / waves['tokens_per_second']:.2f}× |"]
        how = re.search(r"continuous batching \((\d+ prompts joined[^)]*)\)", cont['shape'])
        if how:  # runs since the dense engine joins prompts in place
            out += ["", f"The dense engine's continuous batching: {how.group(1)}."]
        out += long_tail_bound(cont)
    paged = long_tail_paged(root)
    if paged:
        out += ["", f"The same over the paged KV cache (`--paged-kv`: {paged['shape'].split(', continuous batching over the paged KV cache, ')[-1]}): "
                f"{fmt(paged['tokens_per_second'])} tokens/s in all."]
        out += long_tail_bound(paged, "The paged run's")
    fp8 = long_tail_paged(root, "generate-long-tail-paged-fp8")
    if fp8:
        dense8 = long_tail_dense(root, ("generate-long-tail-paged-fp8",))
        before = (f"waves {fmt(dense8[0]['tokens_per_second'])} tokens/s, continuous batching "
                  f"{fmt(dense8[1]['tokens_per_second'])} tokens/s, " if dense8 else "")
        out += ["", f"The same over an FP8 KV cache (`--kv-cache fp8`, E4M3 bytes): {before}over the paged pool "
                f"({fp8['shape'].split(', continuous batching over the paged KV cache, ')[-1]}) "
                f"{fmt(fp8['tokens_per_second'])} tokens/s in all."]
        out += long_tail_bound(fp8, "The paged FP8 run's")
    ev = long_tail_paged(root, "generate-eval")
    if ev:
        words = ev["shape"].split(", continuous batching over the paged KV cache, ")
        out += ["", f"At the evaluations' shape (`generate-eval`, {words[0]}; {words[-1]}): {fmt(ev['tokens_per_second'])} "
                f"tokens/s in all over the paged KV cache, the plan's rate for the evaluations."]
        out += long_tail_bound(ev, "That run's")
    out += decode_launches(root)
    check = latest(root, "flash_kernels_check.log")
    if check:
        out += flash_kernels(check, root)
    out += decode_kernels(root)
    return out or ["sampling: not run"]


def long_tail_dense(root, names=("generate-long-tail", "generate-long-tail-paged")):
    """The long-tail run's waves and continuous-batching rows over the dense cache (`acpo bench
    generate --long-tail`): from its own run, else the first two rows of the paged run, which
    measures them first on the same prompts, keys and lengths; or None."""
    for name in names:
        d = latest(root, name)
        rows = load(d / "generate.json") if d and (d / "generate.json").exists() else None
        dense = dense_rows(rows or [])
        if dense:
            return dense
    return None


def is_paged(row):
    """Whether a long-tail row is the paged engine's run (`acpo bench generate --long-tail
    --paged-kv`: its shape says so)."""
    return ", continuous batching over the paged KV cache, " in row.get("shape", "")


def paged_row(rows):
    """A long-tail run's paged row (its last; the only one with `--paged-only`), or None."""
    paged = [r for r in rows if is_paged(r)]
    return paged[-1] if paged else None


def dense_rows(rows):
    """A long-tail run's waves and continuous batching over the dense cache (its first two rows
    that are not the paged run's), or None."""
    dense = [r for r in rows if not is_paged(r)]
    return (dense[0], dense[1]) if len(dense) >= 2 else None


def long_tail_paged(root, name="generate-long-tail-paged"):
    """The long-tail run over the paged KV cache (`acpo bench generate --long-tail --paged-kv`,
    its last row, the only one with `--paged-only`), or None."""
    d = latest(root, name)
    rows = load(d / "generate.json") if d and (d / "generate.json").exists() else None
    return paged_row(rows or [])


def host_share(r):
    """What a decode run's roofline says of the host (`GenStats::host_share`, runs since issue
    #57's last review): a sentence, or nothing for a run that did not measure it."""
    share = r.get("host_share")
    if share is None:
        return ""
    bound = ("the host's work (issuing the launches, its bookkeeping), not the bytes, bounds a step" if share >= 0.9
             else "the kernels bound a step" if share <= 0.5 else "host and kernels both count")
    return (f" The host was busy for {100 * share:.0f} % of the decode time, waiting for the GPU's draws "
            f"the rest: {bound}.")


def kv_bytes(row):
    """The KV cache's bytes a decode step of a long-tail run reads: its roofline's bytes a step
    less every weight once, at 2 bytes a weight in bf16 and 4 in f32."""
    weights = row["parameters"] * (2 if row["target"].endswith("bf16") else 4)
    return max(row["roofline"]["bytes_per_step"] - weights, 0.0)


def kv_fraction(row):
    """A long-tail run's decode steps against issue #57's KV-bandwidth bound: the device's copy
    rate over the bytes of the KV cache alone that a token reads, as a fraction; None without a
    roofline."""
    r = row.get("roofline")
    if not r:
        return None
    return kv_bytes(row) / r["step_seconds"] / (r["copy_gb_per_s"] * 1e9)


def kv_ceiling(row):
    """The most of the KV-bandwidth bound a run's shape allows: the cache's share of the bytes
    its decode steps read, reached were every byte, the weights' too, moved at the copy rate.
    Few rows a step (a batch smaller than the memory holds, or a long tail's last steps) leave
    the weights most of a step's bytes, and the bound out of reach."""
    r = row.get("roofline")
    if not r or r["bytes_per_step"] <= 0:
        return None
    return kv_bytes(row) / r["bytes_per_step"]


def kv_target(row):
    """Issue #57's target of ≥ 70 % of the KV-bandwidth bound for a long-tail run: the words and
    the verdict. A shape whose ceiling is below 70 % cannot show it (too few rows a step, or too
    short contexts, for the cache to be most of a step's bytes):
    not measured, whatever its engine did."""
    f, c = kv_fraction(row), kv_ceiling(row)
    words = (f"{100 * f:.1f} % ({100 * row['roofline']['fraction']:.1f} % of the roofline with the weights; "
             f"this shape's ceiling {100 * c:.1f} %; {row['shape']})")
    if f >= 0.7:
        return words, "yes"
    if c < 0.7:
        return words + ": this shape cannot show it (the weights are too much of a step's bytes)", "not measured"
    return words, "no"


def long_tail_bound(cont, who="Continuous batching's"):
    """A long-tail run's decode steps against the bytes they must read (`acpo bench generate
    --long-tail`; nothing for a run without them)."""
    r = cont.get("roofline")
    if not r:
        return []
    bound = r["decode_tokens_per_second"] / r["fraction"]
    kv = kv_fraction(cont)
    return ["", f"{who} decode steps: {fmt(r['decode_tokens_per_second'])} tokens/s "
            f"({1000 * r['step_seconds']:.1f} ms a step; the prefills {r['prefill_seconds']:.1f} s in all, not counted), "
            f"{100 * r['fraction']:.1f} % of the roofline of {fmt(bound)} tokens/s: every weight once a "
            f"step and each row's own cache, {r['bytes_per_step'] / 1e9:.2f} GB a step on average, at the measured "
            f"copy of {r['copy_gb_per_s']:,.0f} GB/s; {100 * kv:.1f} % of the KV-bandwidth bound (the cache's bytes "
            f"alone at that rate, issue #57's bound; target ≥ 70 %), of at most {100 * kv_ceiling(cont):.1f} % at this "
            f"shape (the cache's share of the bytes).{host_share(r)}"]


def train_kernels(root):
    """The kernels of one train step, most time first (ncu over `acpo bench train-step` with 4 of
    Qwen3-1.7B's layers and each layer's backward by hand, tools/gpu/launches.py), where the run
    profiled one."""
    got = load(latest(root, "train-kernels.json"))
    if not got:
        return []
    out = [f"The kernels of one train step (ncu over `acpo bench train-step --layer-by-hand` with 4 of "
           f"Qwen3-1.7B's 28 layers at 2 × 2,048, {got.get('steps', got['decode_steps'])} steps found by `tools/gpu/launches.py "
           f"--ends-at {got.get('ends_at', 'adamw_sq_total')}`): {got['launches_per_step']} launches, "
           f"{got['kernel_ms_per_step']:.1f} ms of kernel time a step, most time first:", "",
           "| kernel | launches a step | µs a step |", "|---|---:|---:|"]
    out += [f"| {r['kernel']} | {r['launches']:g} | {r['us']:.1f} |" for r in got["by_kernel"][:25]]
    rest = got["by_kernel"][25:]
    if rest:
        out.append(f"| {len(rest)} other kernels | {sum(r['launches'] for r in rest):g} "
                   f"| {sum(r['us'] for r in rest):.1f} |")
    return out + [""]


def decode_launches(root):
    """The kernels one decode step launches (ncu, tools/gpu/launches.py), where the run counted
    them."""
    got = load(latest(root, "launches.json"))
    if not got:
        return []
    out = ["", f"The kernels of one decode step (ncu over `acpo bench generate`, {got['decode_steps']} steps "
           f"counted by `tools/gpu/launches.py`): {got['launches_per_step']} launches, "
           f"{got['kernel_ms_per_step']:.2f} ms of kernel time a step at the profiled shape:", "",
           "| kernel | launches a step | µs a step |", "|---|---:|---:|"]
    out += [f"| {r['kernel']} | {r['launches']:g} | {r['us']:.1f} |" for r in got["by_kernel"]]
    return out


def flash_kernels(check, root):
    """The standalone check's timings: the first harness's lines (`name shape: ms, GB/s, TFLOP/s`,
    forwards only) or kernels/check/flash_check.cu's (`time name shape: forward …; backward …;
    forward + backward …`)."""
    lines = check.read_text().splitlines()
    old = [l for l in lines if " ms, " in l and not l.startswith("time ")]
    # the pipelined decode's lines have their own table (decode_kernels)
    new = [l for l in lines if l.startswith("time ") and not l.startswith("time decode pipe")]
    run = check.relative_to(root).parts[0]
    out = []
    if old:
        out += ["", f"The attention kernels alone (the standalone check, `tools/flash_kernels_check.cu` then, "
                f"`kernels/check/flash_check.cu` now; {run}; B sequences, H query heads over KV heads, "
                "T query positions after `past` cached keys, head dim D, bf16; GB/s counts K and V once):", "",
                "| kernel | shape | time | bandwidth | arithmetic |", "|---|---|---:|---:|---:|"]
        for l in old:
            name, rest = l.split(None, 1)
            shape, nums = rest.split(": ", 1)
            ms, gbs, tf = (x.strip() for x in nums.split(","))
            out.append(f"| {name} | {shape} | {ms} | {gbs.replace(' (K/V once)', '')} | {tf} |")
        out += ["", "decode: the split-K decode kernel (one query position); mma64/mma128: the tensor-core "
                "forward (bf16, head dim 64/128, several query positions); scalar: the row kernel (one warp "
                "per query row), the only forward before, timed in the same run."]
    if new:
        out += ["", f"The attention kernels alone (`kernels/check/flash_check.cu`, {run}; B sequences, H query "
                "heads over KV heads, T query positions after `past` cached keys, head dim D, bf16; median of 7 "
                "runs; TFLOP/s as FA2 counts them, the backward 2.5× the forward's):", "",
                "| kernel | shape | forward | forward TFLOP/s | backward | backward TFLOP/s | forward + backward | TFLOP/s |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        for l in new:
            head, rest = l[len("time "):].split(" B", 1)
            shape, parts = ("B" + rest).split(": ", 1)
            fields = {}
            for part in parts.split("; "):
                key, value = part.split(" ", 1) if not part.startswith("forward + backward") else (
                    "both", part[len("forward + backward "):])
                fields[key] = [x.strip() for x in value.split(",")]
            fwd, bwd, both = fields.get("forward"), fields.get("backward"), fields.get("both")
            out.append(f"| {head.strip()} | {shape} | {fwd[0]} | {fwd[-1].replace(' TFLOP/s', '')} | "
                       f"{bwd[0] if bwd else '—'} | {bwd[-1].replace(' TFLOP/s', '') if bwd else '—'} | "
                       f"{both[0] if both else '—'} | {both[-1].replace(' TFLOP/s', '') if both else '—'} |")
    return out


def adamw_check(root):
    """kernels/check/adamw_check.cu on the GPU: each step against the CPU twin's bits."""
    log = latest(root, "adamw_check.log")
    if not log:
        return []
    lines = [l for l in log.read_text().splitlines() if l.startswith(("adamw ", "FAILED", "all checks"))]
    return ["The whole-model AdamW step on the GPU (`kernels/check/adamw_check.cu`):", "",
            *[f"- {l}" for l in lines], ""]


def kernels_load(root):
    """`acpo bench kernels-load` (the suite's first step, in the background): the driver's load
    of each kernel module (acpo's and candle's), its JIT of the PTX on a cold cache."""
    path = latest(root, "kernels-load.json")
    if not path:
        return []
    got = load(path)
    mods = sorted(got["modules"], key=lambda m: -m["seconds"])
    out = [f"The driver's load of acpo's kernel modules (`acpo bench kernels-load`, the PTX compiled "
           f"for this GPU unless its cache held it): {got['total_seconds']:.1f} s in all, the slowest:", "",
           "| module | PTX | seconds |", "|---|---:|---:|"]
    out += [f"| `{m['module']}` | {m['ptx_bytes'] / 1e3:,.0f} KB | {m['seconds']:.2f} |" for m in mods[:5]]
    return out + [""]


def ops_check(root):
    """kernels/check/ops_check.cu on the GPU: every other kernel against float64, then the
    kernels issue #44 changed, timed at Qwen3-1.7B's shapes."""
    log = latest(root, "ops_check.log")
    if not log:
        return []
    text = log.read_text().splitlines()
    checked = [l for l in text if l.rstrip().endswith(" ok") or "FAILED" in l]
    timed = [l[5:].rstrip() for l in text if l.startswith("time ")]
    out = [f"The other kernels (`kernels/check/ops_check.cu`): {len(checked)} checks against float64 "
           f"and the CPU twins, {sum('FAILED' in l for l in checked)} failed; the kernels issue #44 changed, "
           "timed (median of 21; kernels/NOTES.md has the predictions):", "",
           "| kernel and shape | time | achieved |", "|---|---:|---:|"]
    for t in timed:
        m = re.match(r"(.*?)\s{2,}([\d.]+ us)\s+([\d.]+ GB/s)", t)
        if m:
            out.append(f"| {m.group(1)} | {m.group(2)} | {m.group(3)} |")
    return out + [""]


# The suite's steps whose peak the CPU predicts: (the run's variant, `perf::predict::Variant` as
# memory-predicted.json names it, the words, the issue whose target it is).
PREDICTED_STEPS = (("", "all-savings", "", "#44"), ("by-hand", "layer-by-hand", f", {BY_HAND}", "#59"))


def predicted_peaks(variant="all-savings"):
    """The CPU-predicted peaks of the 2 x L train step run as `variant` (`acpo bench
    memory-predict`, committed in results/cpu-memory), by length: (peak, bound, phase) in bytes."""
    path = REPO / "results/cpu-memory/memory-predicted.json"
    if not path.exists():
        return {}
    return {r["shape"]["seq_len"]: (r["peak"], r["bound"], r["phase"]) for r in load(path)
            if r["variant"] == variant and r["shape"]["micro_batch"] == 2}


def peaks_beside_prediction(root):
    """(length, words, issue, acpo's train step, its predicted (peak, bound, phase)) for each
    step and length with both: only traced runs (the prediction's code, issue #44's suite on),
    the autograd step's and the by-hand one's (issue #59)."""
    for variant, predicted, words, issue in PREDICTED_STEPS:
        pred = predicted_peaks(predicted)
        for length in LENGTHS:
            acpo = step_run(root, length, variant)
            if acpo and acpo.get("trace") and length in pred:
                yield length, words, issue, acpo, pred[length]


def memory_vs_prediction(root):
    out = ["| tokens | measured peak GiB | phase of the peak | CPU-predicted GiB (bound) | predicted phase | measured ÷ predicted |",
           "|---|---:|---|---:|---|---:|"]
    for length, words, _, acpo, (p, b, pphase) in peaks_beside_prediction(root):
        peak = acpo["memory"]["peak"]
        phase = max(acpo["trace"], key=lambda m: m.get("peak") or 0).get("phase", "—")
        out.append(f"| 2 × {length}{words} | {peak / 2**30:.1f} | {phase} | {p / 2**30:.1f} ({b / 2**30:.1f}) "
                   f"| {pphase} | {peak / p:.3f} |")
    if len(out) == 2:
        return []
    return ["The measured peak beside the one predicted on the CPU (`acpo bench memory-predict`, "
            "results/cpu-memory):", "", *out, ""]


def pipeline_run(root):
    """`acpo pipeline` as far as it got: its metrics are written step by step, so a run cut by
    the call's time still says what each finished step took. Returns (steps done, steps asked,
    peak GiB, how it ended) and the table of its steps; (None, []) where it did not run."""
    metrics = found(root, "pipeline-results/*/*/metrics.jsonl")
    if not metrics:
        return None, []
    steps = [json.loads(l) for l in metrics[-1].read_text().splitlines() if l.strip()]
    log = latest(root, "pipeline-qwen3-1.7b-grpo.log")
    text = log.read_text() if log else ""
    asked = re.search(r"training from step \d+ of (\d+)", text)
    cut = any(l.startswith("== acpo pipeline") and (step_exit(l) or ("", 0))[1] == 124 for l in summary_lines(root))
    ended = ("out of memory" if "OUT_OF_MEMORY" in text
             else "before the call's time ran out, no out-of-memory" if cut else "no out-of-memory")
    # the samplers' KV cache, as the run's own manifest says (absent: dense, every run before #57)
    manifest = metrics[-1].parent / "manifest.yaml"
    # (`acpo pipeline --paged-kv` writes the value quoted, a manifest by hand may not)
    paged = manifest.exists() and re.search(r"""(?m)^kv_layout:\s*["']?paged["']?\s*$""", manifest.read_text())
    out = [f"Samplers on the {'paged' if paged else 'dense'} KV cache.", "",
           "| step | s | gen s | old log-prob s | update s | gen tokens/s | peak GiB (gen, update) | response length |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in steps:
        g = lambda k: m.get(k, float("nan"))
        out.append(f"| {int(g('training/global_step'))} | {g('timing_s/step'):.1f} | {g('timing_s/gen'):.1f} "
                   f"| {g('timing_s/old_log_prob'):.1f} | {g('timing_s/update_actor'):.1f} "
                   f"| {fmt(g('perf/tokens_per_s/gen'))} | {g('perf/max_memory_allocated_gb/gen'):.1f}, "
                   f"{g('perf/max_memory_allocated_gb/update_actor'):.1f} | {g('response_length/mean'):.0f} |")
    return (len(steps), int(asked.group(1)) if asked else None,
            max(m.get("perf/max_memory_allocated_gb/step", 0) for m in steps) if steps else 0, ended), out


def step_exit(line):
    """A summary line's step and exit status (`== NAME: exit RC in N s …`), or None."""
    m = re.match(r"== (.*): exit (\d+) in \d+ s", line)
    return (m.group(1), int(m.group(2))) if m else None


def unfinished(lines):
    """Steps that did not end well: cut by a time limit (exit 124, however the suite worded it:
    `(cut at N s)` before, `(cut: its section's time ran out …)` or `(its own limit …)` since),
    failed (any other non-zero exit, an out-of-memory's 2 among them) or not run; unless a
    later call ran the same step to the end."""
    done = {e[0] for e in map(step_exit, lines) if e and e[1] == 0}

    def not_run(line):
        """The step a `== NAME: [cut, ]not run …` line names (a name may hold ': '), or None."""
        m = re.match(r"== (.*): (?:cut, )?not run\b", line)
        return m.group(1) if m else None

    bad = sorted({l[3:] for l in lines if l.startswith("== ")
                  and (((e := step_exit(l)) and e[1] != 0 and e[0] not in done)
                       or ((name := not_run(l)) and name not in done))})
    return [f"- {l}" for l in bad] or ["- none"]


def report(root):
    lines = summary_lines(root)
    tests, errs = tests_table(root)
    plan = plan_file(root, "paper-plan.md")
    fp8_plan = sibling_plan_file(plan, "fp8-kv")
    _, pipeline_steps = pipeline_run(root)
    parts = [
        f"Raw results: `{root}` ({machine(root, lines)}).", "",
        "**Correctness.**", "", *tests, "",
        *(["bf16 and f32 logits of the fixture models against transformers (last run):", "",
           *[f"- {e.strip()}" for e in errs], ""] if errs else []),
        *adamw_check(root),
        *ops_check(root),
        *kernels_load(root),
        *parity_table(root), "",
        "**Built-in speed benchmarks** (`acpo bench train-step|generate`, issue #4's sizes):", "",
        *builtin_benches(root), "",
        "**Paper-shape train step** (issue #19):", "", *train_step(root, lines), "",
        *train_phases(root),
        *train_kernels(root),
        *memory_vs_prediction(root),
        "**Flash attention against torch's sdpa** (issue #19):", "", *attention(root), "",
        "**Sampling** (issue #20):", "", *generate(root, lines), "",
        *(["**`acpo pipeline` on qwen3-1.7b-grpo at paper shape** (random weights, `--divisor 64`; "
           "each finished step's `timing_s/*` and memory from its metrics.jsonl):", "",
           *pipeline_steps, ""] if pipeline_steps else []),
        "**Steps cut by their time limit, failed (out of memory among them) or not run** (in any call, unless a later call ran the same step to the end):", "", *unfinished(lines), "",
    ]
    if plan:
        parts += ["**Costed paper plan** (`acpo bench paper-plan`, from the rates above):", "",
                  plan.read_text().strip(), ""]
    if fp8_plan:
        parts += ["**The same plan from the rate sampled over an FP8 KV cache** (`--kv-cache fp8`):", "",
                  fp8_plan.read_text().strip(), ""]
    by_hand_plan = sibling_plan_file(plan, "by-hand")
    if by_hand_plan:
        parts += [f"**The same plan from the train step with {BY_HAND}** "
                  "(`model.layer_backward: by-hand`; the same sampling rates):", "",
                  by_hand_plan.read_text().strip(), ""]
    return "\n".join(parts)


def targets(root):
    """The CUDA issues' targets beside what the run measured."""
    rows = []
    last = latest(root, "cuda_tests.log")
    got = test_results(last.read_text()) if last else None
    if got:
        cut = ", the rest cut" if got[2] == "cut" else ""
        crashed = ", a run ended without its result (a crash)" if got[2] == "FAILED" and not got[1] else ""
        rows.append(("#18", "every kernel, the model and training on CUDA match their CPU twins / transformers (CUDA tests)",
                     f"{got[0]} passed, {got[1]} failed{cut}{crashed}",
                     "no" if got[2] == "FAILED" else ("partly" if cut else "yes")))
    p = load(latest(root, "parity.json"))
    if p:
        f32 = next(r for r in p["rows"] if r["dtype"] == "f32")
        rows.append(("#18", "Qwen3-0.6B shape against transformers on the same GPU, f32",
                     f"max abs Δ log-prob {f32['max_abs_log_prob_diff']:.1e}",
                     "yes" if f32["max_abs_log_prob_diff"] < 1e-4 else "no"))
    for length in LENGTHS:
        acpo, torch, oom = train_runs(root, length)
        if length == LONG:
            rows.append(("#19", "Qwen3-1.7B, 2 × 9,220 tokens, bf16, checkpointing: fits one 80 GB GPU",
                         "out of memory" if oom else (f"peak {acpo['memory']['peak'] / 2**30:.1f} GiB" if acpo else "not run"),
                         "no" if oom or not acpo else "yes"))
        if acpo and torch:
            r = acpo["tokens_per_second"] / torch["tokens_per_second"]
            rows.append(("#19", f"train-step tokens/s ≥ 1.0× the PyTorch twin, 2 × {length}",
                         f"{r:.2f}× (MFU {mfu(acpo)} vs {mfu(torch)})", "yes" if r >= 1 else "no"))
        elif torch:
            rows.append(("#19", f"train-step tokens/s ≥ 1.0× the PyTorch twin, 2 × {length}",
                         "acpo out of memory" if oom else "acpo not run", "no"))
    d = latest(root, "generate-paper")
    acpo = load(d / "generate.json")[0] if d and (d / "generate.json").exists() else None
    if acpo:
        same = hf_runs(root, acpo)
        if same:
            caches = ", ".join(sorted({t["cache"] for t in same}))
            r, on_decode = versus_hf(acpo, same)
            what = (f"{r:.2f}× (decode steps; HF with its {caches} cache)" if on_decode
                    else f"{r:.2f}× (all new tokens, prefill included; HF with its {caches} cache)")
            rows.append(("#20", f"decode tokens/s ≥ 3× HF generate ({acpo['shape']})",
                         what, "yes" if r >= 3 else "no"))
        f = acpo["roofline"]["fraction"]
        rows.append(("#20", "decoding at ≥ 50 % of the HBM roofline", f"{100 * f:.1f} %", "yes" if f >= 0.5 else "no"))
        rows += paper_decode_targets(acpo, same)
    rows += decode_kernel_targets(root)
    dense = long_tail_dense(root)
    if dense:
        waves, cont = dense
        rows.append(("#20", "continuous batching against waves on long-tailed lengths (no number set)",
                     f"{cont['tokens_per_second'] / waves['tokens_per_second']:.2f}× the tokens/s", "measured"))
        if cont.get("roofline"):
            rows.append(("#57", "tokens/s at the memory-sized batch with long-tailed lengths ≥ 70 % of the "
                         "KV-bandwidth bound (the cache's bytes alone)", *kv_target(cont)))
    paged = long_tail_paged(root)
    if paged and paged.get("roofline"):
        rows.append(("#57", "tokens/s over the paged KV cache (the batch its pool holds at real lengths) with "
                     "long-tailed lengths ≥ 70 % of the KV-bandwidth bound (the cache's bytes alone)",
                     *kv_target(paged)))
    ev = long_tail_paged(root, "generate-eval")
    if ev and ev.get("roofline"):
        words, met = kv_target(ev)
        rows.append(("#57", "sampling at the evaluations' own shape, the plan's rate for them, ≥ 70 % of the "
                     "KV-bandwidth bound (the cache's bytes alone)",
                     f"{fmt(ev['tokens_per_second'])} tokens/s, {words}", met))
    got = load(latest(root, "launches.json"))
    if got:
        rows.append(("#57", "a decode step with few launches (no number set)",
                     f"{got['launches_per_step']} launches a step", "measured"))
    plan = plan_file(root, "paper-plan.json")
    rows.append(("#20", "a costed plan of the 16 paper runs from measured rates", "docs/CUDA.md" if plan else "not run",
                 "measured" if plan else "no"))
    rows += plan_targets(root, plan)
    rows += later_targets(root, acpo)
    out = ["| issue | target | measured | met |", "|---|---|---|---|"]
    out += [f"| {i} | {t} | {m} | {ok} |" for i, t, m, ok in rows]
    return "\n".join(out)


def plan_targets(root, plan):
    """Issues #43 and #57's plan target, qwen3-1.7b-grpo in ≤ 48 GPU-hours on one GPU (#57: an
    H100), from the plan of the run's rates on its own GPU, judged on the larger of its hours at
    the measured rates and at the paper's contexts (the sampling runs' decode steps carried to
    the run's own model and contexts, where the plan has it: the suite samples shorter contexts
    than a paper run); beside it what the KV-bandwidth bound allows in bf16 and in FP8, and the plan
    from the rate measured over an FP8 cache where there is one (tools/gpu/plan.sh). A run
    that measured the rates but has no plan yet says so."""
    grpo = lambda path: next((r for r in load(path) if r["run"] == "qwen3-1.7b-grpo"), None) if path else None
    got = grpo(plan)
    what = "qwen3-1.7b-grpo's plan ≤ 48 GPU-hours on one H100 from measured rates"
    if not got:
        rates = latest(root, "train-step.json") and latest(root, "generate.json")
        return [("#57", what, "no plan made from this run's rates yet (`just gpu-plan DIR`)", "no")] if rates else []
    gpu = gpu_name(root) or "GPU"
    carried = got.get("gpu_hours_at_paper_contexts")
    hours = max(got["gpu_hours"], carried or 0.0)
    measured = f"{got['gpu_hours']:.0f} GPU-hours on one {gpu}"
    if carried is not None:
        measured += f", {carried:.0f} at the paper's contexts"
    if got.get("gpu_hours_at_kv_bound") is not None:
        measured += (f" (at the KV-bandwidth bound {got['gpu_hours_at_kv_bound']:.0f}; with an FP8 KV cache at "
                     f"its bound {got['gpu_hours_at_fp8_kv_bound']:.0f}")
        fp8 = grpo(sibling_plan_file(plan, "fp8-kv"))
        measured += f", from its measured rate {fp8['gpu_hours']:.0f})" if fp8 else ")"
    # the option a run can take, beside the default the target is judged on
    by_hand = grpo(sibling_plan_file(plan, "by-hand"))
    if by_hand:
        measured += f"; {by_hand['gpu_hours']:.0f} with {BY_HAND}"
    on = "" if "H100" in gpu else f" (the issue's GPU is an H100; this run's: {gpu})"
    return [("#43", "the costed plan for qwen3-1.7b-grpo ≤ 48 GPU-hours on one GPU", measured,
             "yes" if hours <= 48 else "no"),
            ("#57", what + on, measured, "yes" if hours <= 48 and "H100" in gpu else "no")]


# Issue #57's decode attention shapes, as flash_check times them: (rows, keys).
DECODE_TARGET_SHAPES = ((64, 1025), (64, 2048), (1, 8192))


def decode_kernel_targets(root):
    """Issue #57's kernel target at each of its shapes: the pipelined decode attention at ≥ 80 %
    of the copy rate measured in the same call, judged on K and V once, Q and O (the chunks'
    partials written and read back, the statistics and the valid bits, ~3 % more, are the
    kernel's own overhead, so counting them would flatter it; a log from before flash_check
    printed that share is judged on every byte and says so). A shape missing from a log that
    timed the kernel (flash_check printed the copy rate) is a row too; a run from before the
    kernel has none."""
    check = latest(root, "flash_kernels_check.log")
    if not check or not re.search(r"^copy \d+ GB/s", check.read_text(), re.M):
        return []
    shapes = decode_kernel_times(root)
    rows = []
    for b, keys in DECODE_TARGET_SHAPES:
        what = f"decode attention kernel ≥ 80 % of the measured device copy rate, {b} × {keys:,} keys"
        got = shapes.get((b, keys), {})
        if "percent" not in got:
            rows.append(("#57", what, "not timed (flash_check's timing ended before this shape)", "no"))
            continue
        p = got.get("kvqo_percent", got["percent"])
        on = (f"on K, V, Q and O; {got['percent']:.1f} % on every byte it moves" if "kvqo_percent" in got
              else "on every byte it moves, its partials too")
        rows.append(("#57", what, f"{p:.1f} % ({on}; {1000 * got['pipe']:.1f} µs where every byte at "
                     f"{got['copy']:,.0f} GB/s takes {1000 * got['predicted']:.1f} µs)", "yes" if p >= 80 else "no"))
    return rows


# Issue #57's decode shape: 64 prompts of 1,024 tokens and 1,024 new ones (`acpo bench generate`'s
# shape string, as the suite runs it by default).
PAPER_DECODE_SHAPE = "64 prompts of 1024 + 1024 new tokens"


def paper_decode_targets(acpo, same):
    """Issue #57's targets for decode at 64 × (1,024 + 1,024): ≥ 60 % of the HBM roofline and
    ≥ 3× HF generate, from the run's paper-shape sampling (`generate-paper`) and the HF runs of
    its shape; a run at another shape says it did not measure them."""
    what = "decode at 64 × (1,024 + 1,024)"
    if acpo["shape"] != PAPER_DECODE_SHAPE:
        other = f"not run at that shape (this run: {acpo['shape']})"
        return [("#57", f"{what} ≥ 60 % of the HBM roofline", other, "not measured"),
                ("#57", f"{what} ≥ 3× HF generate", other, "not measured")]
    f = acpo["roofline"]["fraction"]
    rows = [("#57", f"{what} ≥ 60 % of the HBM roofline", f"{100 * f:.1f} %", "yes" if f >= 0.6 else "no")]
    static = [t for t in same if t["cache"] == "static"]
    if static:
        r, on_decode = versus_hf(acpo, static)
        rows.append(("#57", f"{what} ≥ 3× HF generate (static cache)",
                     f"{r:.2f}× ({'decode steps' if on_decode else 'all new tokens'})", "yes" if r >= 3 else "no"))
    else:
        rows.append(("#57", f"{what} ≥ 3× HF generate (static cache)",
                     "HF generate with a static cache not run at that shape", "not measured"))
    return rows


def later_targets(root, generate):
    """Issues #33 and #34's targets (the tensor-core attention, the step's speed and memory, a
    paper run end to end, decode at 60 % of the roofline), where the run has what they need."""
    rows = []
    torch = load(latest(root, f"torch-attention-{LONG}.json"))
    got = attention_run(root, LONG)
    if torch and got:
        r = got[2] / torch["forward_backward_s"]
        rows.append(("#33", "one layer's attention forward + backward at 2 × 9,220 within 2× of torch's sdpa",
                     f"{r:.1f}× torch's time ({got[3]:.0f} TFLOP/s; FA2's published 220–330)",
                     "yes" if r <= 2 else "no"))
    elif got:
        rows.append(("#33", "one layer's attention forward + backward at 2 × 9,220 within 2× of torch's sdpa",
                     f"{got[3]:.0f} TFLOP/s; torch's sdpa not run in this call", "not measured"))
    # Issue #59's kernel target, the kernels alone (flash_check's timings, FA2's way of
    # counting: 3.5× the forward's FLOPs, whatever the products run), for each backward timed.
    for kernel, label in (("mma", "7 products"), ("mma5", "5 products")):
        got = flash_check_both(root, kernel, LONG)
        if got:
            rows.append(("#59", f"one layer's attention forward + backward ≥ 200 TFLOP/s at 2 × 9,220 (kernels alone), "
                         f"backward in {label}", f"{got[1]:.0f} TFLOP/s ({got[0]:.1f} ms)", "yes" if got[1] >= 200 else "no"))
    # the suite's variants of the step (issue #59 items 2 and 3), each beside the twin; the
    # default step is #19's row
    variants = (("by-hand", BY_HAND), ("five", "attention backward in 5 products"))
    for length in LENGTHS:
        _, twin, _ = train_runs(root, length)
        for variant, label in variants:
            what = f"train-step tokens/s ≥ 1.0× the PyTorch twin (stretch 1.5×), 2 × {length}, {label}"
            got, ended = variant_run(root, length, variant)
            if got and twin:
                r = got["tokens_per_second"] / twin["tokens_per_second"]
                rows.append(("#59", what, f"{r:.2f}× (MFU {mfu(got)} vs {mfu(twin)})",
                             "yes, the stretch too" if r >= 1.5 else "yes" if r >= 1 else "no"))
            elif got:
                rows.append(("#59", what, f"{fmt(got['tokens_per_second'])} tokens/s; the twin did not run",
                             "not measured"))
            elif ended:
                rows.append(("#59", what, ended, "no"))
    for variant, label in (("", "the default step"), *variants):
        what = f"peak ≤ 40 GiB at 2 × 9,220, {label}"
        got, ended = variant_run(root, LONG, variant)
        if got:
            peak = got["memory"]["peak"] / 2**30
            rows.append(("#59", what, f"{peak:.1f} GiB", "yes" if peak <= 40 else "no"))
        elif ended:
            rows.append(("#59", what, ended, "no"))
    a, t, oom = train_runs(root, LONG)
    if t:
        peak = "out of memory" if oom else (f"{a['memory']['peak'] / 2**30:.1f} GiB" if a else "not run")
        ok = a is not None and a["memory"]["peak"] <= t["peak_bytes"]
        rows.append(("#33", f"2 × 9,220 fits with peak ≤ the twin's {t['peak_bytes'] / 2**30:.1f} GiB",
                     peak, "yes" if ok else "no"))
    if generate:
        f = generate["roofline"]["fraction"]
        rows.append(("#34", "decoding at ≥ 60 % of the HBM roofline", f"{100 * f:.1f} %",
                     "yes" if f >= 0.6 else "no"))
    for length, words, issue, a, (p, b, _) in peaks_beside_prediction(root):
        rows.append((issue, f"the measured peak at 2 × {length}{words} beside the CPU-predicted one",
                     f"{a['memory']['peak'] / 2**30:.1f} GiB measured, {p / 2**30:.1f} predicted "
                     f"(bound {b / 2**30:.1f})", "within the bound" if a["memory"]["peak"] <= b else "no"))
    done_steps, _ = pipeline_run(root)
    pipe = latest(root, "pipeline")
    if done_steps and not (pipe and (pipe / "pipeline.json").exists()):
        n, asked, peak, ended = done_steps
        rows.append(("#34", "qwen3-1.7b-grpo at paper shape on one GPU, 2 steps, no out-of-memory",
                     f"{n} of {asked} steps {ended}, peak {peak:.1f} GiB",
                     "no" if ended == "out of memory" else "partly"))
    if pipe and (pipe / "pipeline.json").exists():
        runs = load(pipe / "pipeline.json")
        done = sorted(r["paper_run"] for r in runs)
        rows.append(("#34", "qwen3-1.7b-grpo and -ppo run at paper shape on one GPU, no out-of-memory",
                     ", ".join(f"{r['paper_run']} ({r['steps']} steps)" for r in runs),
                     "yes" if done == ["qwen3-1.7b-grpo", "qwen3-1.7b-ppo"] else "no"))
    if pipe and (pipe / "pipeline-plan.json").exists():
        grpo = next((r for r in load(pipe / "pipeline-plan.json") if r["run"] == "qwen3-1.7b-grpo"), None)
        if grpo:
            rows.append(("#34", "the plan for qwen3-1.7b-grpo ≤ 48 GPU-hours on one H100",
                         f"{grpo['gpu_hours_at_limit']:.0f} at the limit, {grpo['gpu_hours_at_half']:.0f} at half",
                         "yes" if grpo["gpu_hours_at_half"] <= 48 else "no"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a generated file differs from the raw results")
    args = ap.parse_args()
    if not args.results.is_dir():
        print(f"error: {args.results} is not a directory of GPU suite results", file=sys.stderr)
        return 2
    files = {"gpu-results.md": report(args.results), "gpu-targets.md": targets(args.results) + "\n",
             "gpu-step-parts.md": step_accounting(args.results)}
    if args.check:
        stale = [name for name, text in files.items()
                 if not (args.results / name).is_file() or (args.results / name).read_text() != text]
        if stale:
            print(f"error: {args.results}: {', '.join(stale)} out of date with the raw results "
                  "(rerun without --check)", file=sys.stderr)
            return 1
        return 0
    for name, text in files.items():
        (args.results / name).write_text(text)
    print(files["gpu-targets.md"], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
