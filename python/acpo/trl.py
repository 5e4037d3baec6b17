"""acpo's verifier as TRL's accuracy reward (`trl.rewards.accuracy_reward`'s signature).

    from acpo.trl import accuracy_reward
    trainer = GRPOTrainer(model=..., reward_funcs=accuracy_reward, train_dataset=dataset)

    # a dataset whose gold answers are in another column, e.g. `answer`:
    from acpo.trl import make_accuracy_reward
    trainer = GRPOTrainer(..., reward_funcs=make_accuracy_reward("answer"))

TRL's GRPO and RLOO trainers call a reward function with keyword arguments: `completions`, and
every column of the dataset (`solution`, `answer`, ...), plus `log_extra` (TRL >= 1.x), which
adds columns to TRL's completions table. `completions` are a list of message lists
(conversational datasets: the content of the last message is judged) or of strings (standard
datasets); the gold answers come from the reward's column (`solution` unless made for another;
positionally, as the second argument, they are accepted too). Returns 1.0 / 0.0 per completion,
or None where the gold answer does not parse (TRL then leaves the example out, as its own
accuracy_reward does). Where TRL passes `log_extra`, the gold answers and the extracted answers
(`answer_parsed`, as TRL's own accuracy_reward names it) are logged to the completions table.

Judged on every core, the GIL released, in bounded work, so it is safe in TRL's async reward path
and in any thread. Anything that is not text raises TypeError naming `completions[i]` or the
column; a dataset without the column is a TypeError naming the columns it has.
"""
from collections.abc import Mapping

from . import _native
from ._batch import as_list

# What TRL passes besides the dataset's columns (not gold answers).
_NOT_COLUMNS = {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


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


def make_accuracy_reward(column="solution"):
    """TRL's accuracy reward with the gold answers taken from the dataset column `column`."""
    if not isinstance(column, str) or not column:
        raise TypeError(f"acpo.trl: column must be a column name (a non-empty str), not {column!r}")

    def accuracy_reward(completions, *golds, log_extra=None, **kwargs):
        """1.0 where the completion states the gold answer, 0.0 where not, None where the gold
        answer does not parse."""
        if len(golds) > 1:
            raise TypeError(f"acpo.trl: accuracy_reward takes completions and one list of gold answers, "
                            f"not {1 + len(golds)} positional arguments")
        if golds:
            gold = golds[0]
        elif column in kwargs:
            gold = kwargs[column]
        else:
            columns = sorted(k for k in kwargs if k not in _NOT_COLUMNS)
            raise TypeError(
                f"acpo.trl: no {column!r} column among the dataset's columns "
                f"({', '.join(columns) or 'none'}): use acpo.trl.make_accuracy_reward('<column>') "
                f"with the column of the gold answers"
            )
        texts = [_completion_text(c, i) for i, c in enumerate(as_list(completions, "completions", "acpo.trl"))]
        gold = as_list(gold, column, "acpo.trl")
        verdicts = _native.judge_all(gold, texts, gold_name=column, answer_name="completions")
        if log_extra is not None:
            log_extra(column, [str(g) for g in gold])
            log_extra("answer_parsed", [
                "[skipped]" if v[4] else (v[1] if v[1] is not None else "[unparseable]") for v in verdicts
            ])
        return [None if v[4] else float(v[0]) for v in verdicts]

    if column != "solution":
        accuracy_reward.__name__ = accuracy_reward.__qualname__ = f"accuracy_reward_{column}"
    return accuracy_reward


#: The reward for datasets whose gold answers are in the `solution` column (TRL's convention).
accuracy_reward = make_accuracy_reward("solution")
