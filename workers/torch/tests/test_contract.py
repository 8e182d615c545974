"""Unit tests of the contract module (its agreement with the Rust side is
``runtime/tests/torch_contract.rs``)."""

import io
import json
import tempfile
import unittest
from pathlib import Path

from zflow_torch.contract import EXIT_FATAL, JOB_VERSION, Emitter, JobError, read_job


class Contract(unittest.TestCase):
    def test_messages_are_one_json_line_each_and_errors_give_their_exit_code(self) -> None:
        out = io.StringIO()
        e = Emitter(out)
        e.heartbeat(5)
        self.assertEqual(e.error("disk full", "fatal"), EXIT_FATAL)
        lines = out.getvalue().splitlines()
        self.assertEqual(json.loads(lines[0]), {"type": "heartbeat", "step": 5})
        self.assertEqual(json.loads(lines[1])["class"], "fatal")
        with self.assertRaises(ValueError):
            e.error("x", "done")
        with self.assertRaises(ValueError):
            e.done(3, float("nan"))

    def test_a_job_of_another_version_is_refused(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "job.json"
            path.write_text(json.dumps({"version": JOB_VERSION + 1, "phase": "p"}))
            with self.assertRaisesRegex(JobError, f"version {JOB_VERSION + 1}"):
                read_job(str(path))
            # A job without a version is version 1 (a source's tokens as one path).
            path.write_text(json.dumps({"phase": "p"}))
            with self.assertRaisesRegex(JobError, "version 1"):
                read_job(str(path))
            # The right version with a field missing: named, with the file.
            path.write_text(json.dumps({"version": JOB_VERSION, "phase": "p"}))
            with self.assertRaisesRegex(JobError, r"job\.json: job: missing field `model`"):
                read_job(str(path))


class Devices(unittest.TestCase):
    def test_two_ranks_on_one_device_are_named(self) -> None:
        from zflow_torch.distributed import shared_devices

        self.assertIsNone(shared_devices([("a", "GPU-0"), ("a", "GPU-1"), ("b", "GPU-0")]))
        self.assertEqual(
            shared_devices([("a", "GPU-0"), ("b", "GPU-0"), ("a", "GPU-0")]),
            "ranks 0 and 2 both bound device GPU-0 on host a",
        )

    def test_the_link_probe_pairs_each_rank_with_its_ring_neighbours_one_partner_a_round(
        self,
    ) -> None:
        from zflow_torch.distributed import ring_partners

        for world, per_node in [(1, 1), (2, 1), (2, 2), (3, 1), (4, 2), (6, 2), (12, 4), (16, 8)]:
            rounds = [ring_partners(r, world, per_node) for r in range(world)]
            self.assertEqual(len({len(p) for p in rounds}), 1, (world, per_node))
            for rank, partners in enumerate(rounds):
                for i, peer in enumerate(partners):
                    if peer is not None:  # partners agree, round by round
                        self.assertEqual(rounds[peer][i], rank, (world, per_node, rank, i))
                        if world // per_node > 1:  # across nodes, at the same local rank
                            self.assertEqual(peer % per_node, rank % per_node)
                            self.assertNotEqual(peer // per_node, rank // per_node)
        # Three nodes of two: rank 3 (node 1, local 1) meets ranks 5 and 1.
        self.assertEqual(sorted(p for p in ring_partners(3, 6, 2) if p is not None), [1, 5])
        self.assertEqual(ring_partners(0, 1, 1), [])


if __name__ == "__main__":
    unittest.main()
