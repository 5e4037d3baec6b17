#!/usr/bin/env python3
"""Math-Verify on the pairs `acpo bench verifier` timed: throughput and agreement with acpo.

  cargo run --release -- bench verifier --out results/bench
  python3 tools/twins/bench_math_verify.py results/bench/verifier_pairs.jsonl

Needs `pip install math-verify`. Math-Verify's default configuration (gold parsed with
LatexExtractionConfig + ExprExtractionConfig, prediction likewise), one call per pair, timed
over the whole list; its per-call timeout machinery is disabled (parsing_timeout=None,
timeout_seconds=None) so that the timing measures the verifier, not signal handling.
"""
import json
import sys
import time

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

configs = [LatexExtractionConfig(), ExprExtractionConfig()]
pairs = [json.loads(l) for l in open(sys.argv[1])]


def judge(gold, response):
    try:
        g = parse(gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$", extraction_config=configs,
                  parsing_timeout=None)
        p = parse(response, extraction_config=configs, parsing_timeout=None)
        return bool(verify(g, p, timeout_seconds=None))
    except Exception:
        return False


t = time.perf_counter()
mv = [judge(p["gold"], p["response"]) for p in pairs]
secs = time.perf_counter() - t
agree = sum(m == p["acpo"] for m, p in zip(mv, pairs))
as_built = sum(m == p["constructed"] for m, p in zip(mv, pairs))
print(f"Math-Verify: {len(pairs)} pairs in {secs:.2f} s = {len(pairs) / secs:.0f} answers/s")
print(f"Math-Verify judged {as_built}/{len(pairs)} as constructed; agreement with acpo {agree}/{len(pairs)} "
      f"({100 * agree / len(pairs):.2f} %)")
for m, p in list(zip(mv, pairs)):
    if m != p["acpo"]:
        print("  differ:", json.dumps({"gold": p["gold"], "response": p["response"][-80:], "math_verify": m, "acpo": p["acpo"]}))
