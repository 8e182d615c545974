"""The MoE layer's expert paths (``model.EXPERT_PATHS``) against ``loop``, the path training
has always taken: the same output, the same gradient of every parameter and input, the same
route counts, with an expert that gets no tokens and tokens on the skip route, for both
``skip_output``s; and no host sync on the sync-free paths.

How equal, on the CPU:

- ``grouped``: bit for bit (torch runs ``_grouped_mm`` on the CPU as one ``mm`` per group,
  the ``mm`` that ``F.linear`` runs): in f32 the layer and the whole model, under bf16
  autocast the layer.
- ``padded``, ``padded_max``: within ``TOLERANCE`` of each tensor's largest magnitude, not bit
  for bit: ``bmm``'s kernels round differently from ``mm``'s for small matrices, and its weight
  gradient also sums over the padding rows (exact zeros, but another summation blocking).
"""

import contextlib
import unittest
from collections.abc import Iterator
from typing import Any
from unittest import mock

import tiny_model
import torch

from zflow_torch import model
from zflow_torch.loss import CausalLmLoss

PATHS = [p for p in model.EXPERT_PATHS if p != "grouped" or model.grouped_mm_available()]
BIT_FOR_BIT = {"loop", "grouped"}
# max |a - b| / max |b| per tensor, for the paths that are not bit for bit.
TOLERANCE = 1e-6
SYNC_FREE = [p for p in ("grouped", "padded") if p in PATHS]

# Expert 1 gets no token; the skip route gets some (checked where used).
BIASES = [0.0, -10.0, 0.0, 0.0, 0.0]
LAYER = 1  # a layer with EDA: the previous router state is an input too


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    err = (a.double() - b.double()).abs().max().item()
    return err / scale if scale > 0 else err


def routed_net(skip_output: str) -> torch.nn.Module:
    m = tiny_model.config(skip_output=skip_output)
    net = tiny_model.build(m)
    model.set_biases(net, [BIASES] * m.num_blocks)
    return net


def routed_layer(skip_output: str) -> model.RoutedMoe:
    net: Any = routed_net(skip_output)
    moe: model.RoutedMoe = net.model.layers[LAYER].mlp
    return moe


