"""The torch engine's hot paths, timed through its own code, for ``zflow bench``:

- ``python -m zflow_torch.bench train CONFIG_JSON`` (``zflow bench train``, ``zflow bench
  step``): the worker's training step, ``Trainer.train_step`` (forward, backward, clipping,
  Muon + AdamW), on random tokens: the real worker's step, without the data plane and
  checkpoints. The config may set ``activation_checkpointing``, ``loss: full`` (the plain
  ``cross_entropy`` of the whole micro-batch's logits instead of the engine's chunks) and
  ``optimizer`` for the matrices (``muon``, the engine's as the settings say; ``muon-f32`` and
  ``muon-bf16``, the engine's with Newton-Schulz in that format; ``torch-muon``,
  torch.optim.Muon as shipped; ``adamw``). Prints
  ``step_s`` (the best of the timed steps), ``tokens_per_s``, ``torch``, and the step's memory:
  ``peak_bytes``, the process's peak resident set during the timed steps above
  ``baseline_bytes``, its size after the warm-up step (the model and the optimizer's state
  resident; the gradients are freed between steps).
- ``python -m zflow_torch.bench interleaved CONFIG_JSON`` (``zflow bench step``'s times): the
  step of several variants of ``train``'s settings, built side by side in one process and
  stepped in turn, ``steps`` times each, every other round in reverse order (so it holds every
  variant's model at once: 2.5 GB for the nano model at 16 x 256 tokens); prints each
  variant's step times.
- ``python -m zflow_torch.bench memory CONFIG_JSON`` (``zflow bench memory``): the peak memory
  of the worker's training, set-up included, against what ``zflow size`` predicts: the
  process's peak resident set from the model's first allocation to the end of ``steps`` steps
  (the optimizer's state made in the first), above its size before (``peak_bytes``). The
  initial weights' random draws, which run once per phase and before any step, are left out
  (the peak restarts after them).
- ``python -m zflow_torch.bench checkpoint CONFIG_JSON`` (``zflow bench checkpoint``): the
  worker's checkpoint of that model after one step (``Trainer.snapshot`` into host memory,
  then ``checkpoint.commit``: files, fsync, BLAKE3, manifest, rename; best of 3), and the step
  time without checkpoints, with one every ``every`` steps written in the background (as
  training does) and written inline, each the median over ``rounds`` alternating rounds that
  start from the same state. Prints ``bytes``, ``snapshot_s``, ``write_s``, ``plain_s``,
  ``background_s``, ``inline_s`` (and each mode's ``*_rounds_s``).

- ``python -m zflow_torch.bench gpu CONFIG_JSON`` (``scripts/gpu_check.sh``): the worker's step
  on GPU 0 (bf16 autocast, f32 master weights, SDPA), for a ZAYA1-shaped model, with the
  config's ``activation_checkpointing`` and ``loss`` as for ``train``; prints
  ``tokens_per_s``, ``mfu`` against ``peak_tflops`` (the GPU's dense bf16 peak, from the
  config) and ``peak_memory_gb``.

``zflow bench`` writes the config: the model, the training settings, batch, sequence length,
steps, threads (and for ``checkpoint`` the scratch folder, ``every`` and ``rounds``).
"""

import copy
import functools
import io
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zflow_torch import checkpoint, model, trainer
from zflow_torch.contract import JOB_VERSION, RANK, RENDEZVOUS, SECRET, WORLD, Emitter
from zflow_torch.distributed import join_group
from zflow_torch.job import ModelConfig, TrainJob, decode
from zflow_torch.mixture import DataCursor
from zflow_torch.optim import BatchedMuon


def _trainer(cfg: dict[str, Any], checkpoints: str, backend: str = "cpu") -> trainer.Trainer:
    batch = cfg["batch"]
    ranks = int(cfg.get("ranks", 1)) // int(cfg.get("context_parallel", 1))
    torch.set_num_threads(cfg["threads"])
    raw = {
        "version": JOB_VERSION,
        "phase": "bench",
        "model": cfg["model"],
        # Every data-parallel group reads `batch` sequences per step.
        "train": {**cfg["train"], "global_batch": batch * ranks, "micro_batch": batch},
        "mixture": "",
        "sources": [],
        "checkpoints": checkpoints,
        "init": None,
        "activation_checkpointing": cfg.get("activation_checkpointing", "none"),
        "context_parallel": int(cfg.get("context_parallel", 1)),
    }
    job = decode(TrainJob, raw, "bench config")
    t = trainer.Trainer(job, backend, Emitter(io.StringIO()))
    t.seq_len = cfg["seq_len"]
    t.build_model()
    with torch.no_grad():
        model.initialise(t.net, job.model, job.train.seed)
    t.new_optimizers()
    m = job.model
    model.set_biases(t.net, [[0.0] * m.num_experts + [-1.0]] * m.num_blocks)
    if cfg.get("loss") == "full":
        t.ddp = FullLogitsLoss(t.net)
    matrices = [p for tensor, p in t.mine if tensor.linear]
    if cfg.get("optimizer") == "torch-muon":
        t.muon = torch.optim.Muon(matrices, **t.muon_settings())
    elif cfg.get("optimizer") == "muon-f32":
        t.muon = BatchedMuon(matrices, "f32", **t.muon_settings())
    elif cfg.get("optimizer") == "muon-bf16":
        t.muon = BatchedMuon(matrices, "bf16", **t.muon_settings())
    elif cfg.get("optimizer") == "adamw":
        aw = job.train.adamw
        t.muon = torch.optim.AdamW(
            matrices, lr=0.0, betas=(aw.beta1, aw.beta2), eps=aw.eps, weight_decay=aw.weight_decay
        )
    return t


