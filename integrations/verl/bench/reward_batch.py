#!/usr/bin/env python3
"""Judging N responses through the plug-in's reward (issue #37): verl's per-response path
(`compute_score`, one `acpo score` process per response) against the batch path
(`AcpoBatchRewardManager`'s `Coalescer` over `compute_score_batch`: one process per chunk), on
the CPU, same responses, same verdicts. Needs only the acpo binary ($ACPO_BIN).

    ACPO_BIN=target/release/acpo python3 integrations/verl/bench/reward_batch.py 4096

Responses are ~1,500 characters of reasoning ending in a boxed answer, half of them right.
"""
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from acpo_verl import reward  # noqa: E402


def responses(n):
    filler = "We expand the expression and collect like terms, checking each step. " * 21
    out = []
    for i in range(n):
        answer = f"\\frac{{{i % 97 + 1}}}{{{i % 13 + 2}}}"
        said = answer if i % 2 == 0 else f"{i % 89}"
        out.append((f"{filler}\nSo the answer is $\\boxed{{{said}}}$.", answer))
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    items = responses(n)
    t = time.perf_counter()
    one_by_one = [reward.compute_score("math500", r, a, {"index": i})["acc"] for i, (r, a) in enumerate(items)]
    per_response = time.perf_counter() - t

    async def chunk():
        c = reward.Coalescer(lambda **kw: reward.compute_score_batch(**kw, kind="binary"))
        tasks = [asyncio.ensure_future(c.submit("math500", r, a, {"index": i})) for i, (r, a) in enumerate(items)]
        return await asyncio.gather(*tasks)

    t = time.perf_counter()
    batched = [g["acc"] for g in asyncio.run(chunk())]
    batch = time.perf_counter() - t
    assert batched == one_by_one, "the two paths disagree"
    print(json.dumps({
        "responses": n,
        "correct": sum(batched),
        "per_response_process_s": round(per_response, 3),
        "batch_s": round(batch, 3),
        "speedup": round(per_response / batch, 1),
    }))


if __name__ == "__main__":
    main()