def layer_run(
    moe: model.RoutedMoe, path: str, autocast: bool = False
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One MoE layer's forward and backward: its output, router state, the gradients of its
    inputs and of every parameter (in order), and the route counts."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 48, 64, generator=g, requires_grad=True)
    prev = torch.randn(2, 48, 32, generator=g, requires_grad=True)
    grad_out, grad_state = torch.randn(2, 48, 64, generator=g), torch.randn(2, 48, 32, generator=g)
    moe.expert_path = path
    moe.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, state = moe(x, prev)
    ((out.float() * grad_out).sum() + (state.float() * grad_state).sum()).backward()
    grads = [p.grad for p in moe.parameters()]
    assert all(gr is not None for gr in grads), path
    tensors = [out.detach(), state.detach(), x.grad, prev.grad, *grads]
    assert moe.counts is not None
    return [t for t in tensors if t is not None], moe.counts


def model_run(net: torch.nn.Module, path: str) -> list[torch.Tensor]:
    """The whole model's loss and every parameter's gradient."""
    model.set_expert_path(net, path)
    net.zero_grad(set_to_none=True)
    rows = tiny_model.tokens(tiny_model.config(), 2, 48)
    loss = CausalLmLoss(net, 32)(rows[:, :-1], rows[:, 1:])
    loss.backward()
    grads = [p.grad for p in net.parameters()]
    assert all(gr is not None for gr in grads), path
    return [loss.detach(), *[gr for gr in grads if gr is not None]]


class Paths(unittest.TestCase):
    def assert_matches(self, path: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
        self.assertEqual(len(got), len(want), path)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            self.assertEqual(a.dtype, b.dtype, (path, i))
            if path in BIT_FOR_BIT:
                self.assertTrue(torch.equal(a, b), (path, i, relative_error(a, b)))
            else:
                self.assertLessEqual(relative_error(a, b), TOLERANCE, (path, i))

    def test_a_layer_gives_loops_output_and_gradients(self) -> None:
        for skip_output in ("zero", "input"):
            moe = routed_layer(skip_output)
            want, counts_tensor = layer_run(moe, "loop")
            counts = counts_tensor.tolist()
            self.assertEqual(counts[1], 0)
            self.assertGreater(counts[-1], 0)
            self.assertGreaterEqual(sum(c > 0 for c in counts[:-1]), 2, counts)
            for path in PATHS:
                got, got_counts = layer_run(moe, path)
                self.assertTrue(torch.equal(got_counts, counts_tensor), path)
                self.assert_matches(path, got, want)
                # The starved expert's gradient is there, and zero.
                for p in (moe.experts.gate_up[1], moe.experts.down[1]):
                    self.assertTrue(torch.equal(p.grad, torch.zeros_like(p)), path)

    def test_a_layer_under_bf16_autocast(self) -> None:
        for skip_output in ("zero", "input"):
            moe = routed_layer(skip_output)
            want, counts = layer_run(moe, "loop", autocast=True)
            for path in PATHS:
                got, got_counts = layer_run(moe, path, autocast=True)
                self.assertTrue(torch.equal(got_counts, counts), path)
                if path in BIT_FOR_BIT:
                    self.assert_matches(path, got, want)
                else:
                    # bf16 products: bf16's rounding, not f32's.
                    for a, b in zip(got, want, strict=True):
                        self.assertEqual(a.dtype, b.dtype, path)
                        self.assertLessEqual(relative_error(a, b), 1e-2, path)

    def test_the_model_trains_bit_for_bit_on_the_bitwise_paths(self) -> None:
        for skip_output in ("zero", "input"):
            net = routed_net(skip_output)
            want = model_run(net, "loop")
            counts = model.route_counts(net)
            self.assertTrue((counts[:, 1] == 0).all())
            self.assertTrue((counts[:, -1] > 0).all())
            for path in PATHS:
                got = model_run(net, path)
                self.assertTrue(torch.equal(model.route_counts(net), counts), path)
                if path in BIT_FOR_BIT:
                    self.assert_matches(path, got, want)
                else:
                    # f32 rounding differences in a layer's gradients reach the earlier
                    # layers' small router gradients amplified; the layer test bounds them
                    # where they arise. The loss is the forward's.
                    self.assertLessEqual(relative_error(got[0], want[0]), TOLERANCE, path)

    def test_the_sync_free_paths_read_nothing_on_the_host(self) -> None:
        moe = routed_layer("input")
        for path in SYNC_FREE:
            with no_host_reads():
                layer_run(moe, path)
        # The guard works: the loop path reads the counts.
        with self.assertRaisesRegex(AssertionError, "host read"), no_host_reads():
            layer_run(moe, "loop")

    @unittest.skipUnless(torch.cuda.is_available(), "CUDA only")
    def test_the_sync_free_paths_do_not_sync_on_cuda(self) -> None:
        # Not yet run on a GPU: written for one, skipped on the CPU.
        moe = routed_layer("input").cuda()
        x = torch.randn(2, 48, 64, device="cuda", requires_grad=True)
        prev = torch.randn(2, 48, 32, device="cuda")
        # `_grouped_mm` has one kernel for bf16 on sm90/sm100; elsewhere its fallback copies
        # the offsets to the host.
        kernel = torch.cuda.get_device_capability()[0] in (9, 10)
        for path in [p for p in SYNC_FREE if p != "grouped" or kernel]:
            moe.expert_path = path
            with torch.autocast("cuda", dtype=torch.bfloat16):
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    out, state = moe(x, prev)
                    (out.float().square().sum() + state.float().sum()).backward()
                finally:
                    torch.cuda.set_sync_debug_mode("default")

    def test_an_unknown_path_is_named(self) -> None:
        with self.assertRaisesRegex(ValueError, "expert path `fast`: expected one of loop"):
            model.set_expert_path(routed_net("zero"), "fast")


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Fails any read of a tensor's values into Python (a host sync on an accelerator)."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("host read of a tensor")

    names = ["tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(mock.patch.object(torch.Tensor, name, refuse))
        yield


if __name__ == "__main__":
    unittest.main()