class FullLogitsLoss(torch.nn.Module):
    """The loss as plain transformers computes it: the whole micro-batch's logits, then one
    ``cross_entropy`` (the alternative ``loss.CausalLmLoss`` is measured against)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.net(input_ids=inputs).logits
        return torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        )


def _status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Starts this process's peak resident set (VmHWM) again from its current size (Linux's
    ``clear_refs`` 5), so that a peak is the step's, not the model's initialisation's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _stepper(t: trainer.Trainer, cfg: dict[str, Any]) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)
    batch, seq_len, vocab = cfg["batch"], cfg["seq_len"], t.model_config.vocab_size

    def step() -> None:
        rows = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(t.device)
        # This rank's part of each sequence (all of it without context parallelism).
        t.train_step([(t.cp.chunk(rows[:, :-1]), t.cp.chunk(rows[:, 1:]))], 1e-3)

    return step


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        t = _trainer(cfg, d)
        step = _stepper(t, cfg)
        step()  # warm-up: allocation, first-call costs, the optimizer's state
        _reset_peak()
        baseline = _status_bytes("VmRSS")
        times = []
        for _ in range(cfg["steps"]):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
    # The best step, as `zflow bench train` reports every side's.
    step_s = min(times)
    tokens = cfg["batch"] * cfg["seq_len"]
    return {
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "torch": torch.__version__,
        "peak_bytes": _status_bytes("VmHWM") - baseline,
        "baseline_bytes": baseline,
    }


def interleaved(cfg: dict[str, Any]) -> dict[str, Any]:
    """The step time of every variant in ``cfg["variants"]`` (each a label and the
    ``activation_checkpointing``, ``loss`` and ``optimizer`` that ``train`` takes), measured in
    one process in turn: after a warm-up step each, ``steps`` rounds of one step of every variant,
    every other round in reverse order (so that neighbours in the list step next to each other,
    each first as often as the other). So a change in the machine's speed, which on a shared
    machine moves a step by 10-25% from one minute to the next, reaches every variant alike. Per
    variant: each round's step (``rounds_s``), of which ``zflow bench step`` makes its figures."""
    with tempfile.TemporaryDirectory() as d:
        runs = []
        for variant in cfg["variants"]:
            vcfg = {**cfg, **variant}
            t = _trainer(vcfg, d)
            runs.append((variant["label"], _stepper(t, vcfg)))
        for _, step in runs:
            step()  # warm-up: allocation, first-call costs, the optimizer's state
        times: dict[str, list[float]] = {label: [] for label, _ in runs}
        for turn in range(cfg["steps"]):
            for label, step in runs if turn % 2 == 0 else runs[::-1]:
                started = time.perf_counter()
                step()
                times[label].append(time.perf_counter() - started)
    return {
        "torch": torch.__version__,
        "variants": [{"label": label, "rounds_s": ts} for label, ts in times.items()],
    }


