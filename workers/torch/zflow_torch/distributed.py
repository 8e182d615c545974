"""The rank's place in the launch: its device (``device_for``), the process group it joins at
zflow's rendezvous, proving the launch secret both ways before any collective runs
(``join_group``; SECURITY.md), and the preflight probes of its device (``probe``) and of the
network (``allreduce_busbw``, ``link_bandwidths``)."""

import functools
import hmac
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import blake3
import torch
import torch.distributed as dist

from zflow_torch.contract import (
    COLLECTIVE_TIMEOUT_S,
    DEVICE,
    LOCAL_RANK,
    LOCAL_WORLD,
    RENDEZVOUS,
    SECRET,
    STORE_TIMEOUT_S,
    Fatal,
    Probe,
)


def device_for(backend: str, index: int) -> torch.device:
    """The torch device of ``backend`` (ROCm builds of PyTorch call their GPUs ``cuda``)."""
    if backend == "cpu":
        return torch.device("cpu")
    if backend not in ("cuda", "rocm"):
        raise Fatal(f"unknown backend `{backend}` (expected cpu, cuda or rocm)")
    if backend == "rocm" and torch.version.hip is None:
        raise Fatal("backend rocm, but this PyTorch is not a ROCm build (see ZFLOW_TORCH_PYTHON)")
    if backend == "cuda" and torch.version.cuda is None:
        raise Fatal("backend cuda, but this PyTorch has no CUDA")
    if not torch.cuda.is_available():
        raise Fatal(f"backend {backend}: no GPU is visible to PyTorch")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class KeyValues(Protocol):
    """What the launch's store (torch's TCPStore) offers the rendezvous code."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...


def device_index() -> int:
    """The GPU this rank binds, among those visible to it: ``ZFLOW_DEVICE``, which the
    supervisor sets for every rank (stages/src/launch.rs); 0 for a worker started alone."""
    return int(os.environ.get(DEVICE, "0"))


def ranks_per_node(world: int) -> int:
    """The ranks on each of the launch's nodes: ``LOCAL_WORLD_SIZE``, which the supervisor sets
    for every rank (stages/src/launch.rs); all of them for a worker started alone."""
    return int(os.environ.get(LOCAL_WORLD, str(world)))


def device_identity(device: torch.device) -> str:
    """What tells one physical GPU from another across processes: its UUID (two ranks that
    see different visible-device lists may call the same GPU by different indices)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def shared_devices(places: list[tuple[str, str]], first_rank: int = 0) -> str | None:
    """The first (host, device) that two ranks of ``places`` (one per rank, in rank order from
    ``first_rank``) share, described, or None when every rank has its own."""
    first: dict[tuple[str, str], int] = {}
    for rank, place in enumerate(places, start=first_rank):
        if place in first:
            host, device = place
            return f"ranks {first[place]} and {rank} both bound device {device} on host {host}"
        first[place] = rank
    return None


def check_own_device(
    store: KeyValues, rank: int, local_rank: int, local_world: int, device: str
) -> None:
    """Every rank of a node on a GPU of its own: each rank posts its host and ``device`` (its
    ``device_identity``) to the launch's store, before any collective (NCCL would stop on a
    shared GPU with its own, less telling error), and the node's first rank reads its node's
    ``local_world`` ranks and stops with a fatal error naming two that share one (a wrong
    ``CUDA_VISIBLE_DEVICES``, a Slurm step without its own GPU). A GPU belongs to one host, so
    the check is per node: one store operation per rank, ``local_world + 1`` for the node's
    first, whatever the world."""
    store.set(f"zflow/device/{rank}", f"{socket.gethostname()}\n{device}")
    if local_rank != 0:
        return
    places = []
    for r in range(rank, rank + local_world):
        host, _, ident = store.get(f"zflow/device/{r}").decode().partition("\n")
        places.append((host, ident))
    shared = shared_devices(places, rank)
    if shared:
        raise Fatal(f"{shared}: every rank needs a device of its own")


def describe(device: torch.device) -> str:
    """The device and the stack under it, for the run record: on GPUs the HIP or CUDA version
    and the RCCL or NCCL that torch.distributed runs on."""
    if device.type == "cpu":
        return f"torch {torch.__version__} cpu ({torch.get_num_threads()} threads)"
    collectives = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    if torch.version.hip:
        stack = f"HIP {torch.version.hip}, RCCL {collectives}"
    else:
        stack = f"CUDA {torch.version.cuda}, NCCL {collectives}"
    return f"torch {torch.__version__} {torch.cuda.get_device_name(device)} ({stack})"


# Rank 0's listening sockets, kept open for its store.
_LISTENERS: list[socket.socket] = []


def _mac(key: bytes, *parts: str) -> str:
    return blake3.blake3("\n".join(parts).encode(), key=key).hexdigest()


def timeout(variable: str) -> timedelta:
    """A timeout the supervisor sets for every rank (``train.launch``'s store and collective
    timeouts, resolved for the launch's world); 300 s for a worker started alone."""
    return timedelta(seconds=float(os.environ.get(variable, "300")))


