"""Activation checkpointing (``train.activation_checkpointing``; the job's
``activation_checkpointing``, ``runtime/src/contract/settings.rs``): what each decoder layer
keeps for the backward pass, traded against computing it again there.

- ``none``: every activation is kept.
- ``full``: a layer keeps only its input; the backward pass runs the whole layer again
  (transformers' ``activation_checkpointing_enable`` of ``ZayaDecoderLayer``).
- ``selective``: a layer keeps the outputs of its matrix multiplies and of attention, the
  costly operations, and makes everything else again in the backward pass: the norms, the
  SwiGLU activations, the convolutions of CCA, the router's softmax and the residual
  arithmetic (PyTorch's selective activation checkpointing, with ``_keeps`` as its policy).

Making a value again runs the same operations on the same inputs, so the loss and the
gradients are bit-identical to ``none`` on the CPU
(``workers/torch/tests/test_activation_checkpointing.py``).
"""

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from zflow_torch.job import ActivationCheckpointing

aten = torch.ops.aten

# The operations whose outputs ``selective`` keeps: matrix multiplies and attention.
KEPT = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    # The MoE layer's grouped expert path (``model.RoutedMoe``, ``grouped``).
    aten._grouped_mm.default,
}


def _keeps(_ctx: object, op: object, *_args: object, **_kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT else CheckpointPolicy.PREFER_RECOMPUTE


def apply(net: nn.Module, mode: ActivationCheckpointing) -> None:
    """Sets ``net``'s (a ``ZayaForCausalLM``'s) decoder layers to ``mode``."""
    if mode == "none":
        return
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _keeps)
    elif mode != "full":
        raise ValueError(f"activation checkpointing `{mode}`: expected none, full or selective")
    net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
