"""The training loss without the full logits.

A ZAYA1 micro-batch of 32,768 tokens over a 262,272-token vocabulary has 34 GB of f32 logits;
their softmax gradient is as large again. ``CausalLmLoss`` runs the decoder once, then the
output layer and the cross-entropy one chunk of ``chunk_tokens`` positions at a time, each chunk
but the last under activation checkpointing: its logits are freed as soon as its loss is summed,
and made again, chunk by chunk, in the backward pass. The last chunk keeps its logits: the
backward pass starts with them, so they are freed before any other chunk's are made, and at most
one chunk's logits exist at any time all the same. (Checkpointing it too made a one-chunk
micro-batch's logits twice: 11% of the nano model's step on a CPU.)

With one chunk (a micro-batch of at most ``chunk_tokens`` tokens) the loss and gradients are
bit-identical to the plain ``cross_entropy(lm_head(hidden))``; with several, the sum over
chunks rounds differently (``workers/torch/tests/test_loss.py`` holds them within 1e-6 relative).
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The summed cross-entropy of one chunk's positions (logits in f32)."""
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


class CausalLmLoss(nn.Module):
    """``net``'s summed next-token loss over ``inputs`` and ``targets`` (``[batch, seq]``),
    its logits made ``chunk_tokens`` positions at a time. The module that
    DistributedDataParallel wraps: it owns ``net``, so every parameter is its own."""

    def __init__(self, net: nn.Module, chunk_tokens: int) -> None:
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
        self.net = net
        self.chunk_tokens = chunk_tokens

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # transformers' ZayaForCausalLM: its decoder (``model``) and output layer (``lm_head``).
        net: Any = self.net
        hidden = net.model(input_ids=inputs).last_hidden_state
        flat = hidden.reshape(-1, hidden.shape[-1])
        wanted = targets.reshape(-1)
        weight = net.lm_head.weight
        total: torch.Tensor | None = None
        n = wanted.numel()
        for start in range(0, n, self.chunk_tokens):
            end = start + self.chunk_tokens
            args = (flat[start:end], weight, wanted[start:end])
            if end < n:
                part = checkpoint(_chunk_loss, *args, use_reentrant=False)
            else:
                part = _chunk_loss(*args)
            total = part if total is None else total + part
        assert total is not None, "an empty batch"
        return total
