"""The WSD learning-rate schedule. Its settings come from the train job
(``train.schedule``), whose defaults live in the Rust contract alone
(``runtime/src/contract/schedule.rs``).
"""

import math

from zflow_torch.job import WsdSchedule


def round_half_away(x: float) -> float:
    """Rust's ``f64::round``: halves away from zero (Python's ``round`` rounds them to even)."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def lr(s: WsdSchedule, step: int, total_steps: int) -> float:
    """The learning rate of step ``step`` (0-based) of ``total_steps``: linear warmup, a
    plateau at ``peak_lr``, then a decay to ``peak_lr * min_lr_ratio``."""
    total = float(max(total_steps, 1))
    warmup = round_half_away(s.warmup * total)
    decay = round_half_away(s.decay * total)
    x = float(step)
    peak = s.peak_lr
    floor = peak * s.min_lr_ratio
    if x < warmup:
        return peak * (x + 1.0) / warmup
    decay_start = total - decay
    if x < decay_start or decay == 0.0:
        return peak
    progress = min(max((x - decay_start + 1.0) / decay, 0.0), 1.0)
    shape = s.decay_shape
    if shape == "linear":
        fall = progress
    elif shape == "cosine":
        fall = 0.5 * (1.0 - math.cos(math.pi * progress))
    elif shape == "sqrt":
        fall = math.sqrt(progress)
    else:
        raise ValueError(f"unknown decay_shape {shape!r}: expected linear, cosine or sqrt")
    return floor + (peak - floor) * (1.0 - fall)
