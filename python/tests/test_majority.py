"""maj@k as `acpo eval` computes it (python/tests/fixtures/majority.json holds cases that
tests/it/eval.rs checks the Rust vote on too), and against verl's own `calc_maj_val` where verl is
importable."""
import json
import random
import unittest
from pathlib import Path

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


class SharedCases(unittest.TestCase):
    def test_the_vote_is_acpo_evals_on_the_shared_cases(self):
        cases = json.loads((Path(__file__).parent / "fixtures" / "majority.json").read_text(encoding="utf-8"))["cases"]
        self.assertGreaterEqual(len(cases), 10)
        for case in cases:
            self.assertEqual(acpo.majority_vote(case["answers"]), case["winner"], case)


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

    def test_a_sample_without_an_answer_votes_for_the_empty_pred_in_verl_and_not_in_acpo(self):
        # two truncated responses and one right answer: acpo.verl's `pred` is "" for the
        # truncated ones, and "" wins verl's vote (scored wrong); acpo votes over real answers only
        from acpo.verl import compute_score

        responses = ["Let me think step by step, and", "So the answer is", r"so \boxed{3}"]
        scored = [compute_score("math", r, "3") for r in responses]
        self.assertEqual([d["pred"] for d in scored], ["", "", "3"])
        theirs = calc_maj_val([{"pred": d["pred"], "val": d["score"]} for d in scored], vote_key="pred", val_key="val")
        self.assertEqual(theirs, 0.0)
        self.assertEqual(acpo.maj_at_k("3", responses), 1.0)
        # a tie between "" and an answer: verl's goes to whichever came first
        for order, verl_value in (([responses[0], responses[2]], 0.0), ([responses[2], responses[0]], 1.0)):
            scored = [compute_score("math", r, "3") for r in order]
            rows = [{"pred": d["pred"], "val": d["score"]} for d in scored]
            self.assertEqual(calc_maj_val(rows, vote_key="pred", val_key="val"), verl_value)
            self.assertEqual(acpo.maj_at_k("3", order), 1.0)

    def test_verl_differs_exactly_when_the_answerless_samples_win_its_vote(self):
        # the documented rule: verl's winner is "" (the first answerless sample's value) when
        # the samples without an answer outnumber acpo's winning answer, or tie with it and the
        # first of them comes first; otherwise both pick the same sample
        rng = random.Random(61)
        for _ in range(2000):
            k = rng.randint(1, 9)
            answers = [rng.choice([None, None, "a", "b", "c"][: rng.randint(1, 5)]) for _ in range(k)]
            vals = [rng.random() for _ in range(k)]
            theirs = calc_maj_val([{"pred": a or "", "val": v} for a, v in zip(answers, vals)],
                                  vote_key="pred", val_key="val")
            winner = acpo.majority_vote(answers)
            blanks = [i for i, a in enumerate(answers) if a is None]
            if winner is None:
                self.assertEqual(theirs, vals[blanks[0]], answers)
                continue
            votes = answers.count(answers[winner])
            if len(blanks) > votes or (len(blanks) == votes and blanks[0] < winner):
                self.assertEqual(theirs, vals[blanks[0]], answers)
            else:
                self.assertEqual(theirs, vals[winner], answers)


if __name__ == "__main__":
    unittest.main()
