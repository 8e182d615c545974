"""The chunked loss (``zflow_torch.loss``) against the full logits."""

import unittest

import tiny_model
import torch
import torch.nn.functional as F

from zflow_torch.loss import CausalLmLoss


def full_loss(net: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = net(input_ids=rows[:, :-1]).logits
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum"
    )


def loss_and_grads(
    net: torch.nn.Module, rows: torch.Tensor, chunk: int | None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    net.zero_grad(set_to_none=True)
    loss = (
        full_loss(net, rows)
        if chunk is None
        else CausalLmLoss(net, chunk)(rows[:, :-1], rows[:, 1:])
    )
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]


class ChunkedLoss(unittest.TestCase):
    def test_chunks_give_the_full_logits_loss_and_gradients(self) -> None:
        m = tiny_model.config()
        net = tiny_model.build(m)
        rows = tiny_model.tokens(m, 3, 40)
        want, want_grads = loss_and_grads(net, rows, None)
        # One chunk: bit for bit.
        loss, grads = loss_and_grads(net, rows, 120)
        self.assertTrue(torch.equal(loss, want))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True)))
        # Several, uneven ones included: within 1e-5 relative, a few f32 roundings of sums in
        # another order (with oneDNN held to AVX2, a gradient was 1.24e-6 off).
        for chunk in (7, 32, 64):
            loss, grads = loss_and_grads(net, rows, chunk)
            self.assertLessEqual(abs(float(loss - want)) / abs(float(want)), 1e-5, chunk)
            for a, b in zip(grads, want_grads, strict=True):
                scale = float(b.abs().max())
                self.assertLessEqual(float((a - b).abs().max()), 1e-5 * scale + 1e-12, chunk)


if __name__ == "__main__":
    unittest.main()
