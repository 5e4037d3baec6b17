"""acpo's math answer verifier for Python.

    import acpo
    acpo.verify("1/2", r"so x = \\boxed{\\frac{1}{2}}")          # True
    acpo.score_batch(["4", "4"], [r"\\boxed{4}", "Answer: 5"])  # [1.0, 0.0]

The judge is the one the acpo harness trains and evaluates with (crates/acpo-verify in the
repository): the answer is extracted from the response (boxed, `Answer:` line, final LaTeX,
last number), the gold's form decides the comparison, numbers compare exactly as rationals,
expressions at random points, sets unordered, tuples and intervals in order. Every judgement
ends in bounded work (counted operations, never a timer): no signal, no subprocess, any thread.
Both functions release the GIL; `score_batch` judges on every core, in chunks between which
Python's signal handlers run (Ctrl-C stops a long batch), on a thread pool that a forked child
rebuilds for itself (multiprocessing's fork start method is safe). A batch holds at most
MAX_BATCH items: an endless iterable is a ValueError, not an exhausted memory.

What crosses from Python is checked: a response must be `str`; a gold answer `str`, `int` or a
finite `float`. Anything else raises TypeError (None, bytes, a list, a bool) or ValueError
(NaN, infinity, text that is not valid Unicode) naming the argument and, in a batch, the index.

Reward functions with each framework's own signature:
- verl: `acpo.verl.compute_score`, `acpo.verl.compute_score_async` (and the ACPO policy loss,
  registered in verl by this package's `verl.plugins` entry point);
- TRL: `acpo.trl.accuracy_reward`;
- OpenRLHF: `acpo.openrlhf.reward_func`;
- code written against Math-Verify: `acpo.math_verify_compat.parse` / `.verify`.

Evaluation conventions: `maj_at_k` (and `majority_vote`) vote as `acpo eval` does.
"""
import os
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

from . import _native

# A forked child (multiprocessing's default start method on Linux) has none of its parent's
# threads: the native module then builds a thread pool of its own for the next batch. It also
# checks the process id on each batch; the hook covers a child whose pid a parent once had.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_native._after_fork_in_child)

__all__ = ["verify", "score_batch", "judge", "judge_batch", "majority_vote", "maj_at_k", "Verdict", "WORK_BUDGET",
           "MAX_BATCH"]

Gold = Union[str, int, float]

#: The most items one batch (`score_batch`, the frameworks' batch rewards) may hold; an iterable
#: with more (an endless one) is a ValueError, raised while it is read.
MAX_BATCH: int = _native.MAX_BATCH

#: Work units one judgement may spend (about one machine-word operation each); a judgement the
#: budget cuts short is an error verdict, never "correct".
WORK_BUDGET: int = _native.work_budget()


class Verdict(NamedTuple):
    """One judgement in full."""

    correct: bool
    #: The answer found in the response, if any.
    extracted: Optional[str]
    #: Where it was found: boxed, answer-line, final-answer, latex, number or whole.
    source: Optional[str]
    #: Why no comparison was possible (unparseable gold or answer, the work budget), if so.
    error: Optional[str]
    #: Whether that was because the gold itself does not parse (nothing to judge against).
    gold_unparsed: bool
    #: Work units the judgement spent (of WORK_BUDGET).
    work: int


def verify(gold: Gold, answer: str) -> bool:
    """Whether the response `answer` states the gold answer `gold`."""
    return _native.verify(gold, answer)


def judge(gold: Gold, answer: str) -> Verdict:
    """The verdict with what was extracted and why, if nothing could be compared."""
    return Verdict(*_native.judge(gold, answer))


def score_batch(golds: Sequence[Gold], answers: Sequence[str]) -> List[float]:
    """1.0 where `answers[i]` states `golds[i]`, else 0.0; judged on every core."""
    return _native.score_batch(golds, answers)


def judge_batch(golds: Sequence[Gold], answers: Sequence[str]) -> List[Verdict]:
    """The verdict of every pair in full (`judge`'s), judged on every core."""
    return [Verdict(*v) for v in _native.judge_all(golds, answers)]


def majority_vote(answers: Iterable[Optional[str]]) -> Optional[int]:
    """The index of the sample whose answer wins a majority vote, as `acpo eval`'s maj@k votes.

    `answers` are the samples' extracted answers in sample order (`Verdict.extracted`). Equal
    strings vote together (the verifier's equivalence is not transitive, so classes built from it
    would depend on the samples' order); None (no answer) does not vote; a tie goes to the answer
    seen first, which is what verl's `calc_maj_val` and lighteval's `MajAtK` pick. None when no
    sample has an answer. Unlike verl, which votes on `acpo.verl`'s `pred` and so counts an
    answerless sample as a vote for "" (python/README.md: where those outnumber the largest
    answer, verl's winner is "" and the problem is wrong).
    """
    votes: Dict[str, List[int]] = {}  # answer -> [count, first index]
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        if not isinstance(answer, str):
            raise TypeError(f"answers[{i}] must be str or None, not {type(answer).__name__}")
        votes.setdefault(answer, [0, i])[0] += 1
    if not votes:
        return None
    return max(votes.values(), key=lambda v: (v[0], -v[1]))[1]


def maj_at_k(gold: Gold, responses: Sequence[str]) -> float:
    """maj@k of one problem: 1.0 when the majority answer of its k `responses` states `gold`.

    Each response is judged (`judge_batch`); the winner of `majority_vote` over the extracted
    answers decides, by the verdict of its first sample; 0.0 when no response has an answer. The
    mean over problems is the benchmark's maj@k, exact over the k samples (verl reports a
    bootstrap estimate of it, `maj@k/mean`).
    """
    if isinstance(responses, str):
        raise TypeError("responses must be a sequence of str, not one str")
    responses = list(responses)
    if not responses:
        raise ValueError("responses is empty: maj@k needs k >= 1 samples")
    verdicts = judge_batch([gold] * len(responses), responses)
    winner = majority_vote(v.extracted for v in verdicts)
    return 1.0 if winner is not None and verdicts[winner].correct else 0.0
