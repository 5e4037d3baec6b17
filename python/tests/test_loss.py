"""`acpo.loss` on what a careless caller or a padded batch gives it: α that is not a finite
number > 0, NaN or inf in masked-out positions, a mask that selects nothing, an empty batch.
Skipped without torch (the package itself does not need it)."""
import math
import unittest

try:
    import torch
except ImportError:
    torch = None


def batch():
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -0.7, -1.5, -0.9]], dtype=torch.float64)
    lp = torch.tensor([[-0.8, -0.9, -1.0, -0.2], [-0.1, -1.2, -1.4, -0.2]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    return old, lp, adv, mask


MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")


@unittest.skipIf(torch is None, "torch is not installed")
class Alpha(unittest.TestCase):
    def test_alpha_must_be_a_finite_number_above_zero(self):
        from acpo.loss import acpo_token_losses

        old, lp, adv, mask = batch()
        for alpha in (0.0, -1.0, math.nan, math.inf, -math.inf, True, "2", None, torch.tensor([1.0, 2.0])):
            with self.assertRaisesRegex(ValueError, "alpha must be"):
                acpo_token_losses(old, lp, adv, mask, alpha)
        for alpha in (2, 0.5, torch.tensor(2.0)):
            acpo_token_losses(old, lp, adv, mask, alpha)


@unittest.skipIf(torch is None, "torch is not installed")
class MaskedPositions(unittest.TestCase):
    def test_nan_and_inf_where_the_mask_is_zero_change_nothing(self):
        from acpo.loss import acpo_token_losses, aggregate

        def run(poison):
            old, lp, adv, mask = batch()
            if poison:
                for t, value in ((old, math.nan), (lp, math.inf), (adv, -math.inf)):
                    t[0, 3], t[1, 2] = value, math.nan
                    t[1, 3] = -value
            lp.requires_grad_(True)
            losses, metrics = acpo_token_losses(old, lp, adv, mask, 0.5)
            out = {}
            for mode in MODES:
                if lp.grad is not None:
                    lp.grad = None
                loss = aggregate(losses, mask, mode)
                loss.backward(retain_graph=True)
                out[mode] = (loss.item(), lp.grad.clone())
            return losses.detach(), metrics, out

        clean, dirty = run(False), run(True)
        self.assertTrue(torch.equal(clean[0], dirty[0]))
        self.assertEqual(clean[1], dirty[1])
        for mode in MODES:
            self.assertTrue(math.isfinite(dirty[2][mode][0]), mode)
            self.assertEqual(clean[2][mode][0], dirty[2][mode][0], mode)
            self.assertTrue(torch.equal(clean[2][mode][1], dirty[2][mode][1]), mode)

    def test_a_mask_that_selects_nothing_gives_zero_not_nan(self):
        from acpo.loss import acpo_token_losses, aggregate

        old, lp, adv, mask = batch()
        lp.requires_grad_(True)
        zero = torch.zeros_like(mask)
        losses, metrics = acpo_token_losses(old, lp, adv, zero, 2.0)
        self.assertTrue(all(math.isfinite(v) for v in metrics.values()), metrics)
        for mode in MODES:
            loss = aggregate(losses, zero, mode)
            self.assertEqual(loss.item(), 0.0, mode)
            loss.backward(retain_graph=True)
            self.assertTrue(torch.all(lp.grad == 0.0), mode)
        # a batch of which one sequence has no token: that sequence does not count
        one = mask.clone()
        one[1] = 0.0
        self.assertTrue(math.isfinite(aggregate(losses, one, "seq-mean-token-mean").item()))

    def test_an_empty_batch_or_mismatched_shapes_are_refused(self):
        from acpo.loss import acpo_token_losses, aggregate

        empty = torch.zeros((0, 4), dtype=torch.float64)
        with self.assertRaisesRegex(ValueError, "empty batch"):
            acpo_token_losses(empty, empty, empty, empty, 2.0)
        with self.assertRaisesRegex(ValueError, "empty batch"):
            aggregate(empty, empty, "token-mean")
        old, lp, adv, mask = batch()
        with self.assertRaisesRegex(ValueError, "differ in shape"):
            acpo_token_losses(old, lp, adv[:, :2], mask, 2.0)


if __name__ == "__main__":
    unittest.main()
