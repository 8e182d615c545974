"""bf16 gradient reduction with f32 sums (``zflow_torch.reduce``) on 3 gloo ranks, through
DistributedDataParallel as the trainer wraps its model: every rank ends with the same
gradients, equal bit for bit to the rule computed on one process, and near f32's mean."""

import tempfile
import time
import unittest
from pathlib import Path

import gloo_ranks
import torch
import torch.distributed as dist
from torch import nn

from zflow_torch import reduce

WORLD = 3  # odd: a bucket's length is no multiple of it, so the last share is padded
DEADLINE_S = 120.0


def model() -> nn.Module:
    torch.manual_seed(0)
    # 7 x 13 + 13 + 13 x 5 + 5 = 174 elements, in several small buckets.
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5))


def bf16_mean_in_f32(grads: list[torch.Tensor]) -> torch.Tensor:
    """What ``reduce.bf16_mean_in_f32`` should give for the ranks' gradients ``grads``,
    computed on one process: each rounded to bf16, summed in f32, the mean rounded to bf16."""
    total = torch.stack([g.to(torch.bfloat16).float() for g in grads]).sum(dim=0)
    return total.div_(len(grads)).to(torch.bfloat16).float()


def local_grads(rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s own gradients, with no communication."""
    net = model()
    inputs = torch.randn(4, 7, generator=torch.Generator().manual_seed(rank))
    net(inputs).square().sum().backward()
    return [p.grad.clone() for p in net.parameters() if p.grad is not None]


def run_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    gloo_ranks.join(rank, port, WORLD)
    ddp = nn.parallel.DistributedDataParallel(
        model(), bucket_cap_mb=0.0002, gradient_as_bucket_view=True
    )
    ddp.register_comm_hook(None, reduce.bf16_mean_in_f32)
    inputs = torch.randn(4, 7, generator=torch.Generator().manual_seed(rank))
    ddp(inputs).square().sum().backward()
    torch.save([p.grad for p in ddp.parameters()], Path(out) / f"{rank}.pt")
    dist.destroy_process_group()


class Bf16Reduction(unittest.TestCase):
    def test_three_ranks_get_the_f32_sum_of_their_bf16_gradients(self) -> None:
        torch.set_num_threads(1)
        each = [local_grads(r) for r in range(WORLD)]
        want = [bf16_mean_in_f32([g[i] for g in each]) for i in range(len(each[0]))]
        f32_mean = [torch.stack([g[i] for g in each]).mean(0) for i in range(len(each[0]))]
        with tempfile.TemporaryDirectory() as out:
            gloo_ranks.run(self, run_rank, WORLD, out, time.monotonic() + DEADLINE_S)
            for r in range(WORLD):
                got = torch.load(Path(out) / f"{r}.pt")
                self.assertEqual(len(got), len(want))
                for i, (g, w, m) in enumerate(zip(got, want, f32_mean, strict=True)):
                    self.assertEqual(g.dtype, torch.float32)
                    torch.testing.assert_close(g, w, rtol=0.0, atol=0.0)
                    # bf16's rounding of each rank's gradient (2^-9 of it) and of the mean:
                    # near f32's mean, to a fraction of the largest gradient summed.
                    largest = max(float(e[i].abs().max()) for e in each)
                    torch.testing.assert_close(g, m, rtol=2**-8, atol=2**-8 * largest)


if __name__ == "__main__":
    unittest.main()