def memory(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """Runs ``cfg["ranks"]`` processes of ``memory-rank`` (a process group on loopback when
    more than one) and returns the largest rank's peak.

    glibc keeps freed blocks for reuse and lifts its mmap threshold as large blocks are freed, so
    a CPU process's resident size follows what it once held, not what it holds. The ranks run
    with a fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_``), which returns every freed tensor to
    the system: their peak is then the peak of live memory that ``zflow size`` predicts."""
    ranks = int(cfg.get("ranks", 1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        WORLD: str(ranks),
        RENDEZVOUS: f"127.0.0.1:{port}",
        SECRET: secrets.token_hex(16),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "zflow_torch.bench", "memory-rank", path],
            env={**env, RANK: str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a memory-rank process failed with exit status {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return max(results, key=lambda r: int(r["peak_bytes"]))


def memory_rank(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of ``memory``: its peak resident set from before the model is built to the end
    of ``steps`` steps, above its size before."""
    rank, world = int(os.environ.get(RANK, "0")), int(os.environ.get(WORLD, "1"))
    if world > 1:
        join_group(rank, world, torch.device("cpu"))
    baseline = _status_bytes("VmRSS")
    with tempfile.TemporaryDirectory() as d:
        t = _trainer(cfg, d)
        _reset_peak()
        step = _stepper(t, cfg)
        for _ in range(cfg["steps"]):
            step()
        peak = _status_bytes("VmHWM") - baseline
    return {
        "rank": rank,
        "peak_bytes": peak,
        "baseline_bytes": baseline,
        "torch": torch.__version__,
    }


def checkpoints(cfg: dict[str, Any]) -> dict[str, Any]:
    root = Path(cfg["dir"])
    t = _trainer(cfg, str(root / "unused"))
    step = _stepper(t, cfg)
    step()
    t.total_steps = 0
    state = t.fresh_state(DataCursor("bench", 0, ""))
    started = time.perf_counter()
    files = t.snapshot(state)
    snapshot_s = time.perf_counter() - started
    write_s = float("inf")
    io_dir = root / "io"
    for i in range(3):
        started = time.perf_counter()
        checkpoint.commit(io_dir, i, 0, 1, files)
        write_s = min(write_s, time.perf_counter() - started)
        checkpoint.retain(io_dir, 1)

    # Every mode starts from the same state and trains on the same batches, so the modes
    # differ only by their checkpoints; the modes alternate over rounds, each round in a rotated
    # order, because a step's time drifts by 10-20% on a shared machine over a minute.
    start = copy.deepcopy((t.net.state_dict(), [o.state_dict() for _, o in t.optimizers()]))
    steps: int = cfg["steps"]

    def run(mode: str) -> float:
        net, optimizers = copy.deepcopy(start)
        t.net.load_state_dict(net)
        for (_, o), s in zip(t.optimizers(), optimizers, strict=True):
            o.load_state_dict(s)
        step = _stepper(t, cfg)
        out = root / mode
        saver = checkpoint.Saver(asynchronous=mode == "background")
        started = time.perf_counter()
        for i in range(1, steps + 1):
            step()
            if mode != "plain" and i % cfg["every"] == 0:
                snapshot = t.snapshot(state)
                saver.save(functools.partial(_commit, out, i, snapshot), wait=False)
        saver.wait()
        return (time.perf_counter() - started) / steps

    modes = ["plain", "background", "inline"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(cfg["rounds"]):
        for mode in modes[r % 3 :] + modes[: r % 3]:
            times[mode].append(run(mode))
    return {
        "bytes": sum(len(b) for _, b in files),
        "snapshot_s": snapshot_s,
        "write_s": write_s,
        **{f"{m}_s": statistics.median(ts) for m, ts in times.items()},
        **{f"{m}_rounds_s": ts for m, ts in times.items()},
    }


def flops_per_token(m: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward, 2 per multiply-add) of the
    parameters a token uses (attention, router, one expert, the tied head) and of causal
    attention's scores and weighted sums."""
    h, d, f = m.hidden_size, m.router_dim, m.expert_ffn
    lq, lk = m.num_query_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = h * lq + h * lk + h * lk + lq * h
    router = h * d + 2 * d * d + d * (m.num_experts + 1)
    expert = h * 2 * f + f * h
    per_layer = attention + router + expert
    matmul = 6.0 * (m.num_blocks * per_layer + h * m.vocab_size)
    scores = 6.0 * m.num_blocks * seq_len * lq  # QK^T and AV, half of them under the mask
    return float(matmul + scores)


def gpu(cfg: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        t = _trainer(cfg, d, backend=cfg.get("backend", "cuda"))
        step = _stepper(t, cfg)
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(cfg["steps"]):
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    step_s = sorted(times)[len(times) // 2]
    tokens_per_s = cfg["batch"] * cfg["seq_len"] / step_s
    flops = flops_per_token(decode(ModelConfig, cfg["model"]), cfg["seq_len"])
    return {
        "device": torch.cuda.get_device_name(0),
        "activation_checkpointing": cfg.get("activation_checkpointing", "none"),
        "loss": cfg.get("loss", "chunked"),
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "model_tflops": tokens_per_s * flops / 1e12,
        "mfu": tokens_per_s * flops / (cfg["peak_tflops"] * 1e12),
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
        "params": sum(p.numel() for p in t.net.parameters()),
    }


def _commit(root: Path, step: int, files: list[tuple[str, bytes]]) -> None:
    checkpoint.commit(root, step, 0, 1, files)
    checkpoint.retain(root, 1)


def main(argv: list[str]) -> None:
    what, path = argv
    with open(path) as f:
        cfg = json.load(f)
    if what == "memory":
        result = memory(cfg, path)
    else:
        result = {
            "train": train,
            "interleaved": interleaved,
            "checkpoint": checkpoints,
            "gpu": gpu,
            "memory-rank": memory_rank,
        }[what](cfg)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
