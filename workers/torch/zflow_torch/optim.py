"""Muon with its Newton-Schulz orthogonalisation batched over same-shaped matrices.

torch.optim.Muon (torch 2.15.0) orthogonalises one matrix at a time. Every expert of a ZAYA1
layer has the same shapes, so on a GPU 16 small matrix products become one batched product
(and so do the layers' same-shaped attention and router matrices; on a CPU, where batching
buys nothing, they stay one at a time): ``BatchedMuon`` is torch's Muon
(its constructor, settings, parameter groups and ``momentum_buffer`` state, so its checkpoints
are torch Muon's) with a ``step`` that runs the same update, grouped.

The iteration runs in f32 on CPUs and in bf16 on GPUs, as torch's does. f32 because bf16 rounds
away a gradient's last bits, so on 1 rank and on 2 (whose gradient sums round differently) the
updates part after a few steps; in f32 they agree to float rounding, which the reshape and
data-parallel tests rely on. On CPUs bf16 buys no speed.
"""

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch


def newton_schulz(
    grads: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration on a batch ``[n, rows, cols]`` of
    same-shaped matrices at once (in ``grads``' dtype, which the caller chooses), each scaled
    to unit Frobenius norm first."""
    a, b, c = ns_coefficients
    x = grads.clone()
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


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon whose orthogonalisation runs once per group of same-shaped matrices."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            # Momentum, matrix by matrix, as torch's Muon does.
            updates: dict[tuple[Any, ...], list[tuple[torch.nn.Parameter, torch.Tensor]]] = (
                defaultdict(list)
            )
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                updates[(tuple(p.shape), p.device, p.dtype)].append((p, update))
            for (_, device, _), members in updates.items():
                cpu = device.type == "cpu"
                batch = torch.stack([u for _, u in members]).to(
                    torch.float32 if cpu else torch.bfloat16
                )
                # On a CPU a batched product runs no faster than its matrices one by one (it
                # ran 10-30% slower on 2 cores), so there they go one at a time.
                parts = list(torch.split(batch, 1)) if cpu else [batch]
                coefficients, steps, eps = group["ns_coefficients"], group["ns_steps"], group["eps"]
                ortho = torch.cat([newton_schulz(b, coefficients, steps, eps) for b in parts])
                for (p, _), o in zip(members, ortho, strict=True):
                    p.mul_(1 - lr * wd)
                    p.add_(o, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
