"""The loss-spike guard (``train.spike``, ``runtime/src/contract/spike.rs``): a step whose loss
is far above the recent ones (or not finite) rolls training back and skips its batch."""

import math

from zflow_torch.job import SpikeGuard


def check(g: SpikeGuard, history: list[float], loss: float) -> float | None:
    """The z-score of ``loss`` if it is a spike, else None."""
    if not g.enabled or len(history) < max(g.min_history, 2):
        return None
    recent = history[max(len(history) - g.window, 0) :]
    n = float(len(recent))
    mean = sum(recent) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in recent) / (n - 1.0))
    z = (loss - mean) / max(std, 1e-6)
    finite = math.isfinite(loss)
    if not finite or (z > g.z and loss - mean > g.min_jump):
        return z if finite else math.inf
    return None


def record(g: SpikeGuard, history: list[float], loss: float) -> None:
    """Appends ``loss``, keeping the last ``window``."""
    history.append(loss)
    excess = max(len(history) - max(g.window, 1), 0)
    del history[:excess]
