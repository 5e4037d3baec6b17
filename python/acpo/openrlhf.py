"""acpo's verifier as OpenRLHF's custom reward function (`--remote_rm_url reward_func.py`).

OpenRLHF loads `reward_func` from a file, so the file is two lines:

    # reward_func.py
    from acpo.openrlhf import reward_func  # noqa: F401

and the launch passes `--remote_rm_url reward_func.py --label_key answer`. OpenRLHF calls
`reward_func(queries, prompts, labels, **kwargs)`: `queries` are prompt + response, `prompts`
the prompts, `labels` the gold answers. The response is the query less its prompt (where the
query starts with it; else the whole query, whose last answer is the response's). Returns
OpenRLHF's dict: `rewards` and `scores` (1.0 / 0.0 per query, torch tensors where torch is
installed, as OpenRLHF expects; lists otherwise) and `extra_logs` (the batch's accuracy).
Judged on every core, the GIL released, in bounded work. Anything that is not text raises
TypeError naming `queries[i]`, `prompts[i]` or `labels[i]`.
"""
from . import _native
from ._batch import as_list


def _response(query, prompt, i):
    if not isinstance(query, str):
        raise TypeError(f"acpo.openrlhf: queries[{i}] must be str, not {type(query).__name__}")
    if not isinstance(prompt, str):
        raise TypeError(f"acpo.openrlhf: prompts[{i}] must be str, not {type(prompt).__name__}")
    return query[len(prompt):] if query.startswith(prompt) else query


def reward_func(queries, prompts, labels, **kwargs):
    """OpenRLHF's reward function: 1.0 where the response states its label, else 0.0."""
    queries, prompts = as_list(queries, "queries", "acpo.openrlhf"), as_list(prompts, "prompts", "acpo.openrlhf")
    labels = as_list(labels, "labels", "acpo.openrlhf")
    if len(queries) != len(prompts):
        raise ValueError(f"acpo.openrlhf: {len(queries)} queries but {len(prompts)} prompts")
    responses = [_response(q, p, i) for i, (q, p) in enumerate(zip(queries, prompts))]
    scores = _native.score_batch(labels, responses, gold_name="labels", answer_name="queries")
    accuracy = sum(scores) / len(scores) if scores else 0.0
    try:
        import torch
    except ImportError:
        rewards = list(scores)
    else:
        rewards, scores = torch.tensor(scores, dtype=torch.float32), torch.tensor(scores, dtype=torch.float32)
    return {"rewards": rewards, "scores": scores, "extra_logs": {"acpo/accuracy": accuracy}}
