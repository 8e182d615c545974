"""Unit tests of the data plane (standard library only: ``python3 -m unittest`` from
``workers/torch``). That its batches equal the Rust reader's is ``runtime/tests/torch_data.rs``."""

import struct
import tempfile
import unittest
from array import array
from pathlib import Path

from zflow_torch.megatron import DatasetError, IndexedDataset
from zflow_torch.mixture import DataCursor, MixtureError, MixtureReader
from zflow_torch.rng import SplitMix64, WindowOrder, epoch_order, shuffle


def write_dataset(prefix: Path, docs: list[list[int]]) -> None:
    """A uint16 Megatron dataset of ``docs`` (one sequence per document)."""
    lengths = [len(d) for d in docs]
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += 2 * n
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, len(docs), len(docs) + 1)
    body = array("i", lengths).tobytes() + array("q", pointers).tobytes()
    body += array("q", range(len(docs) + 1)).tobytes()
    Path(f"{prefix}.idx").write_bytes(header + body)
    Path(f"{prefix}.bin").write_bytes(array("H", [t for d in docs for t in d]).tobytes())


class Rng(unittest.TestCase):
    def test_splitmix64_matches_the_reference_outputs(self) -> None:
        # The first outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
        r = SplitMix64(0)
        self.assertEqual(
            [r.next_u64() for _ in range(3)],
            [
                0xE220A8397B1DCDAF,
                0x6E789E6AA1B965F4,
                0x06C45D188009454F,
            ],
        )

    def test_shuffles_are_permutations_and_seeded(self) -> None:
        order = epoch_order(1, 2, 3, 1000)
        self.assertEqual(sorted(order), list(range(1000)))
        self.assertEqual(order, epoch_order(1, 2, 3, 1000))
        self.assertNotEqual(order, epoch_order(1, 2, 4, 1000))
        one = [7]
        shuffle(one, SplitMix64(5))
        self.assertEqual(one, [7])

    def test_window_orders_are_bijections_for_every_size(self) -> None:
        for n in [1, 2, 3, 5, 17, 100, 1000]:
            order = WindowOrder(7, 1, 0, n)
            self.assertEqual(sorted(order.get(k) for k in range(n)), list(range(n)), n)
        self.assertNotEqual(
            [WindowOrder(7, 1, 0, 1000).get(k) for k in range(8)],
            [WindowOrder(7, 1, 1, 1000).get(k) for k in range(8)],
        )


class Datasets(unittest.TestCase):
    def test_documents_read_back_and_bad_files_are_named(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            prefix = Path(d) / "ds"
            write_dataset(prefix, [[1, 2, 3], [], [65535, 4]])
            ds = IndexedDataset(prefix)
            self.assertEqual((ds.num_docs(), ds.doc_len(1)), (3, 0))
            self.assertEqual(ds.read(2, 0, 2), [65535, 4])
            self.assertEqual(ds.read(0, 1, 2), [2, 3])
            idx = bytearray(Path(f"{prefix}.idx").read_bytes())
            idx[-8:] = struct.pack("<q", 2)  # the document index ends short of 3 sequences
            Path(f"{prefix}.idx").write_bytes(bytes(idx))
            with self.assertRaisesRegex(DatasetError, "document index must run from 0"):
                IndexedDataset(prefix)
            write_dataset(prefix, [[1, 2, 3], [], [65535, 4]])
            Path(f"{prefix}.bin").write_bytes(b"\x00" * 4)
            with self.assertRaisesRegex(
                DatasetError, "ds.bin: 4 bytes, but the index describes 10"
            ):
                IndexedDataset(prefix)
            Path(f"{prefix}.idx").write_bytes(b"NOTMEGATRON" + b"\x00" * 40)
            with self.assertRaisesRegex(DatasetError, "bad magic"):
                IndexedDataset(prefix)


class Mixtures(unittest.TestCase):
    def test_a_truncated_index_and_a_foreign_cursor_are_refused(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            index = Path(d) / "samples.idx"
            index.write_bytes(b"ZFMIXIDX" + struct.pack("<IIQQQQ", 2, 1, 4, 8, 1, 16) + b"\x00" * 8)
            with self.assertRaisesRegex(MixtureError, "for 4 samples"):
                MixtureReader(index, [])
            index.write_bytes(b"ZFMIXIDX" + struct.pack("<IIQQQQ", 1, 1, 0, 8, 1, 16))
            with self.assertRaisesRegex(MixtureError, "version 1, .* run its mix stage again"):
                MixtureReader(index, [])
        cursor = DataCursor("p", 10, "f").advance(2, 3)
        self.assertEqual(cursor.sample, 16)


if __name__ == "__main__":
    unittest.main()
