"""Fault injection (``ZFLOW_FAULTS``, for tests): real crashes, hangs, slow steps, a slow
network card (``slow-link``: the preflight's link probe only), deaths in the middle of a
checkpoint write, corrupted files, garbage batches and ``exit`` (status 0
without finishing), each ``kind@step`` with ``:rank=R``, ``:attempt=N`` and ``:ms=M`` options.
A fault fires on its rank (default 0) in its attempt (default 1, ``ZFLOW_ATTEMPT``) only.
"""

import os
import sys
import threading
import time
from dataclasses import dataclass

from zflow_torch.contract import ATTEMPT, FAULTS

KINDS = [
    "crash",
    "exit",
    "hang",
    "slow",
    "slow-link",
    "kill-in-checkpoint",
    "corrupt-checkpoint",
    "spike",
]

# Set once a hang fault fires: the worker then sends nothing more (heartbeats included).
HUNG = threading.Event()


class FaultSpecError(ValueError):
    """A ``ZFLOW_FAULTS`` entry that does not parse (named with the entry)."""


@dataclass(frozen=True)
class Fault:
    """One injected fault."""

    kind: str
    step: int
    rank: int = 0
    attempt: int = 1
    ms: int = 0


def parse(spec: str) -> list[Fault]:
    """Every fault of ``spec`` (``;``-separated)."""
    out = []
    for item in (s.strip() for s in spec.split(";")):
        if not item:
            continue
        head, *options = item.split(":")
        kind, at, step = head.partition("@")
        if not at:
            raise FaultSpecError(f"{FAULTS}: `{item}`: expected kind@step")
        if kind not in KINDS:
            raise FaultSpecError(
                f"{FAULTS}: `{item}`: unknown fault `{kind}` (expected {', '.join(KINDS)})"
            )
        values = {"rank": 0, "attempt": 1, "ms": -1}
        try:
            step_number = int(step)
            for option in options:
                key, eq, value = option.partition("=")
                if not eq or key not in values:
                    raise FaultSpecError(
                        f"{FAULTS}: `{item}`: unknown option `{option}` "
                        "(expected rank, attempt or ms)"
                    )
                values[key] = int(value)
        except ValueError as e:
            if isinstance(e, FaultSpecError):
                raise
            raise FaultSpecError(f"{FAULTS}: `{item}`: bad number") from e
        if kind in ("slow", "slow-link") and values["ms"] < 0:
            raise FaultSpecError(f"{FAULTS}: `{item}`: {kind} needs ms=N")
        out.append(
            Fault(kind, step_number, values["rank"], values["attempt"], max(values["ms"], 0))
        )
    return out


class Faults:
    """The faults of this rank in this attempt."""

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = faults

    @staticmethod
    def from_env(rank: int) -> "Faults":
        attempt = int(os.environ.get(ATTEMPT, "1") or 1)
        every = parse(os.environ.get(FAULTS, ""))
        return Faults([f for f in every if f.rank == rank and f.attempt == attempt])

    def at(self, kind: str, step: int) -> bool:
        return any(f.kind == kind and f.step == step for f in self.faults)

    def delay_ms(self, step: int) -> int:
        """The sleep a slow fault adds to ``step`` (every step from its own on)."""
        return sum(f.ms for f in self.faults if f.kind == "slow" and step >= f.step)

    def link_delay_ms(self) -> int:
        """The sleep a slow-link fault adds to each exchange of the link probe."""
        return sum(f.ms for f in self.faults if f.kind == "slow-link")


def abort(why: str) -> None:
    """Dies at once (SIGABRT, no cleanup), as a crash would."""
    print(f"fault injection: {why}", file=sys.stderr, flush=True)
    os.abort()


def leave(why: str) -> None:
    """Exits with status 0 at once, without finishing the phase (a rank that left early)."""
    print(f"fault injection: {why}", file=sys.stderr, flush=True)
    os._exit(0)


def hang(why: str) -> None:
    """Stops everything, heartbeats included, for good."""
    print(f"fault injection: {why}", file=sys.stderr, flush=True)
    HUNG.set()
    while True:
        time.sleep(3600)
