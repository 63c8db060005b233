# Python check of amp's dispatcher ops: loads libamp with torch.ops.load_library and compares
# torch.ops.amp.* with ATen's ops. Usage: python ops_python.py <path to libamp.so>
import math
import sys
import unittest

import torch

LIBAMP = sys.argv.pop(1) if len(sys.argv) > 1 else None


def bits_equal(a, b):
    """Bitwise equality of two tensors of one dtype (NaN compared by position only)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    view = {torch.float32: torch.int32, torch.float64: torch.int64,
            torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    return torch.equal(a[~nan].view(view), b[~nan].view(view))


class AmpOps(unittest.TestCase):
    def grads(self):
        torch.manual_seed(0)
        out = []
        for dtype, n in [(torch.float32, 1000), (torch.float16, 77), (torch.bfloat16, 4097),
                         (torch.float64, 33), (torch.float32, 0)]:
            out.append((torch.randn(n, dtype=torch.float64) * 1000).to(dtype))
        out.append(torch.randn(40, 30).t())             # transposed
        out.append(torch.randn(50, 20)[:, 3:17])         # non-dense view
        return out

    def run_both(self, grads, inv):
        mine = [g.clone() for g in grads]
        ref = [g.clone() for g in grads]
        found_mine, found_ref = torch.zeros(1), torch.zeros(1)
        inv_t = torch.tensor([inv])
        torch.ops.amp.non_finite_check_and_unscale_(mine, found_mine, inv_t)
        for g in ref:  # ATen takes one dtype per call, as GradScaler groups them
            torch._amp_foreach_non_finite_check_and_unscale_([g], found_ref, inv_t)
        return mine, ref, found_mine, found_ref

    def test_unscale_matches_aten_bit_for_bit(self):
        for inv in [1.0 / 65536, 0.3, 1.0]:
            mine, ref, fm, fr = self.run_both(self.grads(), inv)
            for a, b in zip(mine, ref):
                self.assertTrue(bits_equal(a, b), (inv, a.dtype))
            self.assertEqual(fm.item(), 0.0)
            self.assertEqual(fr.item(), 0.0)

    def test_non_finite_sets_found_inf_and_attribution(self):
        grads = self.grads()
        grads[2][4096] = float("inf")
        grads[6][7, 2] = float("nan")
        flags = torch.zeros(len(grads))
        found = torch.zeros(1)
        torch.ops.amp.non_finite_check_and_unscale_(grads, found, torch.tensor([0.5]), flags)
        self.assertEqual(found.item(), 1.0)
        self.assertEqual(flags.nonzero().flatten().tolist(), [2, 6])

    def test_unscale_norm_and_clip(self):
        grads = [g for g in self.grads() if g.dtype == torch.float32 and g.numel()]
        found = torch.zeros(1)
        inv = torch.tensor([0.25])
        total, per = torch.ops.amp.unscale_norm(grads, found, inv, True)
        ref = [g.double() * 0.25 for g in grads]
        ref_per = torch.stack([r.norm() for r in ref])
        self.assertTrue(torch.allclose(per.double(), ref_per, rtol=1e-6))
        self.assertAlmostEqual(total.item(), ref_per.norm().item(), delta=1e-5 * total.item())
        clipped = [g.clone() for g in grads]
        torch.ops.amp.clip_unscaled_(clipped, inv, total, 1.0)
        expect = [r * (1.0 / (ref_per.norm().item() + 1e-6)) for r in ref]
        for a, b in zip(clipped, expect):
            self.assertTrue(torch.allclose(a.double(), b, rtol=1e-5, atol=1e-9))

    def test_update_scale_matches_aten(self):
        for found in [0.0, 1.0, 0.0, 0.0]:
            s1, t1 = torch.tensor([4.0]), torch.tensor([1], dtype=torch.int32)
            s2, t2 = s1.clone(), t1.clone()
            f = torch.tensor([found])
            torch.ops.amp.update_scale_(s1, t1, f, 2.0, 0.25, 2)
            torch._amp_update_scale_(s2, t2, f, 2.0, 0.25, 2)
            self.assertTrue(torch.equal(s1, s2) and torch.equal(t1, t2))

    def test_update_scale_extensions_are_keyword_arguments(self):
        # Hysteresis 2: the first overflow only spends the allowance, the second backs off.
        s, t = torch.tensor([64.0]), torch.tensor([0], dtype=torch.int32)
        remaining = torch.tensor([2], dtype=torch.int32)
        counters = torch.zeros(3, dtype=torch.int64)
        for expected in (64.0, 32.0):
            torch.ops.amp.update_scale_(s, t, torch.tensor([1.0]), 2.0, 0.5, 2,
                                        hysteresis_remaining=remaining, counters=counters,
                                        hysteresis=2, min_scale=1.0, max_scale=None)
            self.assertEqual(s.item(), expected)
        self.assertEqual(counters.tolist(), [0, 2, 2])
        # The optional tensors left out (their defaults, None), first without an error to raise.
        torch.ops.amp.update_scale_(s, t, torch.tensor([0.0]), 2.0, 0.5, 2)
        self.assertEqual(s.item(), 32.0)
        torch.ops.amp.update_scale_(s, t, torch.tensor([0.0]), 2.0, 0.5, 2,
                                    hysteresis_remaining=None, counters=None)
        self.assertEqual(s.item(), 64.0)
        with self.assertRaisesRegex(RuntimeError, "hysteresis=2 needs the hysteresis_remaining"):
            torch.ops.amp.update_scale_(s, t, torch.tensor([1.0]), 2.0, 0.5, 2, hysteresis=2,
                                        hysteresis_remaining=None)
        with self.assertRaisesRegex(RuntimeError, "hysteresis=2 needs the hysteresis_remaining"):
            torch.ops.amp.update_scale_(s, t, torch.tensor([1.0]), 2.0, 0.5, 2, hysteresis=2)

    def test_errors_name_the_argument(self):
        with self.assertRaisesRegex(RuntimeError, "inv_scale must be a Float tensor"):
            torch.ops.amp.non_finite_check_and_unscale_(
                [torch.ones(2)], torch.zeros(1), torch.ones(1, dtype=torch.float64))


if __name__ == "__main__":
    if LIBAMP:
        torch.ops.load_library(LIBAMP)
    unittest.main(verbosity=2)
