"""Type stubs of the extension module (python/src/lib.rs); the package's tests hold the two to
the same functions and parameters."""
from typing import Iterable, List, Optional, Tuple, Union

_Gold = Union[str, int, float]
_Verdict = Tuple[bool, Optional[str], Optional[str], Optional[str], bool, int]

__all__ = [
    "verify",
    "judge",
    "score_batch",
    "judge_batch",
    "judge_all",
    "candidates",
    "work_budget",
    "_after_fork_in_child",
    "MAX_BATCH",
]

MAX_BATCH: int

def verify(gold: _Gold, answer: str, *, gold_name: str = "gold", answer_name: str = "answer") -> bool: ...
def judge(gold: _Gold, answer: str, *, gold_name: str = "gold", answer_name: str = "answer") -> _Verdict: ...
def score_batch(
    golds: Iterable[_Gold], answers: Iterable[str], *, gold_name: str = "golds", answer_name: str = "answers"
) -> List[float]: ...
def judge_batch(
    golds: Iterable[_Gold], answers: Iterable[str], *, gold_name: str = "golds", answer_name: str = "answers"
) -> List[Optional[bool]]: ...
def judge_all(
    golds: Iterable[_Gold], answers: Iterable[str], *, gold_name: str = "golds", answer_name: str = "answers"
) -> List[_Verdict]: ...
def candidates(text: _Gold, *, gold: bool = False) -> List[str]: ...
def work_budget() -> int: ...
def _after_fork_in_child() -> None: ...
