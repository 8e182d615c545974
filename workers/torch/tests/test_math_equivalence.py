"""MATH answers compared by sympy (``zflow_torch.math_equivalence``), on hand-checked pairs."""

import json
import subprocess
import sys
import unittest
from pathlib import Path

from zflow_torch.math_equivalence import equivalent


class Equivalence(unittest.TestCase):
    def test_equal_mathematics_in_different_text(self) -> None:
        self.assertTrue(equivalent("\\frac{1}{2}", "0.5"))
        self.assertTrue(equivalent("2\\sqrt{2}", "\\sqrt{8}"))
        self.assertTrue(equivalent("x^2-1", "(x-1)(x+1)"))

    def test_different_or_unparseable_answers(self) -> None:
        self.assertFalse(equivalent("\\frac{1}{3}", "0.5"))
        self.assertFalse(equivalent("[invalidanswer]", "4"))
        self.assertFalse(equivalent("", ""))
        # Identical text sympy cannot parse (an interval) still counts.
        self.assertTrue(equivalent("[2,5)", "[2,5)"))

    def test_the_command_line_answers_in_order(self) -> None:
        worker = Path(__file__).resolve().parents[1]
        out = subprocess.run(
            [sys.executable, "-m", "zflow_torch.math_equivalence"],
            input=json.dumps({"pairs": [["4", "4"], ["3", "4"], ["\\frac{4}{2}", "2"]]}),
            capture_output=True,
            text=True,
            cwd=worker,
            check=True,
        )
        self.assertEqual(json.loads(out.stdout), {"equivalent": [True, False, True]})


if __name__ == "__main__":
    unittest.main()
