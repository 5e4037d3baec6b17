"""The package's verifier: verdicts as the Rust crate gives them, what crosses from Python
checked (issue #47 item 6), and judgements from many threads at once (issue #45).

Run against the installed package (`pip install ./python`), from the repository root:

    python -m unittest discover -s python/tests -t python/tests -v
"""
import json
import math
import threading
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import acpo

FIXTURE = json.loads((Path(__file__).resolve().parent / "fixtures" / "verifier.json").read_text())
CASES = FIXTURE["cases"]


class Verdicts(unittest.TestCase):
    def test_answers_are_judged_as_the_harness_judges_them(self):
        self.assertTrue(acpo.verify("0.5", r"so x = \boxed{\frac{1}{2}}"))
        self.assertTrue(acpo.verify("025", "Answer: 25"))
        self.assertTrue(acpo.verify("18446744073709551617", r"\boxed{18446744073709551617}"))
        self.assertFalse(acpo.verify("18446744073709551617", r"\boxed{18446744073709551616}"))
        self.assertTrue(acpo.verify(r"-\dfrac{13}{96}, \dfrac{13}{40}", r"\boxed{\frac{13}{40}, -\frac{13}{96}}"))
        self.assertEqual(acpo.score_batch(["4", "4", "x^2+2x+1"], [r"\boxed{4}", "Answer: 5", r"\boxed{(x+1)^2}"]),
                         [1.0, 0.0, 1.0])
        self.assertEqual(acpo.score_batch([], []), [])

    def test_judge_says_what_it_found_and_why(self):
        v = acpo.judge("7", r"we get \boxed{7}.")
        self.assertEqual((v.correct, v.extracted, v.source, v.error, v.gold_unparsed), (True, "7", "boxed", None, False))
        self.assertEqual(v.work, 0)  # the same text as the gold: nothing to compute
        computed = acpo.judge("0.5", r"\boxed{\frac{1}{2}}")
        self.assertTrue(computed.correct)
        self.assertGreater(computed.work, 0)
        self.assertLessEqual(computed.work, acpo.WORK_BUDGET)
        bad = acpo.judge(r"\sum_{k=1}^n k", r"\boxed{3}")
        self.assertFalse(bad.correct)
        self.assertTrue(bad.gold_unparsed)
        self.assertIn("could not be parsed", bad.error)

    def test_numbers_from_a_parquet_column_are_gold_answers(self):
        self.assertTrue(acpo.verify(42, r"\boxed{42}"))
        self.assertTrue(acpo.verify(0.5, r"\boxed{\frac12}"))
        self.assertTrue(acpo.verify(2**70, rf"\boxed{{{2**70}}}"))
        self.assertFalse(acpo.verify(2**70, rf"\boxed{{{2**70 + 1}}}"))
        self.assertTrue(acpo.verify(1e-7, r"\boxed{10^{-7}}"))

    def test_the_tolerance_near_zero_is_monotone(self):
        # issue #47 item 7: 10^-9 and 2^-1000 are closer to 0 than 0.000001, which is accepted
        for pred in ("0.000001", "10^{-9}", "2^{-1000}", "2^{-100000000}"):
            self.assertTrue(acpo.verify("0", rf"\boxed{{{pred}}}"), pred)
        self.assertFalse(acpo.verify("0", r"\boxed{0.0000011}"))

    def test_unicode_spaces_and_invisible_characters(self):
        # a thousands group with a no-break, thin or narrow no-break space is one number
        for space in ("\u00a0", "\u2009", "\u202f"):
            self.assertTrue(acpo.verify("1000", rf"\boxed{{1{space}000}}"), repr(space))
            self.assertFalse(acpo.verify("0", rf"\boxed{{1{space}000}}"), repr(space))
        self.assertTrue(acpo.verify("1000", "Answer: 1\u00a0000"))
        # a zero-width character inside a number is not where the number ends
        for zw in ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"):
            self.assertFalse(acpo.verify("2", rf"\boxed{{1{zw}2}}"), repr(zw))
            self.assertTrue(acpo.verify("12", rf"\boxed{{1{zw}2}}"), repr(zw))
        self.assertTrue(acpo.verify(r"\frac{1}{2}", "\\boxed{\\frac{1}{2}}\u200b"))

    def test_the_hostile_answers_and_math_verifys_hangs_get_the_crates_verdicts(self):
        # every one ends (bounded work: a count, never a timer) with the Rust crate's verdict;
        # acpo bench and tools/twins/bench_math_verify.py time them
        self.assertGreaterEqual(len(CASES), 90)
        names = {c["name"] for c in CASES}
        self.assertTrue({"math-verify#65", "math-verify#63"} <= names)
        got = acpo.score_batch([c["gold"] for c in CASES], [c["response"] for c in CASES])
        self.assertEqual(got, [float(c["correct"]) for c in CASES])
        for c in CASES:
            v = acpo.judge(c["gold"], c["response"])
            self.assertEqual((v.correct, v.error is not None), (c["correct"], c["error"]), c["name"])
            self.assertLessEqual(v.work, acpo.WORK_BUDGET, c["name"])


