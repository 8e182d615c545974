"""The MoE layer's expert paths (``model.EXPERT_PATHS``: ``loop``, ``grouped``, ``padded``,
``padded_max``; see ``zflow_torch.model``) timed against each other on one ``RoutedMoe`` layer,
for ``zflow bench experts``.

``python -m zflow_torch.experts_bench [CONFIG_JSON]`` reads the config from the file named, or
from stdin without one, and prints one JSON object on stdout; ``run(cfg)`` is the same in
Python.

The layer is block 0 of ``model.build`` for a one-block ZAYA1 of the config's sizes (a small
attention and vocabulary, unused), with zflow's initial weights for ``seed``, all routing
biases 0 but the skip route's, ``skip_bias``. Each step is the layer's forward and backward on
the same ``[1, tokens, hidden]`` random input (a random output gradient; every parameter's
gradient dropped after the step, as the optimizer's ``zero_grad`` does). Every path is first
checked against ``loop`` (its output, the input's and every parameter's gradients) and warmed
up; then the paths alternate, ``rounds`` rounds of ``steps`` steps each, each round in a
rotated order (a step's time drifts on a shared machine).

Config (a JSON object):

- ``hidden``, ``expert_ffn``, ``num_experts``, ``tokens`` (ints): the layer's sizes and the
  tokens of one micro-batch through it. Required.
- ``device``: ``"cpu"`` (default) or ``"cuda"`` (GPU 0).
- ``dtype``: ``"float32"`` (default) or ``"bfloat16"``: bf16 autocast over f32 parameters,
  as the worker trains on CUDA.
- ``rounds`` (default 3), ``steps`` (steps per round, default 3).
- ``paths``: the paths to run (default all; ``loop`` always runs, as the reference).
- ``router_dim`` (default 256), ``skip_output`` (``"zero"``, the default, or ``"input"``),
  ``skip_bias`` (the skip route's balancing bias, default -1.0: about no token skips, as
  ``zflow bench train`` sets it), ``seed`` (default 0), ``threads`` (CPU threads; default
  torch's), ``tolerance`` (the largest ``max_rel_err`` that is ``ok``; default 1e-4 for
  float32, 3e-2 for bfloat16).

Output (a JSON object):

- ``device``: the CPU or GPU's name; ``torch``: torch's version; ``config``: the config with
  its defaults filled in; ``counts``: the tokens per route (experts, then skip) of the input.
- ``paths``: one object per path, in ``model.EXPERT_PATHS``' order: ``name``; ``ok`` (ran, and
  matches ``loop`` within ``tolerance``); ``max_rel_err`` (over the output and every
  gradient, the largest of ``max |x - x_loop| / max |x_loop|``; 0 for ``loop``); ``bitwise``
  (every one of them bit-identical to ``loop``'s); ``seconds_per_step`` (the median over the
  rounds of a round's mean step), ``best_seconds_per_step`` (the fastest round's),
  ``rounds_s`` (every round's), ``tokens_per_s`` (``tokens / seconds_per_step``);
  ``host_syncs`` (CUDA: the host syncs torch reported in one step, under
  ``torch.cuda.set_sync_debug_mode("warn")``; null on the CPU); ``peak_memory_bytes``
  (CUDA: the allocator's peak in one step above what was allocated before it; null on the
  CPU). A path that cannot run here (``_grouped_mm`` missing, or refusing the device or dtype)
  has ``ok: false`` and ``error`` (the exception's text) instead of the measurements.
- ``fastest``: the ``ok`` path with the least ``seconds_per_step`` (null if none).
"""

import json
import platform
import statistics
import sys
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from zflow_torch import model
from zflow_torch.job import ModelConfig

DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "dtype": "float32",
    "rounds": 3,
    "steps": 3,
    "paths": list(model.EXPERT_PATHS),
    "router_dim": 256,
    "skip_output": "zero",
    "skip_bias": -1.0,
    "seed": 0,
    "threads": None,
    "tolerance": None,
}
DTYPES = ("float32", "bfloat16")


def layer_config(cfg: dict[str, Any]) -> ModelConfig:
    """A one-block ZAYA1 of the config's MoE sizes; its attention and vocabulary are small."""
    return ModelConfig(
        hidden_size=cfg["hidden"],
        num_blocks=1,
        vocab_size=256,
        num_query_heads=2,
        num_kv_heads=1,
        head_dim=32,
        conv_kernel=2,
        rope_fraction=0.5,
        rope_base=10000.0,
        num_experts=cfg["num_experts"],
        top_k=1,
        expert_ffn=cfg["expert_ffn"],
        mod_skip=True,
        skip_output=cfg["skip_output"],
        router_dim=cfg["router_dim"],
        router_mlp_layers=3,
        eda=True,
        residual_scaling=True,
        tie_embeddings=True,
        rms_norm_eps=1e-5,
        sliding_blocks=[],
        sliding_window=4096,
        sliding_rope_base=10000.0,
    )


