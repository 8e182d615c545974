"""Unit tests of the data plane (``python -m unittest`` from ``workers/torch`` in the torch
engine's Python). That its batches equal the Rust reader's is ``tests/torch_data.rs``."""

import struct
import tempfile
import unittest
from array import array
from pathlib import Path

from zflow_torch.megatron import DatasetError, first_tokens, tokens
from zflow_torch.mixture import DataCursor, MixtureError, MixtureReader
from zflow_torch.rng import SplitMix64


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


class Datasets(unittest.TestCase):
    def test_tokens_read_back_and_bad_files_are_named(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            prefix, second = Path(d) / "ds", Path(d) / "ds2"
            write_dataset(prefix, [[1, 2, 3], [], [65535, 4]])
            write_dataset(second, [[9, 8]])
            self.assertEqual(tokens(prefix).tolist(), [1, 2, 3, 65535, 4])
            self.assertEqual(first_tokens([prefix, second], 6).tolist(), [1, 2, 3, 65535, 4, 9])
            self.assertEqual(first_tokens([prefix], 9).tolist(), [1, 2, 3, 65535, 4])
            with self.assertRaisesRegex(DatasetError, "ds.bin: 10 bytes, but 4 tokens"):
                tokens(prefix, 4)
            Path(f"{prefix}.idx").write_bytes(b"NOTMEGATRON" + b"\x00" * 40)
            with self.assertRaisesRegex(DatasetError, "bad magic"):
                tokens(prefix)


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