class WhatCrossesFromPython(unittest.TestCase):
    """Issue #47 item 6: never a silent 0, never a match of an object's str()."""

    def assert_refused(self, error, where, call, *args):
        with self.assertRaises(error) as raised:
            call(*args)
        self.assertIn(where, str(raised.exception))

    def test_a_gold_that_is_not_an_answer_is_refused_naming_it(self):
        self.assert_refused(TypeError, "gold is None", acpo.verify, None, r"\boxed{0}")
        self.assert_refused(TypeError, "golds[1] is None", acpo.score_batch, ["1", None], ["1", r"\boxed{None}"])
        self.assert_refused(ValueError, "golds[0] is the float NaN", acpo.score_batch, [math.nan], [r"\boxed{nan}"])
        self.assert_refused(ValueError, "gold is the float inf", acpo.verify, math.inf, r"\boxed{\infty}")
        self.assert_refused(TypeError, "golds[2] is a bool", acpo.score_batch, ["1", "2", True], ["a", "b", "c"])
        self.assert_refused(TypeError, "gold must be str, int or a finite float", acpo.verify, b"2", r"\boxed{2}")
        self.assert_refused(TypeError, "gold must be str, int or a finite float", acpo.verify, ["2"], r"\boxed{2}")

    def test_a_response_that_is_not_text_is_refused_naming_it(self):
        self.assert_refused(TypeError, "answer must be str", acpo.verify, "2", b"\\boxed{2}")
        self.assert_refused(TypeError, "answers[1] must be str", acpo.score_batch, ["2", "2"], ["x", ["\\boxed{2}"]])
        self.assert_refused(TypeError, "answers[0] must be str", acpo.score_batch, ["2"], [2])
        self.assert_refused(TypeError, "answer must be str", acpo.verify, "2", None)
        self.assert_refused(ValueError, "answers[1] is not valid Unicode", acpo.score_batch, ["1", "1"],
                            [r"\boxed{1}", "odd \udc80"])

    def test_the_sequences_themselves_are_checked(self):
        self.assert_refused(TypeError, "golds must be a sequence", acpo.score_batch, "12", [r"\boxed{1}", r"\boxed{2}"])
        self.assert_refused(TypeError, "answers must be a sequence", acpo.score_batch, ["1"], None)
        self.assert_refused(ValueError, "2 golds but 3 answers", acpo.score_batch, ["1", "2"], ["a", "b", "c"])
        # generators and tuples are sequences too
        self.assertEqual(acpo.score_batch(("1", "2"), (x for x in [r"\boxed{1}", r"\boxed{3}"])), [1.0, 0.0])


class Threads(unittest.TestCase):
    def test_sixty_four_threads_at_once_get_the_verdicts_of_one(self):
        golds = [c["gold"] for c in CASES] + [str(i % 17) for i in range(300)]
        answers = [c["response"] for c in CASES] + [rf"\boxed{{{i % 19}}}" for i in range(300)]
        want = acpo.score_batch(golds, answers)
        barrier = threading.Barrier(64)

        def work(t):
            barrier.wait()  # all 64 in the verifier at the same moment
            if t % 2:
                return acpo.score_batch(golds, answers)
            return [float(acpo.verify(g, a)) for g, a in zip(golds[t::7], answers[t::7])]

        with ThreadPoolExecutor(max_workers=64) as pool:
            results = list(pool.map(work, range(64)))
        for t, got in enumerate(results):
            self.assertEqual(got, want if t % 2 else want[t::7], f"thread {t}")

    def test_a_thread_that_is_not_the_main_thread_judges(self):
        # Math-Verify's signal.alarm timeout only works on the main thread; acpo has none
        out = {}

        def work():
            out["verify"] = acpo.verify("1", r"\boxed{1}")
            out["hang"] = acpo.judge("1", next(c["response"] for c in CASES if c["name"] == "math-verify#65"))

        t = threading.Thread(target=work)
        t.start()
        t.join()
        self.assertTrue(out["verify"])
        self.assertFalse(out["hang"].correct)


if __name__ == "__main__":
    unittest.main()
