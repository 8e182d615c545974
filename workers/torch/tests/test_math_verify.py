"""lm-eval's ``math_verify`` verdicts (``zflow_torch.math_verify``), on hand-checked pairs: a
reference solution and a generation in Minerva's format."""

import json
import subprocess
import sys
import unittest
from pathlib import Path

from zflow_torch.math_verify import verified

SOLUTION = (
    "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (2)(12) = \\boxed{24}.$\n"
    "Final Answer: The final answer is $24$. I hope it is correct."
)


class MathVerify(unittest.TestCase):
    def test_the_same_answer_in_other_words(self) -> None:
        self.assertTrue(verified(SOLUTION, "The product is $2 \\cdot 12 = \\boxed{24}$."))
        self.assertTrue(
            verified("So $x = \\boxed{\\frac{1}{2}}$.", "Final Answer: The final answer is $0.5$.")
        )

    def test_a_wrong_answer_or_none(self) -> None:
        self.assertFalse(verified(SOLUTION, "Final Answer: The final answer is $25$."))
        self.assertFalse(verified(SOLUTION, "I do not know."))

    def test_the_command_line_answers_in_order(self) -> None:
        worker = Path(__file__).resolve().parents[1]
        pairs = [[SOLUTION, "$\\boxed{24}$"], [SOLUTION, "$\\boxed{23}$"]]
        out = subprocess.run(
            [sys.executable, "-m", "zflow_torch.math_verify"],
            input=json.dumps({"pairs": pairs}),
            capture_output=True,
            text=True,
            cwd=worker,
            check=True,
        )
        self.assertEqual(json.loads(out.stdout), {"verified": [True, False]})


if __name__ == "__main__":
    unittest.main()
