"""The package under a process's real life: a child forked after the parent judged a batch
(multiprocessing's default start method on Linux), Ctrl-C during a long batch, and an endless
iterable where a batch is expected.
"""
import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import unittest
from pathlib import Path

import acpo
from acpo import openrlhf, trl
from acpo import verl as acpo_verl

CASES = json.loads((Path(__file__).resolve().parent / "fixtures" / "verifier.json").read_text())["cases"]


def every_batch_entry_point():
    """The batch of each entry point that judges on the thread pool, as plain floats."""
    golds, answers = ["1", "2", "3"], [r"\boxed{1}", r"\boxed{5}", "Answer: 3"]
    return {
        "score_batch": acpo.score_batch(golds, answers),
        "trl": trl.accuracy_reward(answers, golds),
        "verl_batch": [r["score"] for r in acpo_verl.compute_score_batch(["m"] * 3, answers, golds)],
        "openrlhf": [float(x) for x in openrlhf.reward_func(["Q " + a for a in answers], ["Q "] * 3, golds)["scores"]],
    }


def _child(conn):
    conn.send(every_batch_entry_point())
    conn.close()


WANT = [1.0, 0.0, 1.0]


@unittest.skipUnless(hasattr(os, "fork"), "no fork on this platform")
class Fork(unittest.TestCase):
    def run_child(self, ctx):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child_end,))
        p.start()
        child_end.close()
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()
            self.fail("the forked child hung in a batch (its parent's thread pool has no threads in it)")
        self.assertEqual(p.exitcode, 0)
        got = parent_end.recv()
        self.assertEqual(got, {k: WANT for k in got})

    def test_a_child_forked_after_a_batch_judges_its_own_batches(self):
        # the parent's pool is started by a batch of two or more before the fork
        self.assertEqual(set(map(tuple, every_batch_entry_point().values())), {tuple(WANT)})
        self.run_child(multiprocessing.get_context("fork"))
        # and the parent's pool still works after the fork
        self.assertEqual(acpo.score_batch(["1", "2"], ["1", "3"]), [1.0, 0.0])

    def test_a_grandchild_forked_from_a_child_judges_too(self):
        acpo.score_batch(["1", "2"], ["1", "2"])
        ctx = multiprocessing.get_context("fork")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: judges a batch, then forks a grandchild that judges again
            code = 1
            try:
                acpo.score_batch(["1", "2"], ["1", "2"])
                parent_end, child_end = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(child_end,))
                p.start()
                p.join(60)
                if not p.is_alive() and p.exitcode == 0 and parent_end.recv()["score_batch"] == WANT:
                    code = 0
                elif p.is_alive():
                    p.kill()
            finally:
                os.write(w, bytes([code]))
                os._exit(code)
        os.close(w)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.fail("the child or its forked grandchild hung in a batch")
        self.assertEqual(os.read(r, 1), b"\x00")
        os.close(r)


@unittest.skipUnless(hasattr(signal, "SIGINT") and sys.platform != "win32", "POSIX signals only")
class CtrlC(unittest.TestCase):
    def test_a_long_batch_ends_soon_after_sigint(self):
        def cost(c):
            t = time.monotonic()
            acpo.verify(c["gold"], c["response"])
            return time.monotonic() - t

        slow = max(CASES, key=cost)
        # the batch's length from a measured rate: about 40 s of work, which the interrupt
        # must cut to a few seconds
        probe = 64
        t = time.monotonic()
        acpo.score_batch([slow["gold"]] * probe, [slow["response"]] * probe)
        per_item = max((time.monotonic() - t) / probe, 1e-5)
        n = min(int(40 / per_item), 2_000_000)
        golds, answers = [slow["gold"]] * n, [slow["response"]] * n
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                acpo.score_batch(golds, answers)
        finally:
            timer.cancel()
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 8.0, f"a batch of about 40 s ({n} answers) went on {elapsed:.1f} s after Ctrl-C")


class EndlessIterables(unittest.TestCase):
    def test_an_endless_iterable_is_refused_not_collected(self):
        with self.assertRaisesRegex(ValueError, "golds has more items than the 1 answers"):
            acpo.score_batch(itertools.repeat("1"), ["1"])
        with self.assertRaisesRegex(ValueError, "answers has more items than the 2 golds"):
            acpo.score_batch(["1", "2"], itertools.repeat("1"))
        with self.assertRaisesRegex(ValueError, r"more than 16777216 items.*endless iterable"):
            acpo.score_batch(itertools.repeat("1"), itertools.repeat("1"))
        self.assertEqual(acpo.MAX_BATCH, 1 << 24)

    def test_the_frameworks_batches_refuse_endless_iterables_and_bare_strings(self):
        with self.assertRaisesRegex(ValueError, "acpo.trl: completions has more than"):
            trl.accuracy_reward(itertools.repeat(r"\boxed{1}"), ["1"])
        with self.assertRaisesRegex(ValueError, "acpo.openrlhf: queries has more than"):
            openrlhf.reward_func(itertools.repeat("q 1"), ["q"], ["1"])
        with self.assertRaisesRegex(ValueError, "acpo.verl: solution_strs has more than"):
            acpo_verl.compute_score_batch(["m"], itertools.repeat("1"), ["1"])
        # a str where a list is expected would be judged character by character
        with self.assertRaisesRegex(TypeError, "acpo.trl: completions must be a sequence"):
            trl.accuracy_reward(r"\boxed{1}", ["1"] * 9)
        with self.assertRaisesRegex(TypeError, "acpo.trl: solution must be a sequence"):
            trl.accuracy_reward(["1", "2"], "12")
        with self.assertRaisesRegex(TypeError, "acpo.openrlhf: labels must be a sequence"):
            openrlhf.reward_func(["q 1", "q 2"], ["q", "q"], "12")
        with self.assertRaisesRegex(TypeError, "acpo.openrlhf: queries must be a sequence"):
            openrlhf.reward_func("q", ["q"], ["1"])
        with self.assertRaisesRegex(TypeError, "acpo.verl: data_sources must be a sequence"):
            acpo_verl.compute_score_batch("mm", ["1", "2"], ["1", "2"])
        with self.assertRaisesRegex(TypeError, "acpo.verl: ground_truths must be a sequence"):
            acpo_verl.compute_score_batch(["m", "m"], ["1", "2"], "12")


if __name__ == "__main__":
    unittest.main()
