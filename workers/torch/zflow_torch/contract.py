"""The worker's side of zflow's engine contract (``runtime/src/contract`` in the Rust tree,
whose ``mod.rs`` is the page): the rank's environment, the JSON lines on stdout, the exit
codes and the train job's version. ``runtime/tests/torch_contract.rs`` checks every name and
number here against the Rust definitions, and parses every message this module writes with
the supervisor's own parser.
"""

import json
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from zflow_torch.job import DecodeError, TrainJob, decode

# A message field: what json.dumps writes (numbers, strings, None, lists and mappings of them).
Json = int | float | str | None | list[Any] | dict[str, Any]

# The environment a rank gets (runtime/src/contract/env.rs).
RANK = "ZFLOW_RANK"
WORLD = "ZFLOW_WORLD"
RENDEZVOUS = "ZFLOW_RENDEZVOUS"
SECRET = "ZFLOW_GROUP_SECRET"
HEARTBEAT_S = "ZFLOW_HEARTBEAT_S"
STORE_TIMEOUT_S = "ZFLOW_STORE_TIMEOUT_S"
COLLECTIVE_TIMEOUT_S = "ZFLOW_COLLECTIVE_TIMEOUT_S"
PREFLIGHT = "ZFLOW_PREFLIGHT"
FAULTS = "ZFLOW_FAULTS"
ATTEMPT = "ZFLOW_ATTEMPT"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD = "LOCAL_WORLD_SIZE"
DEVICE = "ZFLOW_DEVICE"
ENV = [
    RANK,
    WORLD,
    RENDEZVOUS,
    SECRET,
    HEARTBEAT_S,
    STORE_TIMEOUT_S,
    COLLECTIVE_TIMEOUT_S,
    PREFLIGHT,
    FAULTS,
    ATTEMPT,
    LOCAL_RANK,
    LOCAL_WORLD,
    DEVICE,
]

# Exit codes by failure class (runtime/src/contract/exit.rs): what the supervisor does next.
EXIT_DONE = 0
EXIT_RETRY = 1
EXIT_FATAL = 3
EXIT_LOST_PEER = 4
EXIT_CODES = {
    "done": EXIT_DONE,
    "retry": EXIT_RETRY,
    "fatal": EXIT_FATAL,
    "lost_peer": EXIT_LOST_PEER,
}

# The train job version this worker reads (runtime/src/contract/job.rs).
JOB_VERSION = 5


@dataclass(frozen=True)
class Probe:
    """One device's preflight figures (``runtime/src/dist/preflight.rs``' ``Probe``)."""

    gemm_gflops: float
    """Matmul GFLOP/s in the number format training multiplies in (bf16 on GPUs, f32 on the
    CPU): what the ranks are compared on."""
    membw_gbps: float
    """Memory bandwidth, GB/s."""
    f32_gflops: float
    """One matmul's GFLOP/s in f32."""
    bf16_gflops: float
    """The same matmul's in bf16: under half of f32's, a phase that asks for bf16 work warns."""


class JobError(ValueError):
    """A train job this worker cannot run (named with the file and what is wrong)."""


def read_job(path: str) -> TrainJob:
    """Reads a train job, refusing a version this worker does not know and any field that is
    not the schema's (``zflow_torch/job.py``)."""
    with open(path) as f:
        raw: Any = json.load(f)
    version = raw.get("version", 1) if isinstance(raw, dict) else None
    if version != JOB_VERSION:
        raise JobError(f"{path}: train job version {version}, but this worker reads {JOB_VERSION}")
    try:
        return decode(TrainJob, raw, "job")
    except DecodeError as e:
        raise JobError(f"{path}: {e}") from e


