"""verl's custom reward function, judged by acpo's verifier (`acpo score`), so that verl's
training rewards and validation scores are what acpo's evaluator would give.

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`
per response; `kind` ("binary": 1/0, "signed": ±1) comes from the launch's
`reward.custom_reward_function.reward_kwargs.kind`. The returned dict's extra keys
(`data_source`, `problem_id`, `acc`) end up in verl's validation dumps, where
`acpo import verl` finds them.

The acpo binary: `$ACPO_BIN`, else `acpo` on PATH.
"""
import json
import os
import shutil
import subprocess


def acpo_binary():
    path = os.environ.get("ACPO_BIN") or shutil.which("acpo")
    if not path:
        raise RuntimeError("acpo_verl: set ACPO_BIN to the acpo binary (or put acpo on PATH)")
    return path


def judge(responses, answers):
    """Whether each response's final answer equals its gold answer, by `acpo score`."""
    lines = "".join(
        json.dumps({"response": r, "answer": str(a)}) + "\n" for r, a in zip(responses, answers)
    )
    done = subprocess.run(
        [acpo_binary(), "score", "--input", "/dev/stdin"],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"acpo score failed: {done.stderr.strip()}")
    return [json.loads(l)["correct"] for l in done.stdout.splitlines() if l.strip()]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, kind="binary", **_):
    correct = judge([solution_str], [ground_truth])[0]
    if kind not in ("binary", "signed"):
        raise ValueError(f"acpo_verl: reward kind {kind!r} is not binary or signed")
    score = 1.0 if correct else (0.0 if kind == "binary" else -1.0)
    extra_info = extra_info or {}
    return {
        "score": score,
        "acc": bool(correct),
        "data_source": data_source,
        "problem_id": str(extra_info.get("problem_id", extra_info.get("index", ""))),
    }
