#!/usr/bin/env python3
"""acpo (the Python package) against Math-Verify 0.9.0, in one process, on the same pairs.

    target/release/acpo bench verifier --data-dir DATA --out results/bench   # writes the pairs
    pip install ./python math-verify==0.9.0
    python3 tools/twins/bench_math_verify.py results/bench/verifier_pairs.jsonl --out python/bench
    target/release/acpo doc python/README.md --from python/bench            # quotes the report

The pairs: every gold of the four benchmarks as a boxed answer, an `Answer:` line and a wrong
answer (`acpo bench verifier`, `src/perf/verifier.rs`); the hostile answers with the Rust crate's
verdicts (`python/tests/fixtures/verifier.json`: `perf::verifier::hostile_answers` and the
inputs of Math-Verify's hang reports #63 and #65).

Measured, in this process:
- agreement: acpo's verdict against Math-Verify's on every pair, every disagreement class
  with its count, an example and why (the classes are the pair's form and who says correct);
- single-threaded answers/s: `acpo.verify` and Math-Verify's parse + verify, one pair at a
  time, the same pairs;
- a batch of 4,096 answers through `acpo.score_batch` (on every core), best of 5;
- worst-case latency: each hostile answer judged alone by `acpo.verify`, best of 3 per answer,
  the slowest (wall and the thread's CPU time). Math-Verify is run on the hang reports' inputs
  only, each in a child process killed after --mv-limit seconds (its own timeout is
  `signal.alarm`, which #65 outlives).

Math-Verify's configuration is its default (gold and answer parsed with LatexExtractionConfig
and ExprExtractionConfig; a gold without `$` or `\\boxed` wrapped in `$...$`), its timeouts off
(`parsing_timeout=None`, `timeout_seconds=None`) so that what is timed is the verifier, not
signal handling; a pair whose parse or verify raises counts as "not equal", as Math-Verify's own
wrappers treat it.
"""
import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import acpo

FIXTURE = Path(__file__).resolve().parents[2] / "python" / "tests" / "fixtures" / "verifier.json"


def mv_judge(gold, response):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    try:
        g = parse(gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$", extraction_config=configs,
                  parsing_timeout=None)
        p = parse(response, extraction_config=configs, parsing_timeout=None)
        return bool(verify(g, p, timeout_seconds=None)), bool(p)
    except Exception:
        return False, False


def form_of(response, constructed):
    if not constructed:
        return "wrong answer (gold + 1, boxed)"
    return "boxed" if "\\boxed" in response else "`Answer:` line"


# Why each class of disagreement happens, from reading every pair of the class (the report
# lists an example of each; an unexplained class is printed as such, never guessed).
WHY = {
    ("`Answer:` line", True, False, False):
        "Math-Verify's extraction miss: it finds no answer in raw LaTeX after `Answer:` (`\\pi`, "
        "`\\text{Evelyn}`, `\\sqrt{51}`, `p - q`); acpo reads DAPO's `Answer:` line whole.",
    ("`Answer:` line", True, False, True):
        "Math-Verify's extraction miss: after `Answer:` it takes only a leading fragment of raw "
        "LaTeX (`3` of `3\\sqrt{13}`, `6` of `6 - 5i`, `1` of `1,-2`), which then differs from the gold.",
    ("`Answer:` line", False, True, True):
        "a gold that is a sentence of prose (olympiadbench/1965): acpo does not take a whole "
        "sentence after `Answer:` as one answer; Math-Verify compares the last formula of both.",
    ("boxed", True, False, True):
        "Math-Verify parses no gold: wrapped in `$...$` for it, a gold holding an escaped dollar "
        "(`\\$36`) or a stray `$ $` (minerva_math/72) ends its delimiter scan early.",
    ("wrong answer (gold + 1, boxed)", False, True, True):
        "Math-Verify accepts `gold+1`: its parse drops the `+1` (a tuple read as the set "
        "{-1/2, 7/2}), folds case (`N=n` read as n = n, which it then matches with n = n + 1), or "
        "falls back to one number found in the expression (`2`) on both sides.",
}


def agreement(pairs, mv, acpo_verdicts):
    classes = defaultdict(list)
    for p, (m, m_found), a in zip(pairs, mv, acpo_verdicts):
        if m != a:
            key = (form_of(p["response"], p["constructed"]), a, m, m_found)
            classes[key].append(p)
    agree = len(pairs) - sum(len(v) for v in classes.values())
    return agree, classes


