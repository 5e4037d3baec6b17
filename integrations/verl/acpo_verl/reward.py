"""verl's reward, judged by acpo's verifier (`acpo score`), so that verl's training rewards and
validation scores are what acpo's evaluator would give. A batch of responses is one `acpo score`
process (issue #37), never one process per response.

Three entry points, one judge:

- `AcpoBatchRewardManager`: verl 0.9.1's reward loop calls a reward manager's `run_single` once
  per response, all of a worker's chunk at once (`RewardLoopWorker.compute_score_batch`). This
  manager collects the calls that arrive together and judges them in one `acpo score` call.
  The launch `acpo export verl` writes selects it (`reward.reward_manager.source=importlib`,
  `reward.reward_manager.name=AcpoBatchRewardManager`, `module.path` this file) with
  `compute_score_batch` as the custom reward function.
- `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, kind=...)`: a
  batch in one call, the signature of verl's `BatchRewardManager` (`reward_manager.name=batch`
  in verl's older reward path) and what `AcpoBatchRewardManager` calls.
- `compute_score(data_source, solution_str, ground_truth, extra_info, kind=...)`: one response,
  for verl's per-response `naive` manager (one process per response: slow, kept for launches
  written before the batch manager).

`kind` ("binary": 1/0, "signed": ±1) comes from the launch's
`reward.custom_reward_function.reward_kwargs.kind`. Each result's extra keys (`data_source`,
`problem_id`, `acc`) end up in verl's validation dumps, where `acpo import verl` finds them. A
judge that fails raises an error naming the response; it never scores 0 in silence.

The acpo binary: `$ACPO_BIN`, else `acpo` on PATH.
"""
import asyncio
import json
import os
import re
import shutil
import subprocess

KINDS = ("binary", "signed")


def acpo_binary():
    path = os.environ.get("ACPO_BIN") or shutil.which("acpo")
    if not path:
        raise RuntimeError("acpo_verl: set ACPO_BIN to the acpo binary (or put acpo on PATH)")
    return path


def judge(responses, answers):
    """Whether each response's final answer equals its gold answer: one `acpo score` process
    for the whole batch."""
    if len(responses) != len(answers):
        raise ValueError(f"acpo_verl: {len(responses)} responses but {len(answers)} answers")
    if not responses:
        return []
    lines = "".join(
        json.dumps({"response": str(r), "answer": str(a)}) + "\n" for r, a in zip(responses, answers)
    )
    done = subprocess.run(
        [acpo_binary(), "score", "--input", "/dev/stdin"],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        err = done.stderr.strip()
        where = re.search(r"(?:/dev/stdin:|line )(\d+)", err)
        if where and 1 <= int(where.group(1)) <= len(responses):
            i = int(where.group(1)) - 1
            raise RuntimeError(
                f"acpo score failed on response {i} of the batch of {len(responses)} "
                f"({str(responses[i])[:80]!r}, answer {str(answers[i])[:40]!r}): {err}"
            )
        raise RuntimeError(f"acpo score failed on a batch of {len(responses)} responses: {err}")
    verdicts = [json.loads(l)["correct"] for l in done.stdout.splitlines() if l.strip()]
    if len(verdicts) != len(responses):
        raise RuntimeError(
            f"acpo score judged {len(verdicts)} of {len(responses)} responses: {done.stderr.strip()}"
        )
    return verdicts


def _result(correct, data_source, extra_info, kind):
    score = 1.0 if correct else (0.0 if kind == "binary" else -1.0)
    extra_info = extra_info or {}
    return {
        "score": score,
        "acc": bool(correct),
        "data_source": data_source,
        "problem_id": str(extra_info.get("problem_id", extra_info.get("index", ""))),
    }


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"acpo_verl: reward kind {kind!r} is not binary or signed")


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, kind="binary", **_):
    """A batch of responses judged in one `acpo score` call; one result dict per response."""
    _check_kind(kind)
    data_sources, solution_strs = list(data_sources), list(solution_strs)
    extra_infos = list(extra_infos) if extra_infos is not None else [{}] * len(solution_strs)
    if not (len(data_sources) == len(solution_strs) == len(ground_truths) == len(extra_infos)):
        raise ValueError(
            f"acpo_verl: {len(solution_strs)} responses with {len(data_sources)} data sources, "
            f"{len(ground_truths)} answers and {len(extra_infos)} extra infos"
        )
    verdicts = judge(solution_strs, ground_truths)
    return [_result(c, d, e, kind) for c, d, e in zip(verdicts, data_sources, extra_infos)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, kind="binary", **_):
    """One response (one `acpo score` process): verl's per-response managers."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], kind=kind)[0]


class Coalescer:
    """Collects the responses of calls that arrive in one turn of the event loop and judges
    them with one call of `batch_fn` (run in a thread, so the loop keeps going): verl's reward
    loop starts every response of a chunk as its own task before any runs, so a chunk is one
    judge. Each caller gets its own result, or the batch's error."""

    def __init__(self, batch_fn):
        self.batch_fn = batch_fn
        self.pending = []
        self.flush_scheduled = False

    async def submit(self, data_source, response, answer, extra_info):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((data_source, response, answer, extra_info, future))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            # after every task already scheduled in this turn has submitted
            loop.call_soon(lambda: asyncio.ensure_future(self._flush()))
        return await future

    async def _flush(self):
        batch, self.pending, self.flush_scheduled = self.pending, [], False
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                None,
                lambda: self.batch_fn(
                    data_sources=[b[0] for b in batch],
                    solution_strs=[b[1] for b in batch],
                    ground_truths=[b[2] for b in batch],
                    extra_infos=[b[3] for b in batch],
                ),
            )
        except Exception as e:  # every caller of the batch sees the judge's error
            for *_, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for result, (*_, future) in zip(results, batch):
            if not future.done():
                future.set_result(result)


try:  # verl's reward loop (0.9.1); without verl the module still serves the functions above
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
except ImportError:  # pragma: no cover - exercised where verl is installed
    RewardManagerBase = None

if RewardManagerBase is not None:

    class AcpoBatchRewardManager(RewardManagerBase):
        """verl 0.9.1's reward-loop manager judging each chunk of responses in one `acpo score`
        call. `compute_score` is the launch's custom reward function, `compute_score_batch`
        with the manifest's `kind` bound by verl."""

        def __init__(self, config, tokenizer, compute_score=None, **_):
            super().__init__(config, tokenizer, compute_score)
            self.coalescer = Coalescer(compute_score or compute_score_batch)

        async def run_single(self, data):
            item = data[-1:][0]  # as verl's naive manager: the last sequence of the item
            response_ids = item.batch["responses"]
            valid = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
            response = self.tokenizer.decode(response_ids[:valid], skip_special_tokens=True)
            extra_info = dict(item.non_tensor_batch.get("extra_info", {}) or {})
            result = await self.coalescer.submit(
                item.non_tensor_batch["data_source"],
                response,
                item.non_tensor_batch["reward_model"]["ground_truth"],
                extra_info,
            )
            return {"reward_score": result["score"], "reward_extra_info": dict(result)}
