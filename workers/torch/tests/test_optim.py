"""The one private torch function zflow replaces (``zflow_torch.optim``): pinned to the torch
release it was written against, and checked to be the one Muon calls."""

import unittest

import torch
from torch.optim import _muon

from zflow_torch import optim


class NewtonSchulz(unittest.TestCase):
    def test_the_torch_it_patches_is_the_pinned_release(self) -> None:
        # workers/torch/requirements.lock pins torch 2.15.0; another release may rename or
        # change `_zeropower_via_newtonschulz`: read its source again before moving the pin.
        self.assertEqual(torch.__version__.split("+")[0], "2.15.0")
        self.assertTrue(hasattr(_muon, "_zeropower_via_newtonschulz"))

    def test_muon_runs_the_f32_iteration_once_installed(self) -> None:
        original = _muon._zeropower_via_newtonschulz
        try:
            optim.use_f32_newton_schulz()
            self.assertIs(_muon._zeropower_via_newtonschulz, optim.newton_schulz_f32)
            w = torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
            w.grad = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
            before = w.detach().clone()
            torch.optim.Muon([w], lr=0.1).step()  # type: ignore[no-untyped-call]
            self.assertFalse(torch.equal(before, w.detach()))
            # The f32 iteration orthogonalises: singular values near one.
            g = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
            s = torch.linalg.svdvals(optim.newton_schulz_f32(g, (3.4445, -4.775, 2.0315), 5, 1e-7))
            self.assertTrue(bool(((s > 0.5) & (s < 1.5)).all()), s)
        finally:
            _muon._zeropower_via_newtonschulz = original


if __name__ == "__main__":
    unittest.main()
