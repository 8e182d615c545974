"""Activation checkpointing (``zflow_torch.activation_checkpointing``): the loss and every
gradient bit-identical to keeping every activation, for each mode."""

import unittest
from typing import Any

import tiny_model
import torch

from zflow_torch import activation_checkpointing
from zflow_torch.job import ActivationCheckpointing
from zflow_torch.loss import CausalLmLoss


def loss_and_grads(
    mode: ActivationCheckpointing,
) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """The loss, the gradients, and how often the first layer's MoE ran (twice where the
    backward pass made its activations again)."""
    m = tiny_model.config(sliding_blocks=[1], sliding_window=8)
    net = tiny_model.build(m)
    activation_checkpointing.apply(net, mode)
    net.train()
    runs = [0]
    first: Any = net.model.layers[0]  # type: ignore[union-attr, index]
    first.mlp.register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    rows = tiny_model.tokens(m, 2, 48)
    loss = CausalLmLoss(net, 32)(rows[:, :-1], rows[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in net.parameters() if p.grad is not None], runs[0]


class Modes(unittest.TestCase):
    def test_every_mode_gives_the_same_loss_and_gradients_bit_for_bit(self) -> None:
        want, want_grads, runs = loss_and_grads("none")
        self.assertGreater(len(want_grads), 20)
        self.assertEqual(runs, 1)
        modes: list[ActivationCheckpointing] = ["full", "selective"]
        for mode in modes:
            loss, grads, runs = loss_and_grads(mode)
            self.assertEqual(runs, 2, mode)
            self.assertTrue(torch.equal(loss, want), mode)
            self.assertEqual(len(grads), len(want_grads), mode)
            for a, b in zip(grads, want_grads, strict=True):
                self.assertTrue(torch.equal(a, b), mode)

    def test_an_unknown_mode_is_named(self) -> None:
        m = tiny_model.config()
        with self.assertRaisesRegex(ValueError, "`some`: expected none, full or selective"):
            activation_checkpointing.apply(tiny_model.build(m), "some")  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
