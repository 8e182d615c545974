"""Context parallelism (``zflow_torch.context_parallel``): the loss and the gradients of a
sequence split over 2 and 4 gloo ranks against the same sequence on one rank.

Four processes make one world of 4: once as one CP group of 4, once as two CP groups of 2 (DP
x CP, each pair with batches of its own). The model has a sliding-window layer whose window
crosses the chunks' boundaries, and CCA convolutions whose halo does."""

import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

import gloo_ranks
import tiny_model
import torch
import torch.distributed as dist
import torch.nn.functional as F

from zflow_torch import activation_checkpointing
from zflow_torch.context_parallel import ContextParallel, enable, whole_sequences
from zflow_torch.job import ActivationCheckpointing, ModelConfig
from zflow_torch.loss import CausalLmLoss

WORLD = 4
BATCH, SEQ = 2, 32
# Three checks per split: f32 through the trainer's loss (CausalLmLoss), the same under
# selective activation checkpointing (whose backward pass runs the collectives again), and
# f64 through the full logits, where only exactness leaves a difference near f64's rounding.
CASES: list[tuple[str, torch.dtype, ActivationCheckpointing]] = [
    ("f32", torch.float32, "none"),
    ("f32-selective", torch.float32, "selective"),
    ("f64", torch.float64, "none"),
]
# How far the split may move a result, relative to the largest gradient (or the loss). Seen:
# f32 2.3e-7 of the largest gradient (2.8e-6 of a scalar one, qk_norm.temp with 4 ranks, a sum
# with cancellation), f64 1.1e-16.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
# A child that takes longer has hung (a lost peer): the test fails instead of waiting.
DEADLINE_S = 180.0

Result = tuple[torch.Tensor, dict[str, torch.Tensor]]


def tiny() -> ModelConfig:
    # Conv kernel 3: the convolutions look back 4 tokens. Block 1 slides with a window of 8:
    # a chunk of 8 (4 ranks) or 16 (2 ranks) sees keys of the previous chunk in both.
    return tiny_model.config(conv_kernel=3, sliding_blocks=[1], sliding_window=8)


