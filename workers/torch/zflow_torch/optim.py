"""Muon with its Newton-Schulz orthogonalisation batched over same-shaped matrices.

torch.optim.Muon (torch 2.15.0) orthogonalises one matrix at a time. Every expert of a ZAYA1
layer has the same shapes, and so do the layers' attention and router matrices, so 16 small
matrix products become one batched product: ``BatchedMuon`` is torch's Muon (its constructor,
settings, parameter groups and ``momentum_buffer`` state, so its checkpoints are torch Muon's)
with a ``step`` that runs the same update, grouped. Batched, the iteration ran 10-25% faster
than one matrix at a time on 2 CPU cores too (the nano model's 256 x 256 and 512 x 256 groups).

The iteration runs in ``ns_dtype`` (``train.muon.ns_dtype``): bf16 as torch's does, 2.3x faster
than f32 on a CPU with bf16 instructions; or f32, because bf16 rounds away a gradient's last
bits, so on 1 rank and on 2 (whose gradient sums round differently) bf16 updates part after a
few steps, where f32 ones agree to float rounding (which the reshape and context-parallel tests
compare).
"""

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from zflow_torch.job import Dtype


def newton_schulz(
    grads: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration on a batch ``[n, rows, cols]`` of
    same-shaped matrices at once (in ``grads``' dtype, which the caller chooses), each scaled
    to unit Frobenius norm first."""
    a, b, c = ns_coefficients
    x = grads
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.mT
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, update, x, beta=a)
    return x.mT if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The learning rate of a ``shape`` matrix, as torch.optim.Muon documents its
    ``adjust_lr_fn`` settings."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral_unclamped":
        return lr * math.sqrt(rows / cols)
    return lr


DTYPES: dict[Dtype, torch.dtype] = {"bf16": torch.bfloat16, "f32": torch.float32}


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon whose orthogonalisation runs once per group of same-shaped matrices,
    in ``ns_dtype`` (``"bf16"`` or ``"f32"``); every other argument is torch.optim.Muon's."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        ns_dtype: Dtype = "bf16",
        **settings: float | bool | str,
    ) -> None:
        super().__init__(params, **settings)  # type: ignore[arg-type]
        # Not a parameter group's setting: the state dict stays torch Muon's.
        self.ns_dtype = DTYPES[ns_dtype]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            coefficients, steps, eps = group["ns_coefficients"], group["ns_steps"], group["eps"]
            same_shaped: dict[tuple[Any, ...], list[tuple[torch.nn.Parameter, torch.Tensor]]] = (
                defaultdict(list)
            )
            for p in group["params"]:
                if p.grad is not None:
                    same_shaped[(tuple(p.shape), p.device, p.dtype)].append((p, p.grad))
            # One group at a time, so that only one group's updates exist at once.
            for members in same_shaped.values():
                updates = []
                # Momentum, matrix by matrix, as torch's Muon does.
                for p, grad in members:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(grad)
                    buf = state["momentum_buffer"]
                    buf.lerp_(grad, 1 - momentum)
                    updates.append(grad.lerp(buf, momentum) if group["nesterov"] else buf)
                batch = torch.stack(updates).to(self.ns_dtype)
                del updates
                ortho = newton_schulz(batch, coefficients, steps, eps)
                del batch
                for (p, _), o in zip(members, ortho, strict=True):
                    p.mul_(1 - lr * wd)
                    p.add_(o, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