def prove_secret(store: KeyValues, rank: int, world: int, key: bytes) -> None:
    """Proves, both ways, that every rank holds the launch secret, with O(1) store operations
    per rank: rank 0 posts a fresh challenge; each rank posts its nonce with a keyed BLAKE3 MAC
    of the challenge, checks the MAC of the rank after it in the ring and answers that rank's
    nonce; then it checks the answer to its own. So every rank is checked by a rank that
    holds the secret, and checks one. A rank that fails a check ends with a fatal error, which
    ends the launch."""
    if rank == 0:
        store.set("zflow/challenge", secrets.token_hex(16))
    challenge = store.get("zflow/challenge").decode()
    nonce = secrets.token_hex(16)
    store.set(f"zflow/proof/{rank}", f"{nonce}:{_mac(key, 'rank', challenge, nonce, str(rank))}")
    if world > 1:
        peer = (rank + 1) % world
        their_nonce, _, proof = store.get(f"zflow/proof/{peer}").decode().partition(":")
        if not hmac.compare_digest(proof, _mac(key, "rank", challenge, their_nonce, str(peer))):
            raise Fatal(f"rank {peer} did not prove the launch secret; refusing it")
        store.set(f"zflow/answer/{peer}", _mac(key, "peer", challenge, their_nonce, str(peer)))
        before = (rank - 1) % world
        answer = store.get(f"zflow/answer/{rank}").decode()
        if not hmac.compare_digest(answer, _mac(key, "peer", challenge, nonce, str(rank))):
            raise Fatal(f"rank {before} did not prove the launch secret; refusing it")


def join_group(rank: int, world: int, device: torch.device) -> None:
    """Joins the launch's process group at zflow's rendezvous (rank 0 serves the store there),
    after every rank has proved that it holds the launch secret (``prove_secret``) and, on
    GPUs, that each rank of a node has a device of its own (``check_own_device``). The store
    and the process group take the launch's two timeouts (``timeout``)."""
    host, _, port = os.environ[RENDEZVOUS].rpartition(":")
    if host in ("127.0.0.1", "localhost", "::1"):
        # Gloo's own connections stay on loopback, like the store's clients.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world))
    key = blake3.blake3(os.environ[SECRET].encode()).digest()
    store_timeout = timeout(STORE_TIMEOUT_S)
    store_type: Any = dist.TCPStore  # type: ignore[attr-defined]
    if rank == 0:
        # The store listens on the rendezvous address only (loopback for a launch on one
        # machine), not on every interface as TCPStore's own listener would. Its backlog holds
        # every rank's connection at once: at the default (128), a thousand ranks arriving
        # together lose SYNs and retry seconds later.
        listener = socket.create_server((host, int(port)), backlog=min(world, 4096))
        _LISTENERS.append(listener)
        store = store_type(
            host,
            int(port),
            world,
            is_master=True,
            timeout=store_timeout,
            master_listen_fd=listener.fileno(),
            use_libuv=True,
        )
    else:
        store = store_type(host, int(port), world, is_master=False, timeout=store_timeout)
    prove_secret(store, rank, world, key)
    if device.type != "cpu":
        local_rank = int(os.environ.get(LOCAL_RANK, "0"))
        check_own_device(store, rank, local_rank, ranks_per_node(world), device_identity(device))
    dist_backend = "gloo" if device.type == "cpu" else "nccl"
    dist.init_process_group(
        dist_backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=timeout(COLLECTIVE_TIMEOUT_S),
    )


# The GEMM a GPU probe times when the caller names none: ZAYA1's expert up-projection over a
# 4096-token micro-batch (tokens x hidden @ hidden x 2 x expert width).
ZAYA1_GEMM = (4096, 2048, 4096)


# The matmul the CPU probe times in f32 and in bf16 (m, k, n): the nano recipe's square
# matrices, whose Newton-Schulz iterations are the CPU's bf16 work. Small enough that a CPU
# without bf16 units (~1.6 GFLOP/s there) spends ~80 ms on it.
CPU_DTYPE_GEMM = (256, 256, 256)


