"""Unit tests of the contract module (its agreement with the Rust side is
``runtime/tests/torch_contract.rs``)."""

import io
import json
import socket
import tempfile
import threading
import unittest
from pathlib import Path

from torch._C._distributed_c10d import HashStore, Store

from zflow_torch.contract import EXIT_FATAL, JOB_VERSION, Emitter, Fatal, JobError, read_job


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


class CountingStore:
    """torch's in-memory store (``HashStore``, shared by threads standing in for ranks),
    counting the operations each rank makes on it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.operations = 0

    def set(self, key: str, value: str) -> None:
        self.operations += 1
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        self.operations += 1
        value: bytes = self.store.get(key)
        return value


def prove_all(world: int, keys: list[bytes]) -> tuple[list[int], list[BaseException | None]]:
    """Runs ``prove_secret`` on ``world`` threads over one store, rank ``r`` holding
    ``keys[r]``: each rank's store operations and what it raised."""
    from datetime import timedelta

    from zflow_torch.distributed import prove_secret

    shared = HashStore()
    shared.set_timeout(timedelta(seconds=2))
    stores = [CountingStore(shared) for _ in range(world)]
    raised: list[BaseException | None] = [None] * world

    def rank(r: int) -> None:
        try:
            prove_secret(stores[r], r, world, keys[r])
        except BaseException as e:  # noqa: BLE001 (the test reads what each rank raised)
            raised[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s.operations for s in stores], raised


class Rendezvous(unittest.TestCase):
    def test_each_rank_proves_the_secret_in_a_constant_number_of_store_operations(self) -> None:
        for world in (1, 2, 64):
            operations, raised = prove_all(world, [b"k" * 32] * world)
            self.assertEqual(raised, [None] * world)
            # Rank 0 posts the challenge too; every rank posts and reads its own proof's
            # answer and checks its ring neighbour's, whatever the world.
            self.assertLessEqual(max(operations), 6, (world, operations))

    def test_a_rank_without_the_secret_is_refused_by_the_rank_before_it(self) -> None:
        keys = [b"k" * 32] * 5
        keys[3] = b"x" * 32
        _, raised = prove_all(5, keys)
        self.assertIsInstance(raised[2], Fatal)
        self.assertEqual(str(raised[2]), "rank 3 did not prove the launch secret; refusing it")
        # The impostor finds that its own neighbours' proofs fail too.
        self.assertIsInstance(raised[3], Fatal)

    def test_devices_are_checked_per_node_by_its_first_rank(self) -> None:
        from datetime import timedelta

        from zflow_torch.distributed import check_own_device

        def check(devices: list[str], per_node: int) -> tuple[list[int], list[str]]:
            shared = HashStore()
            shared.set_timeout(timedelta(seconds=2))
            stores = [CountingStore(shared) for _ in devices]
            errors: list[str] = []
            for r in reversed(range(len(devices))):  # the node's first rank reads last
                try:
                    check_own_device(stores[r], r, r % per_node, per_node, devices[r])
                except Fatal as e:
                    errors.append(str(e))
            return [s.operations for s in stores], errors

        # Two nodes of four: GPU-0 on each is no conflict, and a node's first rank reads only
        # its own node.
        operations, errors = check(["GPU-0", "GPU-1", "GPU-2", "GPU-3"] * 2, 4)
        self.assertEqual((operations, errors), ([5, 1, 1, 1, 5, 1, 1, 1], []))
        _, errors = check(["GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-0", "GPU-1", "GPU-1", "G"], 4)
        host = socket.gethostname()
        self.assertEqual(
            errors,
            [
                f"ranks 5 and 6 both bound device GPU-1 on host {host}: "
                "every rank needs a device of its own"
            ],
        )