class Emitter:
    """Writes protocol messages, one JSON object per line, flushed at once (the supervisor
    reads them as they come; anything else the worker prints goes to stderr)."""

    def __init__(self, out: TextIO = sys.stdout, silenced: threading.Event | None = None) -> None:
        self.out = out
        # Once set (a hang fault fired), nothing more is sent.
        self.silenced = silenced or threading.Event()
        # The heartbeat thread writes too.
        self.lock = threading.Lock()
        # The last step reported (what a heartbeat says is in progress).
        self.last_step = 0

    def _emit(self, kind: str, **fields: Json) -> None:
        # No NaN or infinity: they are not JSON, and the supervisor could not read the line.
        line = json.dumps({"type": kind, **fields}, separators=(",", ":"), allow_nan=False)
        with self.lock:
            if self.silenced.is_set():
                return
            try:
                self.out.write(line + "\n")
                self.out.flush()
            except BrokenPipeError:
                # A supervisor that went away closed the pipe: nothing is left to report to.
                pass

    def hello(
        self,
        rank: int,
        world: int,
        device: str,
        start_step: int,
        total_steps: int,
        params: int,
        allreduce_gbps: float | None = None,
        links: list[dict[str, Any]] | None = None,
    ) -> None:
        """First, once per launch; with the launch's all-reduce bus bandwidth and this rank's
        link figures (``distributed.link_bandwidths``) when measured."""
        self._emit(
            "hello",
            rank=rank,
            world=world,
            device=device,
            host=socket.gethostname(),
            start_step=start_step,
            total_steps=total_steps,
            params=params,
            allreduce_gbps=allreduce_gbps,
            links=links or [],
        )

    def preflight(self, rank: int, probe: Probe, device: str) -> None:
        """The device probe, when asked for (``ZFLOW_PREFLIGHT``) or with ``--probe``."""
        self._emit(
            "preflight", rank=rank, probe=asdict(probe), host=socket.gethostname(), device=device
        )

    def heartbeat(self, step: int) -> None:
        """Liveness while a step takes long."""
        self._emit("heartbeat", step=step)

    def step(
        self,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float,
        tokens_per_s: float,
        tokens: int,
        expert_load: list[int],
        balance_error: float,
    ) -> None:
        """One optimizer step's metrics."""
        self.last_step = step
        self._emit(
            "step",
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=tokens_per_s,
            tokens=tokens,
            expert_load=expert_load,
            balance_error=balance_error,
        )

    def eval(self, step: int, losses: list[tuple[str, float]]) -> None:
        """Held-out losses per source."""
        self._emit("eval", step=step, losses=[list(pair) for pair in losses])

    def checkpoint_committed(self, step: int, path: str) -> None:
        """A checkpoint is on disk and verifies."""
        self._emit("checkpoint_committed", step=step, path=path)

    def loss_spike(
        self, step: int, loss: float, z: float, rollback_to: int, skipped_sample: int
    ) -> None:
        """A loss spike, and the rollback it caused."""
        self._emit(
            "loss_spike",
            step=step,
            loss=loss,
            z=z,
            rollback_to=rollback_to,
            skipped_sample=skipped_sample,
        )

    def done(self, step: int, loss: float | None) -> None:
        """Last, on success (exit code 0 follows)."""
        self._emit("done", step=step, loss=loss)

    def error(self, message: str, failure: str) -> int:
        """Last, on failure: the message and its class; returns the exit code to end with."""
        if failure not in EXIT_CODES or failure == "done":
            raise ValueError(f"unknown failure class {failure!r}")
        self._emit("error", message=message, **{"class": failure})
        return EXIT_CODES[failure]


def _dump() -> None:
    """Prints the constants and one of each message (what runtime/tests/torch_contract.rs
    checks against the Rust side)."""
    print(json.dumps({"env": ENV, "exit": EXIT_CODES, "job_version": JOB_VERSION}))
    e = Emitter()
    e.hello(0, 2, "cpu", 0, 10, 1234)
    e.preflight(1, Probe(12.5, 3.25, 12.0, 0.5), "cpu")
    e.heartbeat(3)
    e.step(3, 2.5, 1e-3, 0.75, 1000.0, 4096, [3, 1, 0, 4], 0.125)
    e.eval(3, [("bible", 2.25)])
    e.checkpoint_committed(3, "/ckpt/step-3")
    e.loss_spike(4, 9.5, 6.0, 3, 17)
    e.done(10, None)
    e.error("token id 600 >= 512", "fatal")


class Fatal(Exception):
    """A failure no relaunch can fix (bad settings or data, a full disk): exit code 3."""


class PeerLost(Exception):
    """Another rank went away (the collective failed): exit code 4, the supervisor blames it."""


def log(message: str) -> None:
    """A line in the stage log (stderr)."""
    print(f"{time.strftime('%H:%M:%S')} torch-worker: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    _dump()
