"""Gradient reduction in bf16 with f32 sums (``train.grad_reduce_dtype: bf16``): a
DistributedDataParallel communication hook.

DDP's own ``bf16_compress_hook`` all-reduces a bucket in bf16, so the network sums the ranks'
gradients in bf16, and the sum's error grows with the number of ranks. Here the all-reduce is
split into its two halves, with the sum between them done locally in f32:

1. each rank casts its bucket to bf16 and sends rank ``r`` its ``r``-th share
   (``all_to_all_single``: a reduce-scatter that moves the data but sums nothing);
2. each rank sums the ``world`` bf16 copies of its share in f32, in rank order, and divides by
   ``world`` (the mean, as DDP's all-reduce gives);
3. the means go back to every rank in bf16 (``all_gather_into_tensor``) and into the bucket in
   f32.

Half of f32's bytes cross the network, as with bf16's all-reduce; the gradient is rounded to
bf16 twice (before sending, and its mean), never summed in bf16. The collectives move bf16 as
bytes (uint8): they only copy, and every backend copies bytes (gloo has no int16 or bf16
gathers).
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket


def bf16_mean_in_f32(
    group: dist.ProcessGroup | None, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: the bucket's mean over the ranks of ``group``."""
    world = dist.get_world_size(group)
    flat = bucket.buffer()
    n = flat.numel()
    share = -(-n // world)  # ceil: every rank's share the same size, the last one padded
    sent = torch.zeros(world * share, dtype=torch.bfloat16, device=flat.device)
    sent[:n].copy_(flat)
    # Both collectives are issued here, on the thread that calls the hook, in bucket order:
    # the same order on every rank, as collectives need. (Issued from a future's callback, the
    # gather ran on a backend thread, in an order that could differ between ranks: gloo then
    # waited on mismatched messages, and a 16 s test took 316 s under load.)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received.view(torch.uint8), sent.view(torch.uint8), group=group)
    mean = received.view(world, share).float().sum(dim=0).div_(world).to(torch.bfloat16)
    means = torch.empty_like(sent)
    work = dist.all_gather_into_tensor(
        means.view(torch.uint8), mean.view(torch.uint8), group=group, async_op=True
    )
    assert work is not None

    def unpack(_: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        flat.copy_(means[:n])
        out: torch.Tensor = flat
        return out

    return work.get_future().then(unpack)
