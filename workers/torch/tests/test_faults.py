"""Unit tests of fault-spec parsing (the ``ZFLOW_FAULTS`` syntax of ``zflow_torch/faults.py``)."""

import unittest

from zflow_torch.faults import Fault, Faults, FaultSpecError, parse
from zflow_torch.trainer import failure_class


class FaultSpecs(unittest.TestCase):
    def test_specs_parse_with_their_options_and_filter_by_rank_and_attempt(self) -> None:
        faults = parse("crash@7:rank=1; slow@3:ms=400 ;hang@12:attempt=2")
        self.assertEqual(
            faults,
            [Fault("crash", 7, rank=1), Fault("slow", 3, ms=400), Fault("hang", 12, attempt=2)],
        )
        self.assertEqual(parse("exit@3:rank=1"), [Fault("exit", 3, rank=1)])
        mine = Faults([f for f in faults if f.rank == 0 and f.attempt == 1])
        self.assertEqual(mine.delay_ms(2), 0)
        self.assertEqual(mine.delay_ms(5), 400)
        self.assertFalse(mine.at("hang", 12))

    def test_bad_specs_name_the_entry(self) -> None:
        for spec, says in [
            ("crash", "expected kind@step"),
            ("boom@3", "unknown fault `boom`"),
            ("slow@3", "slow needs ms=N"),
            ("crash@x", "bad number"),
            ("crash@3:who=1", "unknown option `who=1`"),
        ]:
            with self.assertRaises(FaultSpecError) as caught:
                parse(spec)
            self.assertIn(says, str(caught.exception), spec)


class FailureClasses(unittest.TestCase):
    def test_a_peer_that_left_mid_collective_is_a_lost_peer(self) -> None:
        gloo = RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [127.0.0.1]:40123"
        )
        self.assertEqual(failure_class(gloo), "lost_peer")
        self.assertEqual(failure_class(RuntimeError("loss is nan")), "retry")


if __name__ == "__main__":
    unittest.main()
