"""Whether two MATH answers are the same mathematics, for zflow's harness (the `sympy`
equivalence of ``evals/src/task.rs``): ``python -m zflow_torch.math_equivalence`` reads one JSON
object ``{"pairs": [[answer, gold], ...]}`` on stdin (both already normalised as Minerva does,
``evals/src/math.rs``) and writes ``{"equivalent": [bool, ...]}``.

Two answers are equivalent when they are the same non-empty text, or when sympy parses both as
LaTeX and simplifies their difference to 0 within ``SECONDS`` seconds. Anything else (a parse
error, a difference sympy cannot take or simplify, the deadline) counts as not equivalent: the
rule lm-eval's ``minerva_math`` scores ``exact_match`` by.
"""

import json
import signal
import sys
from types import FrameType
from typing import Any

import sympy
from sympy.parsing.latex import parse_latex

# lm-eval's per-pair deadline.
SECONDS = 5


class Deadline(Exception):
    """Raised by the alarm when a comparison runs past ``SECONDS``."""


def _expire(signum: int, frame: FrameType | None) -> None:
    raise Deadline


def equivalent(answer: str, gold: str) -> bool:
    """See the module's docs."""
    if answer and answer == gold:
        return True
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.alarm(SECONDS)
    try:
        difference: Any = parse_latex(answer) - parse_latex(gold)
        return bool(sympy.simplify(difference) == 0)
    except Exception:  # noqa: BLE001 - sympy's and antlr's errors are many; all mean "no".
        return False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def main() -> None:
    pairs = json.load(sys.stdin)["pairs"]
    json.dump({"equivalent": [equivalent(a, g) for a, g in pairs]}, sys.stdout)


if __name__ == "__main__":
    main()