class Layer:
    """The layer, its input and output gradient, and one timed step."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.device = torch.device(cfg["device"])
        self.bf16 = cfg["dtype"] == "bfloat16"
        m = layer_config(cfg)
        net: Any = model.build(m, cfg["seed"])
        model.set_biases(net, [[0.0] * m.num_experts + [cfg["skip_bias"]]])
        self.moe: model.RoutedMoe = net.model.layers[0].mlp.to(self.device)
        gen = torch.Generator().manual_seed(cfg["seed"])
        shape = (1, cfg["tokens"], cfg["hidden"])
        self.x = torch.randn(shape, generator=gen).to(self.device).requires_grad_()
        self.grad_out = torch.randn(shape, generator=gen).to(self.device)

    def autocast(self) -> AbstractContextManager[Any]:
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def step(self, path: str) -> list[torch.Tensor]:
        """One forward and backward on ``path``: the output, the input's gradient and every
        parameter's, after which the gradients are dropped."""
        self.moe.expert_path = path
        with self.autocast():
            out, _ = self.moe(self.x, None)
        torch.autograd.backward(out, self.grad_out.to(out.dtype))
        grads = [self.x.grad, *(p.grad for p in self.moe.parameters())]
        self.x.grad = None
        self.moe.zero_grad(set_to_none=True)
        return [out.detach(), *(g if g is not None else torch.zeros(0) for g in grads)]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, path: str, steps: int) -> float:
        """The mean seconds of ``steps`` steps."""
        self.sync()
        started = time.perf_counter()
        for _ in range(steps):
            self.step(path)
        self.sync()
        return (time.perf_counter() - started) / steps

    def host_syncs(self, path: str) -> int | None:
        if self.device.type != "cuda":
            return None
        self.sync()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                self.step(path)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    def peak_memory(self, path: str) -> int | None:
        if self.device.type != "cuda":
            return None
        self.sync()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.step(path)
        self.sync()
        return int(torch.cuda.max_memory_allocated(self.device) - before)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    err = (a.double() - b.double()).abs().max().item()
    return err / scale if scale > 0 else err


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config with its defaults, checked."""
    full = {**DEFAULTS, **cfg}
    for field in ("hidden", "expert_ffn", "num_experts", "tokens"):
        if not isinstance(full.get(field), int) or full[field] <= 0:
            raise ValueError(f"experts bench config: `{field}` must be a positive integer")
    if full["dtype"] not in DTYPES:
        raise ValueError(f"experts bench config: dtype `{full['dtype']}`: expected {DTYPES}")
    unknown = [p for p in full["paths"] if p not in model.EXPERT_PATHS]
    if unknown:
        raise ValueError(f"experts bench config: unknown paths {unknown}")
    if full["tolerance"] is None:
        full["tolerance"] = 3e-2 if full["dtype"] == "bfloat16" else 1e-4
    return full


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = settings(cfg)
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    layer = Layer(cfg)
    wanted = [p for p in model.EXPERT_PATHS if p == "loop" or p in cfg["paths"]]
    reference = layer.step("loop")
    counts = layer.moe.counts
    assert counts is not None
    results: dict[str, dict[str, Any]] = {}
    for path in wanted:
        result: dict[str, Any] = {"name": path}
        results[path] = result
        try:
            if path == "grouped" and not model.grouped_mm_available():
                raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
            got = layer.step(path)  # the check, and the warm-up
            errors = [relative_error(a, b) for a, b in zip(got, reference, strict=True)]
            result["max_rel_err"] = max(errors)
            result["bitwise"] = all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
            result["ok"] = result["max_rel_err"] <= cfg["tolerance"]
            result["host_syncs"] = layer.host_syncs(path)
            result["peak_memory_bytes"] = layer.peak_memory(path)
            result["rounds_s"] = []
        except Exception as e:  # any refusal (no kernel for this device or dtype) is the result
            result.update(ok=False, error=f"{type(e).__name__}: {e}")
    timed = [p for p in wanted if "rounds_s" in results[p]]
    for r in range(cfg["rounds"]):
        shift = r % len(timed) if timed else 0
        for path in timed[shift:] + timed[:shift]:
            results[path]["rounds_s"].append(layer.timed(path, cfg["steps"]))
    for path in timed:
        rounds = results[path]["rounds_s"]
        if rounds:
            step_s = statistics.median(rounds)
            results[path]["seconds_per_step"] = step_s
            results[path]["best_seconds_per_step"] = min(rounds)
            results[path]["tokens_per_s"] = cfg["tokens"] / step_s
    ok = [p for p in timed if results[p]["ok"] and "seconds_per_step" in results[p]]
    fastest = min(ok, key=lambda p: results[p]["seconds_per_step"]) if ok else None
    return {
        "device": device_name(cfg["device"]),
        "torch": torch.__version__,
        "config": cfg,
        "counts": counts.tolist(),
        "paths": [results[p] for p in wanted],
        "fastest": fastest,
    }


def main(argv: list[str]) -> None:
    if argv:
        with open(argv[0]) as f:
            cfg = json.load(f)
    else:
        cfg = json.load(sys.stdin)
    print(json.dumps(run(cfg)))


if __name__ == "__main__":
    main(sys.argv[1:])
