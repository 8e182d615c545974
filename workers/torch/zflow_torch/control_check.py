"""``python -m zflow_torch.control_check CASES.json``: the schedule's learning rates and the
balancing controller's biases for the cases ``runtime/tests/torch_control.rs`` writes, printed
as JSON with every float as its IEEE bits, so the test compares them with the Rust side's to
the bit."""

import json
import struct
import sys
from pathlib import Path

from .balance import BalanceState, target_shares, update
from .schedule import lr


def bits(x: float) -> int:
    """The f64 bits of ``x``."""
    value: int = struct.unpack("<Q", struct.pack("<d", x))[0]
    return value


def main(path: str) -> None:
    cases = json.loads(Path(path).read_text())
    out: dict[str, list[list[int]]] = {"lr": [], "biases": []}
    for case in cases["schedules"]:
        total = case["total"]
        out["lr"].append([bits(lr(case["schedule"], step, total)) for step in range(total)])
    for case in cases["balance"]:
        routes, mod_skip, config = case["routes"], case["mod_skip"], case["config"]
        state = BalanceState.new(routes, mod_skip)
        target = target_shares(routes, mod_skip, config)
        trace: list[int] = []
        for counts in case["counts"]:
            update(state, counts, target, config)
            trace.extend(bits(b) for b in state.biases)
        out["biases"].append(trace)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
