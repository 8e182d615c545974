"""lm-eval's second MATH metric, ``math_verify``, for zflow's harness (``Metric::MathVerify`` in
``evals/src/task.rs``): ``python -m zflow_torch.math_verify`` reads one JSON object
``{"pairs": [[gold, generation], ...]}`` on stdin and writes ``{"verified": [bool, ...]}``.

Each verdict is the math-verify package's, called exactly as lm-eval 0.4.13's ``minerva_math``
calls it: ``verify(gold=parse(gold), target=parse(generation))``, where the gold is the whole
reference solution and the generation is the model's raw text (math-verify finds the answers in
both itself). math-verify bounds each parse and comparison by its own timeout and counts any
failure as "not verified".
"""

import json
import sys

from math_verify import parse, verify


def verified(gold: str, generation: str) -> bool:
    """See the module's docs."""
    return bool(verify(gold=parse(gold), target=parse(generation)))


def judge_pairs(pairs: list[list[str]]) -> list[bool]:
    """One verdict per ``[gold, generation]`` pair, in order."""
    return [verified(gold, generation) for gold, generation in pairs]


def main() -> None:
    json.dump({"verified": judge_pairs(json.load(sys.stdin)["pairs"])}, sys.stdout)


if __name__ == "__main__":
    main()
