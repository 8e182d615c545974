"""Muon with batched Newton-Schulz (``zflow_torch.optim``) against torch.optim.Muon."""

import unittest

import torch
from torch.optim import _muon

from zflow_torch import optim
from zflow_torch.job import Dtype

COEFFICIENTS = (3.4445, -4.775, 2.0315)


def matrices(n: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(n, rows, cols, generator=torch.Generator().manual_seed(seed))


class BatchedNewtonSchulz(unittest.TestCase):
    def test_a_batch_is_each_matrix_on_its_own_and_torch_s_iteration(self) -> None:
        for rows, cols in [(16, 8), (8, 16), (12, 12)]:
            g = matrices(5, rows, cols, rows)
            batched = optim.newton_schulz(g, COEFFICIENTS, 5, 1e-7)
            for i in range(5):
                alone = optim.newton_schulz(g[i : i + 1], COEFFICIENTS, 5, 1e-7)[0]
                torch.testing.assert_close(batched[i], alone, rtol=1e-5, atol=1e-6)
                # torch's own iteration, in bf16: equal to bf16 rounding.
                theirs = _muon._zeropower_via_newtonschulz(g[i], COEFFICIENTS, 5, 1e-7)
                torch.testing.assert_close(batched[i], theirs.float(), rtol=0.05, atol=0.03)
            # It orthogonalises: singular values near one.
            s = torch.linalg.svdvals(batched)
            self.assertTrue(bool(((s > 0.5) & (s < 1.5)).all()), s)

    def test_in_bf16_a_batch_is_torch_s_iteration_matrix_by_matrix(self) -> None:
        for rows, cols in [(16, 8), (8, 16), (12, 12)]:
            g = matrices(5, rows, cols, rows)
            batched = optim.newton_schulz(g.bfloat16(), COEFFICIENTS, 5, 1e-7)
            self.assertEqual(batched.dtype, torch.bfloat16)
            for i in range(5):
                theirs = _muon._zeropower_via_newtonschulz(g[i], COEFFICIENTS, 5, 1e-7)
                # Batched and one-at-a-time kernels may round differently: bf16's last bit.
                torch.testing.assert_close(batched[i], theirs, rtol=0.02, atol=0.01)

    def test_a_step_is_torch_muon_s_with_its_state_and_settings(self) -> None:
        dtypes: list[tuple[Dtype, float]] = [("bf16", 2e-4), ("f32", 2e-3)]
        for ns_dtype, tolerance in dtypes:
            shapes = [(8, 4), (8, 4), (8, 4), (6, 6)]
            ours = [torch.nn.Parameter(matrices(1, *s, i)[0]) for i, s in enumerate(shapes)]
            theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
            settings: dict[str, float | str] = {
                "lr": 0.02,
                "weight_decay": 0.1,
                "adjust_lr_fn": "match_rms_adamw",
            }
            a = optim.BatchedMuon(ours, ns_dtype, **settings)
            b = torch.optim.Muon(theirs, **settings)  # type: ignore[arg-type]
            for step in range(3):
                for i, (p, q) in enumerate(zip(ours, theirs, strict=True)):
                    p.grad = matrices(1, *shapes[i], 100 * step + i)[0]
                    q.grad = p.grad.clone()
                a.step()
                b.step()  # type: ignore[no-untyped-call]
            for p, q in zip(ours, theirs, strict=True):
                torch.testing.assert_close(p, q, rtol=0.02, atol=tolerance)
        # The same state and settings: a checkpoint of one is a checkpoint of the other.
        sa, sb = a.state_dict(), b.state_dict()
        self.assertEqual(sa["param_groups"], sb["param_groups"])
        self.assertEqual(
            {k: set(v) for k, v in sa["state"].items()}, {k: set(v) for k, v in sb["state"].items()}
        )


if __name__ == "__main__":
    unittest.main()
