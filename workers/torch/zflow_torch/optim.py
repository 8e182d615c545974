"""The optimizers' one deviation from torch: Muon's Newton-Schulz orthogonalisation in f32 on
CPUs (``use_f32_newton_schulz``). It replaces a private function of torch 2.15.0's
``torch.optim._muon``; ``workers/torch/tests/test_optim.py`` pins that version and checks the
replacement is what runs."""

import torch


def newton_schulz_f32(
    grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz orthogonalisation (the same quintic iteration), in f32
    instead of bf16. bf16 rounds away a gradient's last bits, so on 1 rank and on 2 (whose
    gradient sums round differently) the updates part after a few steps; in f32 they agree to
    float rounding, which the reshape and data-parallel tests rely on. Installed on CPUs,
    where bf16 buys no speed; GPUs keep torch's bf16."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float32, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    return x.T if tall else x


def use_f32_newton_schulz() -> None:
    """Makes torch.optim.Muon (torch 2.15.0, pinned) orthogonalise in f32."""
    from torch.optim import _muon

    if not hasattr(_muon, "_zeropower_via_newtonschulz"):
        raise RuntimeError("this torch's Muon has no _zeropower_via_newtonschulz to replace")
    _muon._zeropower_via_newtonschulz = newton_schulz_f32
