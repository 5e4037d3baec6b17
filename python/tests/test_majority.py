"""maj@k as `acpo eval` computes it (src/eval.rs, tests/it/eval.rs hold the same cases), and
against verl's own `calc_maj_val` where verl is importable."""
import random
import unittest

import acpo

try:
    from verl.trainer.ppo.metric_utils import calc_maj_val
except Exception:  # not installed, or verl without its dependencies
    calc_maj_val = None


class MajorityVote(unittest.TestCase):
    def test_the_most_frequent_answer_wins_and_no_answer_does_not_vote(self):
        self.assertEqual(acpo.majority_vote(["3", None, "4", "4", None, None]), 2)
        self.assertEqual(acpo.majority_vote([None, None]), None)
        self.assertEqual(acpo.majority_vote([]), None)

    def test_a_tie_goes_to_the_answer_seen_first(self):
        self.assertEqual(acpo.majority_vote(["4", "3", "3", "4"]), 0)
        self.assertEqual(acpo.majority_vote(iter(["b", "a"])), 0)

    def test_equal_strings_vote_together_equivalent_ones_do_not(self):
        self.assertEqual(acpo.majority_vote(["1/2", "0.5", "7", "7"]), 2)

    def test_a_non_string_answer_is_refused(self):
        with self.assertRaisesRegex(TypeError, r"answers\[1\]"):
            acpo.majority_vote(["1", 1])


class MajAtK(unittest.TestCase):
    def test_the_majority_answers_verdict_decides(self):
        # 0.5 and \frac{1}{2} are both right but vote apart: the wrong 3 has more votes
        self.assertEqual(acpo.maj_at_k("1/2", [r"\boxed{0.5}", r"\boxed{3}", r"\boxed{3}", r"\boxed{\frac{1}{2}}"]), 0.0)
        self.assertEqual(acpo.maj_at_k("1/2", [r"\boxed{3}", r"\boxed{0.5}", r"\boxed{0.5}"]), 1.0)
        # a tie: the answer seen first
        self.assertEqual(acpo.maj_at_k(7, [r"\boxed{7}", r"\boxed{8}"]), 1.0)
        self.assertEqual(acpo.maj_at_k(7, [r"\boxed{8}", r"\boxed{7}"]), 0.0)

    def test_bad_input_is_refused(self):
        with self.assertRaises(TypeError):
            acpo.maj_at_k("1", "Answer: 1")
        with self.assertRaises(ValueError):
            acpo.maj_at_k("1", [])


@unittest.skipIf(calc_maj_val is None, "verl is not importable")
class AgainstVerl(unittest.TestCase):
    def test_the_vote_is_verls_calc_maj_val_on_every_answer_list(self):
        # verl votes only where every sample has a `pred` (acpo.verl returns the extracted answer)
        rng = random.Random(60)
        for _ in range(2000):
            k = rng.randint(1, 9)
            preds = [rng.choice("abcd"[: rng.randint(1, 4)]) for _ in range(k)]
            vals = [rng.random() for _ in range(k)]
            ours = vals[acpo.majority_vote(preds)]
            theirs = calc_maj_val([{"pred": p, "val": v} for p, v in zip(preds, vals)], vote_key="pred", val_key="val")
            self.assertEqual(ours, theirs, preds)


if __name__ == "__main__":
    unittest.main()
