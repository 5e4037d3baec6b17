"""acpo's verifier as TRL's accuracy reward (`trl.rewards.accuracy_reward`'s signature).

    from acpo.trl import accuracy_reward
    trainer = GRPOTrainer(model=..., reward_funcs=accuracy_reward, train_dataset=dataset)

`completions` are TRL's: a list of message lists (conversational datasets: the content of the
last message is judged) or of strings (standard datasets); `solution` the dataset's gold
answers. Returns 1.0 / 0.0 per completion, or None where the gold answer does not parse (TRL
then leaves the example out, as its own accuracy_reward does). Judged on every core, the GIL
released, in bounded work, so it is safe in TRL's async reward path and in any thread.
Anything that is not text raises TypeError naming `completions[i]` or `solution[i]`.
"""
from collections.abc import Mapping

from . import _native
from ._batch import as_list


def _completion_text(completion, i):
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        raise TypeError(
            f"acpo.trl: completions[{i}][-1]['content'] must be str, not {type(content).__name__}"
        )
    raise TypeError(
        f"acpo.trl: completions[{i}] must be str or a list of messages ending in one with a str "
        f"'content', not {type(completion).__name__}"
    )


def accuracy_reward(completions, solution, **kwargs):
    """1.0 where the completion states the solution, 0.0 where not, None where the solution does
    not parse."""
    texts = [_completion_text(c, i) for i, c in enumerate(as_list(completions, "completions", "acpo.trl"))]
    solution = as_list(solution, "solution", "acpo.trl")
    verdicts = _native.judge_batch(solution, texts, gold_name="solution", answer_name="completions")
    return [None if v is None else float(v) for v in verdicts]