def summed_loss(
    net: torch.nn.Module, dtype: torch.dtype, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The summed next-token loss: CausalLmLoss's for f32, the full logits' in f64 (the
    chunked loss takes its logits to f32)."""
    if dtype == torch.float32:
        loss: torch.Tensor = CausalLmLoss(net, 1 << 20)(inputs, targets)
        return loss
    logits = net(input_ids=inputs).logits
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
    )


def loss_and_grads(
    m: ModelConfig,
    case: tuple[str, torch.dtype, ActivationCheckpointing],
    rows: torch.Tensor,
    cp: ContextParallel,
) -> Result:
    """This rank's summed loss on its chunk of ``rows`` and its gradients."""
    _, dtype, mode = case
    net = tiny_model.build(m).to(dtype)
    activation_checkpointing.apply(net, mode)
    enable(net, cp)
    net.train()
    loss = summed_loss(net, dtype, cp.chunk(rows[:, :-1]), cp.chunk(rows[:, 1:]))
    torch.autograd.backward(loss)
    grads = {
        name: p.grad if p.grad is not None else torch.zeros_like(p)
        for name, p in net.named_parameters()
    }
    return loss.detach(), grads


def run_rank(rank: int, port: int, out: str) -> None:
    """One process of the world: each split, each case; a group's first rank saves its
    group's summed loss and gradients."""
    torch.set_num_threads(1)
    gloo_ranks.join(rank, port, WORLD)
    m = tiny()
    for size in (2, 4):
        # Every rank makes every group, in the same order.
        groups = [dist.new_group(list(range(g, g + size))) for g in range(0, WORLD, size)]
        index = rank // size
        cp = ContextParallel.over(groups[index])
        rows = tiny_model.tokens(m, BATCH, SEQ, seed=index)
        for case in CASES:
            loss, grads = loss_and_grads(m, case, rows, cp)
            # The chunks' sums add up to the sequence's; so do their gradients.
            dist.all_reduce(loss, group=cp.group)
            for g in grads.values():
                dist.all_reduce(g, group=cp.group)
            if cp.rank == 0:
                torch.save((loss, grads), Path(out) / f"{size}-{index}-{case[0]}.pt")
    dist.destroy_process_group()


class Splits(unittest.TestCase):
    def test_two_and_four_ranks_give_one_ranks_loss_and_gradients(self) -> None:
        started = time.monotonic()
        m = tiny()
        # One rank's results, made first: the children are forked from this process, with
        # torch and transformers imported and warm (spawned ones would take seconds each).
        want = {
            (index, case[0]): loss_and_grads(
                m, case, tiny_model.tokens(m, BATCH, SEQ, seed=index), ContextParallel.single()
            )
            for index in range(WORLD // 2)
            for case in CASES
        }
        with tempfile.TemporaryDirectory() as out:
            gloo_ranks.run(self, run_rank, WORLD, out, started + DEADLINE_S)
            for size in (2, 4):
                for index in range(WORLD // size):
                    for name, dtype, _ in CASES:
                        want_loss, want_grads = want[index, name]
                        loss, grads = torch.load(Path(out) / f"{size}-{index}-{name}.pt")
                        what = f"{size} ranks, group {index}, {name}"
                        tol = TOLERANCE[dtype]
                        torch.testing.assert_close(loss, want_loss, rtol=tol, atol=0.0, msg=what)
                        scale = max(float(g.abs().max()) for g in want_grads.values())
                        self.assertEqual(grads.keys(), want_grads.keys())
                        for key, g in want_grads.items():
                            torch.testing.assert_close(
                                grads[key], g, rtol=tol, atol=tol * scale, msg=f"{what}: {key}"
                            )


class OneRank(unittest.TestCase):
    def test_one_rank_leaves_the_model_as_it_is(self) -> None:
        m = tiny()
        rows = tiny_model.tokens(m, BATCH, SEQ)
        net: Any = tiny_model.build(m)
        enable(net, ContextParallel.single())
        self.assertEqual(net.config._attn_implementation, "sdpa")
        self.assertFalse(net.model._forward_pre_hooks)
        self.assertNotIn("forward", vars(net.model.layers[0].self_attn.qkv_proj))
        want = CausalLmLoss(tiny_model.build(m), 64)(rows[:, :-1], rows[:, 1:])
        self.assertTrue(torch.equal(CausalLmLoss(net, 64)(rows[:, :-1], rows[:, 1:]), want))

    def test_whole_sequences_run_as_on_one_rank(self) -> None:
        # Rank 1 of 2, alone: inside the block, no collective runs and the loss is one rank's.
        m = tiny()
        rows = tiny_model.tokens(m, BATCH, SEQ)
        net: Any = tiny_model.build(m)
        enable(net, ContextParallel(None, 1, 2))
        want = CausalLmLoss(tiny_model.build(m), 64)(rows[:, :-1], rows[:, 1:])
        with whole_sequences(net):
            self.assertEqual(net.config._attn_implementation, "sdpa")
            loss = CausalLmLoss(net, 64)(rows[:, :-1], rows[:, 1:])
        self.assertTrue(torch.equal(loss, want))
        self.assertEqual(net.config._attn_implementation, "zflow_cp")

    def test_chunks_and_positions(self) -> None:
        cp = ContextParallel(None, 1, 4)
        self.assertEqual(cp.chunk(torch.arange(32)[None]).tolist(), [list(range(8, 16))])
        self.assertEqual(cp.positions(8, torch.device("cpu")).tolist(), [list(range(8, 16))])
        with self.assertRaisesRegex(ValueError, "30 does not split into 4"):
            cp.chunk(torch.zeros(1, 30))

    def test_a_chunk_shorter_than_the_halo_is_refused(self) -> None:
        # The convolutions look back 4 tokens; a chunk of 2 cannot lend them. The check comes
        # before the first collective, so no process group is needed.
        m = tiny()
        net = tiny_model.build(m)
        enable(net, ContextParallel(None, 1, 2))
        with self.assertRaisesRegex(ValueError, "chunk of 2 tokens is shorter than the 4-token"):
            net(input_ids=torch.zeros(1, 2, dtype=torch.long))


if __name__ == "__main__":
    unittest.main()
