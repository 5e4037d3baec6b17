"""acpo's verifier as OpenRLHF's custom reward function.

OpenRLHF loads `reward_func` from a file, so the file is two lines:

    # reward_func.py
    from acpo.openrlhf import reward_func  # noqa: F401

and the launch passes the file and the dataset's gold column: `--reward.remote_url
reward_func.py --data.label_key answer` (OpenRLHF >= 0.10.4; earlier releases spell them
`--remote_rm_url` and `--label_key`). OpenRLHF calls `reward_func(queries, prompts, labels,
**kwargs)`: `queries` are prompt + response decoded together (with `skip_special_tokens=False`,
so a response ends in the tokenizer's end token, `<|im_end|>`, `<|endoftext|>`, `</s>`, ...),
`prompts` the prompts, `labels` the gold answers.

The response is the query after its prompt: found verbatim, or else ignoring whitespace (a
decoding that adds a leading space, or a BOS such as `<s>` before the prompt or drops the
prompt's own, still finds it). A
query that does not contain its prompt even so is a ValueError naming it: judging the whole
query would judge the prompt's own examples. The response is then cut at its first end token
(`END_TOKENS`: what follows was never generated) and trailing special tokens (`<|...|>`, `</s>`,
`<pad>`) are stripped before the answer is extracted.

Returns OpenRLHF's dict: `rewards` and `scores` (1.0 / 0.0 per query, torch tensors where torch
is installed, as OpenRLHF expects; lists otherwise) and `extra_logs` (the batch's accuracy).
Judged on every core, the GIL released, in bounded work. Anything that is not text raises
TypeError naming `queries[i]`, `prompts[i]` or `labels[i]`; a str where a list is expected is
refused, not judged character by character.
"""
import re

from . import _native
from ._batch import as_list

#: End-of-sequence tokens of common chat models: a response ends at the first one.
END_TOKENS = (
    "<|im_end|>",  # Qwen, ChatML
    "<|endoftext|>",  # Qwen, GPT-2
    "<|eot_id|>",  # Llama 3
    "<|end_of_text|>",  # Llama 3
    "<|end|>",  # Phi-3
    "<|return|>",  # gpt-oss
    "</s>",  # Llama 2, Mistral
    "<eos>",  # Gemma
    "<end_of_turn>",  # Gemma
    "<｜end▁of▁sentence｜>",  # DeepSeek
)

# Special tokens that may trail a response (padding, or an end token written twice).
_TRAILING_SPECIAL = re.compile(r"(?:\s*(?:<\|[^<>|\s]{1,64}\|>|</s>|<pad>|<eos>|<unk>|<end_of_turn>|<｜[^<>｜]{1,64}｜>))+\s*\Z")


def _text(x, what, i):
    if not isinstance(x, str):
        raise TypeError(f"acpo.openrlhf: {what}[{i}] must be str, not {type(x).__name__}")
    return x


# Special tokens that may lead a prompt (a BOS the decoded query may not repeat).
_LEADING_SPECIAL = re.compile(r"\A(?:\s*(?:<s>|<bos>|<\|[^<>|\s]{1,64}\|>|<｜[^<>｜]{1,64}｜>))+")


def _after_prompt(query, prompt):
    """The text of `query` after `prompt`, or None where the query does not contain it."""
    found = _after(query, prompt)
    if found is None and _LEADING_SPECIAL.match(prompt):
        found = _after(query, _LEADING_SPECIAL.sub("", prompt))
    return found


def _after(query, prompt):
    if query.startswith(prompt):
        return query[len(prompt):]
    at = query.find(prompt)
    if at >= 0:
        return query[at + len(prompt):]
    # The same characters with whitespace ignored: a decoding may add or drop spaces (a leading
    # space, spaces around special tokens). `kept[j]` is where the j-th non-space char of the
    # query is.
    want = "".join(prompt.split())
    if not want:
        return query
    kept = [j for j, c in enumerate(query) if not c.isspace()]
    squeezed = "".join(query[j] for j in kept)
    at = squeezed.find(want)
    if at < 0:
        return None
    return query[kept[at + len(want) - 1] + 1:]


def response_of(query, prompt):
    """The response in `query` (prompt + response, as OpenRLHF decodes it): after the prompt,
    up to its first end token, trailing special tokens stripped; None where the query does not
    contain the prompt."""
    response = _after_prompt(query, prompt)
    if response is None:
        return None
    ends = [at for at in (response.find(t) for t in END_TOKENS) if at >= 0]
    if ends:
        response = response[: min(ends)]
    return _TRAILING_SPECIAL.sub("", response)


def reward_func(queries, prompts, labels, **kwargs):
    """OpenRLHF's reward function: 1.0 where the response states its label, else 0.0."""
    where = "acpo.openrlhf"
    queries, prompts = as_list(queries, "queries", where), as_list(prompts, "prompts", where)
    labels = as_list(labels, "labels", where)
    if len(queries) != len(prompts):
        raise ValueError(f"acpo.openrlhf: {len(queries)} queries but {len(prompts)} prompts")
    responses = []
    for i, (q, p) in enumerate(zip(queries, prompts)):
        response = response_of(_text(q, "queries", i), _text(p, "prompts", i))
        if response is None:
            raise ValueError(
                f"acpo.openrlhf: queries[{i}] does not contain prompts[{i}], even with whitespace "
                f"ignored, so its response cannot be told from its prompt (whose examples would "
                f"be judged): queries[{i}] begins {q[:80]!r}, prompts[{i}] begins {p[:80]!r}"
            )
        responses.append(response)
    scores = _native.score_batch(labels, responses, gold_name="labels", answer_name="queries")
    accuracy = sum(scores) / len(scores) if scores else 0.0
    try:
        import torch
    except ImportError:
        rewards = list(scores)
    else:
        rewards, scores = torch.tensor(scores, dtype=torch.float32), torch.tensor(scores, dtype=torch.float32)
    return {"rewards": rewards, "scores": scores, "extra_logs": {"acpo/accuracy": accuracy}}