def per_second(fn, items, repeats):
    """Answers per second of wall time and of the thread's CPU time (the second does not count
    the time other processes take the core: this machine is shared), best of `repeats`."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t, u = time.perf_counter(), time.thread_time()
        for g, r in items:
            fn(g, r)
        best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.thread_time() - u)
    return len(items) / best, len(items) / best_cpu


def worst_latency(cases, repeats=3):
    worst = (0.0, 0.0, None)
    for c in cases:
        wall, cpu = float("inf"), float("inf")
        for _ in range(repeats):
            t, u = time.perf_counter(), time.thread_time()
            acpo.verify(c["gold"], c["response"])
            wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.thread_time() - u)
        if wall > worst[0]:
            worst = (wall, cpu, c["name"])
    return worst


def _mv_child(gold, response, out):
    out.put(mv_judge(gold, response)[0])


def mv_on_hang_reports(cases, limit):
    rows = []
    for c in cases:
        if not c["name"].startswith("math-verify#"):
            continue
        out = multiprocessing.Queue()
        child = multiprocessing.Process(target=_mv_child, args=(c["gold"], c["response"], out))
        t = time.perf_counter()
        child.start()
        child.join(limit)
        took = time.perf_counter() - t
        if child.is_alive():
            child.kill()
            child.join()
            rows.append((c["name"], f"no verdict after {limit:.0f} s (killed)"))
        else:
            verdict = out.get() if not out.empty() else "crashed"
            rows.append((c["name"], f"{verdict} in {took:.2f} s"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", help="verifier_pairs.jsonl written by `acpo bench verifier`")
    ap.add_argument("--out", default="python/bench", help="where math_verify.{json,md} go")
    ap.add_argument("--repeats", type=int, default=3, help="best of N for the single-threaded rates")
    ap.add_argument("--mv-limit", type=float, default=20.0, help="seconds Math-Verify gets per hang report")
    args = ap.parse_args()

    import math_verify

    pairs = [json.loads(line) for line in open(args.pairs)]
    cases = json.loads(FIXTURE.read_text())["cases"]
    items = [(p["gold"], p["response"]) for p in pairs]

    acpo_verdicts = [acpo.verify(g, r) for g, r in items]
    binary_differs = sum(a != p["acpo"] for a, p in zip(acpo_verdicts, pairs))
    mv = [mv_judge(g, r) for g, r in items]
    agree, classes = agreement(pairs, mv, acpo_verdicts)
    by_form = Counter(form_of(p["response"], p["constructed"]) for p in pairs)
    differ_by_form = Counter()
    for k, v in classes.items():
        differ_by_form[k[0]] += len(v)
    as_built_acpo = sum(a == p["constructed"] for a, p in zip(acpo_verdicts, pairs))
    as_built_mv = sum(m == p["constructed"] for (m, _), p in zip(mv, pairs))

    acpo_rate, acpo_cpu_rate = per_second(acpo.verify, items, args.repeats)
    mv_rate, mv_cpu_rate = per_second(mv_judge, items, 1)
    batch = (items * (4096 // len(items) + 1))[:4096]
    golds, answers = [g for g, _ in batch], [r for _, r in batch]
    batch_s, batch_cpu_s = float("inf"), float("inf")
    for _ in range(5):
        t, u = time.perf_counter(), time.process_time()
        acpo.score_batch(golds, answers)
        batch_s, batch_cpu_s = min(batch_s, time.perf_counter() - t), min(batch_cpu_s, time.process_time() - u)
    load = os.getloadavg()[0]
    wall, cpu, slowest = worst_latency(cases)
    hostile_all = _timed(lambda: acpo.score_batch([c["gold"] for c in cases], [c["response"] for c in cases]))
    hostile_ok = [float(c["correct"]) for c in cases] == acpo.score_batch(
        [c["gold"] for c in cases], [c["response"] for c in cases])
    hangs = mv_on_hang_reports(cases, args.mv_limit)

    report = {
        "command": "python3 tools/twins/bench_math_verify.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "math_verify": math_verify.__version__ if hasattr(math_verify, "__version__") else "0.9.0",
        "pairs": len(pairs), "agree": agree, "agreement": agree / len(pairs),
        "agreement_by_form": {f: {"pairs": n, "agree": n - differ_by_form[f]} for f, n in sorted(by_form.items())},
        "as_constructed_acpo": as_built_acpo, "as_constructed_math_verify": as_built_mv,
        "acpo_differs_from_the_binary": binary_differs,
        "classes": [{"form": k[0], "acpo": k[1], "math_verify": k[2], "math_verify_found_an_answer": k[3],
                     "count": len(v), "example": {"gold": v[0]["gold"], "response": v[0]["response"][-120:]},
                     "why": WHY.get(k, "UNEXPLAINED")} for k, v in sorted(classes.items(), key=lambda kv: -len(kv[1]))],
        "acpo_answers_per_s_single_thread": acpo_rate, "math_verify_answers_per_s_single_thread": mv_rate,
        "speedup_single_thread": acpo_rate / mv_rate,
        "acpo_answers_per_cpu_s": acpo_cpu_rate, "math_verify_answers_per_cpu_s": mv_cpu_rate,
        "speedup_cpu": acpo_cpu_rate / mv_cpu_rate,
        "batch_4096_s": batch_s, "batch_4096_cpu_s": batch_cpu_s, "batch_threads": os.cpu_count(),
        "load_average_1min": load,
        "hostile_answers": len(cases), "hostile_all_s": hostile_all, "hostile_verdicts_as_the_crate": hostile_ok,
        "worst_latency_s": wall, "worst_latency_cpu_s": cpu, "worst_latency_case": slowest,
        "math_verify_on_hang_reports": hangs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "math_verify.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "math_verify.md").write_text(markdown(report))
    print(markdown(report))
    if any(c["why"] == "UNEXPLAINED" for c in report["classes"]):
        sys.exit("a disagreement class has no explanation: read its pairs and add it to WHY")


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _cell(text):
    return text.replace("|", "\\|").replace("\n", "⏎")


def markdown(r):
    lines = [
        f"`{r['command']}` ({r['machine']}, load average {r['load_average_1min']:.1f} while it ran; "
        f"math-verify {r['math_verify']}). Rates are best of runs; CPU time (the thread's, or the "
        "process's for the batch) does not count what other processes took from the cores.",
        "",
        "| measure | acpo | Math-Verify |",
        "|---|---:|---:|",
        f"| agreement with each other on {r['pairs']:,} pairs | {100 * r['agreement']:.2f} % ({r['agree']:,}) | |",
        *[f"| &nbsp;&nbsp;of which {f} ({a['pairs']:,} pairs) | {100 * a['agree'] / a['pairs']:.2f} % | |"
          for f, a in r["agreement_by_form"].items()],
        f"| judged as constructed | {r['as_constructed_acpo']:,} | {r['as_constructed_math_verify']:,} |",
        f"| answers/s, one thread | {r['acpo_answers_per_s_single_thread']:,.0f} | "
        f"{r['math_verify_answers_per_s_single_thread']:,.0f} |",
        f"| speed-up, one thread | **{r['speedup_single_thread']:,.0f}×** | |",
        f"| answers per CPU-second, one thread | {r['acpo_answers_per_cpu_s']:,.0f} | "
        f"{r['math_verify_answers_per_cpu_s']:,.0f} (**{r['speedup_cpu']:,.0f}×**) |",
        f"| a batch of 4,096 answers (`score_batch`, {r['batch_threads']} cores) | {r['batch_4096_s']:.3f} s "
        f"({r['batch_4096_cpu_s']:.3f} s CPU in all) | |",
        f"| slowest of {r['hostile_answers']} hostile answers, alone | {1e3 * r['worst_latency_s']:.1f} ms "
        f"({1e3 * r['worst_latency_cpu_s']:.1f} ms CPU; `{r['worst_latency_case']}`) | |",
        f"| all {r['hostile_answers']} hostile answers, one batch | {r['hostile_all_s']:.3f} s, "
        f"verdicts {'as' if r['hostile_verdicts_as_the_crate'] else 'NOT as'} the Rust crate's | |",
        "",
        "Math-Verify on the inputs of its hang reports (a child process each): "
        + "; ".join(f"{name}: {what}" for name, what in r["math_verify_on_hang_reports"]) + ".",
        "",
        f"Every disagreement class (pair form, acpo's verdict, Math-Verify's; {r['pairs'] - r['agree']} pairs):",
        "",
        "| form | acpo | Math-Verify | MV found an answer | pairs | example (gold; end of the response) | why |",
        "|---|---|---|---|---:|---|---|",
    ]
    for c in r["classes"]:
        lines.append(
            f"| {c['form']} | {c['acpo']} | {c['math_verify']} | {c['math_verify_found_an_answer']} | {c['count']} "
            f"| `{_cell(c['example']['gold'])}`; `{_cell(c['example']['response'][-60:])}` | {c['why']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
