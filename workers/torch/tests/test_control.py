"""Unit tests of the training loop's controls: the WSD schedule, the balancing-bias
controller and the loss-spike guard (their settings' defaults live in the Rust contract,
``runtime/src/contract``; the job carries them whole)."""

import dataclasses
import math
import typing
import unittest

from zflow_torch import balance, schedule, spike
from zflow_torch.job import BalanceConfig, DecayShape, SpikeGuard, WsdSchedule


def wsd(shape: DecayShape, warmup: float = 0.1, decay: float = 0.2) -> WsdSchedule:
    return WsdSchedule(peak_lr=1.0, warmup=warmup, decay=decay, min_lr_ratio=0.1, decay_shape=shape)


def controller(skip_share: float | None = None) -> BalanceConfig:
    return BalanceConfig(
        kp=1.0, ki=0.0, kd=0.0, lr=5e-3, beta1=0.9, beta2=0.99, skip_share=skip_share, enabled=True
    )


class Schedule(unittest.TestCase):
    def test_warms_up_holds_then_decays_to_the_floor(self) -> None:
        s = wsd("linear")
        self.assertAlmostEqual(schedule.lr(s, 0, 100), 0.1, places=12)
        self.assertAlmostEqual(schedule.lr(s, 9, 100), 1.0, places=12)
        self.assertEqual(schedule.lr(s, 50, 100), 1.0)
        self.assertEqual(schedule.lr(s, 79, 100), 1.0)
        self.assertAlmostEqual(schedule.lr(s, 89, 100), 0.55, places=12)
        self.assertAlmostEqual(schedule.lr(s, 99, 100), 0.1, places=12)
        for shape in typing.get_args(DecayShape):
            lrs = [schedule.lr(wsd(shape), i, 100) for i in range(10, 100)]
            self.assertTrue(all(b <= a + 1e-15 for a, b in zip(lrs, lrs[1:], strict=False)), shape)

    def test_step_counts_round_half_away_from_zero(self) -> None:
        # 0.25 x 10 = 2.5 decay steps: 3, as every zflow run so far rounded it (Python's
        # `round` gives 2).
        s = wsd("linear", warmup=0.0, decay=0.25)
        self.assertEqual(schedule.lr(s, 6, 10), 1.0)
        self.assertLess(schedule.lr(s, 7, 10), 1.0)
        # A one-step phase with warmup and decay, and none at all: finite rates.
        for w, d in ((0.3, 0.7), (0.0, 0.0)):
            one = wsd("cosine", warmup=w, decay=d)
            self.assertTrue(math.isfinite(schedule.lr(one, 0, 1)))


class Balance(unittest.TestCase):
    def test_error_is_total_variation(self) -> None:
        target = [0.25] * 4
        self.assertEqual(balance.balance_error([1, 1, 1, 1], target), 0.0)
        self.assertAlmostEqual(balance.balance_error([4, 0, 0, 0], target), 0.75, places=12)

    def test_an_overloaded_route_loses_bias(self) -> None:
        config = controller()
        state = balance.BalanceState.new(3, False)
        balance.update(state, [8, 1, 1], balance.target_shares(3, False, config), config)
        self.assertTrue(state.biases[0] < 0.0 < state.biases[1] and state.biases[2] > 0.0)

    def test_the_skip_route_starts_at_minus_one_and_can_have_its_own_share(self) -> None:
        config = controller(skip_share=0.2)
        self.assertEqual(balance.BalanceState.new(5, True).biases, [0.0, 0.0, 0.0, 0.0, -1.0])
        target = balance.target_shares(5, True, config)
        self.assertAlmostEqual(target[4], 0.2, places=12)
        self.assertAlmostEqual(target[0], 0.2, places=12)


class Spikes(unittest.TestCase):
    def test_flags_jumps_not_a_falling_curve_or_noise(self) -> None:
        g = SpikeGuard(enabled=True, window=20, z=6.0, min_jump=0.5, min_history=8, max_rollbacks=5)
        history: list[float] = []
        for i in range(30):
            loss = 9.0 - 0.1 * i + (0.05 if i % 2 == 0 else -0.05)
            self.assertIsNone(spike.check(g, history, loss), f"step {i}")
            spike.record(g, history, loss)
        self.assertEqual(len(history), 20)
        self.assertIsNone(spike.check(g, history, 9.0), "3 sd is within a falling curve's spread")
        z = spike.check(g, history, 12.0)
        self.assertTrue(z is not None and z > 6.0, z)
        self.assertEqual(spike.check(g, history, math.nan), math.inf)
        self.assertIsNone(spike.check(g, [5.0] * 10, 5.01))
        self.assertIsNone(spike.check(dataclasses.replace(g, enabled=False), history, 12.0))


if __name__ == "__main__":
    unittest.main()