def probe(
    device: torch.device, slow_ms: int, gemm_shape: tuple[int, int, int] = ZAYA1_GEMM
) -> Probe:
    """The device's figures (``runtime/src/dist/preflight.rs``), each the best of 3.
    On a GPU: a GEMM of ``gemm_shape`` (m, k, n: the model's own tokens per micro-batch,
    hidden size and expert width) in bf16 (the figure ranks are compared on) and in f32, and a
    copy of 1 GiB of device memory. On the CPU, where only an outlier matters: a 512^2 f32
    matmul, an add of 4M floats (read two, write one), and ``CPU_DTYPE_GEMM`` in f32 and in
    bf16 on one thread (bf16 is fast only with AMX or AVX512-BF16 units)."""

    def best_of(f: Callable[[], object]) -> float:
        f()
        best = math.inf
        for _ in range(3):
            t = time.perf_counter()
            f()
            if device.type == "cuda":
                torch.cuda.synchronize()
            time.sleep(slow_ms / 1000)
            best = min(best, time.perf_counter() - t)
        return best

    def gemm_gflops(shape: tuple[int, int, int], dtype: torch.dtype) -> float:
        m, k, n = shape
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        return 2.0 * m * k * n / best_of(lambda: (a @ b)[:1, :1].sum().item()) / 1e9

    if device.type == "cuda":
        bf16 = gemm_gflops(gemm_shape, torch.bfloat16)
        f32 = gemm_gflops(gemm_shape, torch.float32)
        length = 1 << 28
        x, y = torch.empty(length, device=device), torch.empty(length, device=device)
        copy = best_of(lambda: y.copy_(x))
        return Probe(bf16, 2.0 * 4.0 * length / copy / 1e9, f32, bf16)
    gemm = gemm_gflops((512, 512, 512), torch.float32)
    length = 1 << 22
    x, y = torch.rand(length, device=device), torch.rand(length, device=device)
    add = best_of(lambda: (x + y)[:1].item())
    # On one thread: the two formats' ratio is the core's, and a matmul this small on several
    # threads times their waits for each other on a busy machine (f32 came out at 2 GFLOP/s
    # beside a build, below a slow bf16).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        f32 = gemm_gflops(CPU_DTYPE_GEMM, torch.float32)
        bf16 = gemm_gflops(CPU_DTYPE_GEMM, torch.bfloat16)
    finally:
        torch.set_num_threads(threads)
    return Probe(gemm, 3.0 * 4.0 * length / add / 1e9, f32, bf16)


def collective_seconds(device: torch.device, run: Callable[[], object]) -> float:
    """The best of 3 timings of ``run`` on every rank, after a warm-up (connections, buffers),
    each started together behind a barrier and ended once the GPU has finished."""
    best = math.inf
    for i in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            best = min(best, time.perf_counter() - t)
    return best


def allreduce_busbw(device: torch.device) -> float:
    """The launch's all-reduce bus bandwidth, GB/s, as nccl-tests defines it (2 (n - 1) / n x
    bytes / time): a 256 MiB f32 all-reduce on GPUs (4 MiB on the CPU), best of 3. Every rank
    takes part; the slowest link of the job's nodes sets it."""
    world = dist.get_world_size()
    numel = (256 << 20) // 4 if device.type == "cuda" else (4 << 20) // 4
    x = torch.ones(numel, device=device)
    best = collective_seconds(device, lambda: dist.all_reduce(x))
    return 2.0 * (world - 1) / world * numel * 4 / best / 1e9


def ring_partners(rank: int, world: int, per_node: int) -> list[int | None]:
    """This rank's partner in each round of the link probe (``None``: it sits the round out).

    The ring runs over nodes, through the ranks of one local rank (``rank +- per_node``); on one
    node, over the ranks. Its edges are coloured so that no rank has two partners in a round:
    two colours for an even ring, three for an odd one (its last edge gets the third)."""
    nodes = world // per_node
    length, stride = (nodes, per_node) if nodes > 1 else (world, 1)
    position, offset = divmod(rank, stride)
    if length < 2:
        return []
    if length == 2:  # one edge, both ways round the ring
        return [(1 - position) * stride + offset]

    def colour(edge: int) -> int:
        return 2 if length % 2 == 1 and edge == length - 1 else edge % 2

    def rank_at(p: int) -> int:
        return (p % length) * stride + offset

    rounds: list[int | None] = [None, None, None] if length % 2 == 1 else [None, None]
    # Edge e joins positions e and e + 1: this rank's are its own and the one before it.
    rounds[colour(position)] = rank_at(position + 1)
    rounds[colour((position - 1) % length)] = rank_at(position - 1)
    return rounds


def link_bandwidths(device: torch.device, per_node: int, delay_ms: int) -> list[dict[str, Any]]:
    """This rank's exchange with each ring neighbour (``ring_partners``): both send and receive
    64 MiB at once on GPUs (4 MiB on the CPU), best of 3, as GB/s one way; the
    ``LinkProbe``s of ``runtime/src/dist/preflight.rs``. Every rank takes part in every round's
    barrier; ``delay_ms`` is the fault hooks' slow link (zero unless injected)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = (64 << 20) // 4 if device.type == "cuda" else (4 << 20) // 4
    out, into = torch.ones(numel, device=device), torch.empty(numel, device=device)

    def exchange(peer: int) -> None:
        time.sleep(delay_ms / 1000)
        ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    links = []
    for peer in ring_partners(rank, world, per_node):
        if peer is None:  # sits the round out, but keeps to its barriers
            collective_seconds(device, lambda: None)
            continue
        best = collective_seconds(device, functools.partial(exchange, peer))
        links.append({"peer": peer, "gbps": numel * 4 / best / 1e9})
    return links
