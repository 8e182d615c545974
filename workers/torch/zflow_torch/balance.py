"""The router's balancing-bias controller: after every optimizer step, PID terms on the
realised routing shares minus the target move the biases through an Adam-normalised step.
Biases are f32, as in a checkpoint's ``trainer.json``; the controller's own state is f64.
Settings come from the train job (``train.balance``).
"""

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from zflow_torch.job import BalanceConfig


def f32(x: float) -> float:
    """``x`` rounded to the nearest f32 (ties to even), as Rust's ``as f32``."""
    value: float = struct.unpack("<f", struct.pack("<f", x))[0]
    return value


def powi(a: float, b: int) -> float:
    """``a`` to the integer power ``b`` by repeated squaring, as Rust's ``f64::powi`` (LLVM's
    ``__powidf2``) multiplies, so the rounding is the same."""
    r, recip = 1.0, b < 0
    b = abs(b)
    while True:
        if b & 1:
            r *= a
        b //= 2
        if b == 0:
            break
        a *= a
    return 1.0 / r if recip else r


@dataclass
class BalanceState:
    """One MoE layer's controller state (``trainer.json``'s ``balance`` entries)."""

    biases: list[float]
    integral: list[float] = field(default_factory=list)
    last_error: list[float] = field(default_factory=list)
    m: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    steps: int = 0

    @staticmethod
    def new(routes: int, mod_skip: bool) -> "BalanceState":
        """Zero biases, the skip route (the last) at -1."""
        biases = [0.0] * routes
        if mod_skip:
            biases[-1] = -1.0
        zeros = [0.0] * routes
        return BalanceState(biases, list(zeros), list(zeros), list(zeros), list(zeros), 0)

    def to_json(self) -> dict[str, Any]:
        """As ``trainer.json`` holds it."""
        return {
            "biases": self.biases,
            "integral": self.integral,
            "last_error": self.last_error,
            "m": self.m,
            "v": self.v,
            "steps": self.steps,
        }


def target_shares(routes: int, mod_skip: bool, config: BalanceConfig) -> list[float]:
    """Uniform over the routes, or the skip route at ``skip_share`` and the rest uniform."""
    skip = config.skip_share
    if mod_skip and skip is not None:
        t = [(1.0 - skip) / (routes - 1)] * routes
        t[-1] = skip
        return t
    return [1.0 / routes] * routes


def shares(counts: list[int]) -> list[float]:
    """Each route's share of the tokens."""
    total = sum(counts)
    return [0.0 if total == 0 else c / total for c in counts]


def balance_error(counts: list[int], target: list[float]) -> float:
    """Total-variation distance between the realised and the target shares."""
    return 0.5 * sum(abs(s - t) for s, t in zip(shares(counts), target, strict=True))


def update(
    state: BalanceState, counts: list[int], target: list[float], config: BalanceConfig
) -> None:
    """One controller step from the global batch's tokens per route."""
    if not config.enabled or sum(counts) == 0:
        return
    load = shares(counts)
    state.steps += 1
    t = state.steps
    b1, b2 = config.beta1, config.beta2
    for i in range(len(state.biases)):
        # Positive error = overloaded route = its bias must fall.
        error = load[i] - target[i]
        state.integral[i] += error
        derivative = error - state.last_error[i]
        state.last_error[i] = error
        g = config.kp * error + config.ki * state.integral[i] + config.kd * derivative
        state.m[i] = b1 * state.m[i] + (1.0 - b1) * g
        state.v[i] = b2 * state.v[i] + (1.0 - b2) * g * g
        m_hat = state.m[i] / (1.0 - powi(b1, t))
        v_hat = state.v[i] / (1.0 - powi(b2, t))
        step = f32(config.lr * m_hat / (math.sqrt(v_hat) + 1e-12))
        state.biases[i] = f32(state.biases[i] - step)
