"""Unit tests of the data plane (``python -m unittest`` from ``workers/torch`` in the torch
engine's Python). That its batches equal the Rust reader's is ``tests/torch_data.rs``."""

import json
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


def sparse_u64s(path: Path, length: int, at: int, values: list[int]) -> None:
    """A file of ``length`` little-endian u64s, ``values`` from entry ``at`` on, zeros (holes)
    elsewhere."""
    with open(path, "wb") as f:
        f.truncate(8 * length)
        f.seek(8 * at)
        f.write(struct.pack(f"<{len(values)}Q", *values))


class PastU32(unittest.TestCase):
    def test_document_ids_past_2_pow_32_address_their_own_tokens(self) -> None:
        # 2^32 empty documents, then 8 of 10 tokens (sparse files of 32 GiB, as
        # runtime/src/data/mixture/tests.rs builds them for the Rust reader).
        first, past, length, seq_len = 1 << 32, 8, 10, 16
        docs = first + past
        with tempfile.TemporaryDirectory() as d:
            base = Path(d)
            index = base / "samples.idx"
            header = struct.pack("<8sIIQQQQ", b"ZFMIXIDX", 2, 1, 2, seq_len, 42, 2)
            index.write_bytes(header + struct.pack("<2Q", 0, 1))
            plan = base / "samples.plan"
            plan.mkdir()
            sparse_u64s(plan / "positions.u64", 2, 0, [0, seq_len])
            tails = [p * length for p in range(past + 1)]
            sparse_u64s(plan / "addresses.u64", docs + 1, first, tails)
            sparse_u64s(plan / "starts.u64", docs + 1, first, tails)
            sparse_u64s(plan / "order.u64", docs, first, [first + p for p in reversed(range(past))])
            sources = {
                "documents": docs,
                "tokens": past * length,
                "samples_per_epoch": (past * length - 1) // seq_len,
                "part_tokens": [past * length],
                "addresses": "samples.plan/addresses.u64",
                "epochs": [
                    {"order": "samples.plan/order.u64", "starts": "samples.plan/starts.u64"}
                ],
            }
            manifest = {
                "spec": {"sources": ["past"]},
                "report": {"fingerprint": "f"},
                "read_plan": {"positions": "samples.plan/positions.u64", "sources": [sources]},
            }
            Path(f"{index}.json").write_text(json.dumps(manifest))
            # The tokens: document 2^32 + p holds p * 100 + offset.
            write_dataset(base / "tokens", [[p * 100 + o for o in range(length)] for p in range(8)])
            reader = MixtureReader(index, [[str(base / "tokens")]])
            batch = reader.batch(reader.start("p"), 0, 1, 2)

            def expected(start: int) -> list[int]:
                out = []
                for pos in range(start, start + seq_len + 1):
                    out.append((past - 1 - pos // length) * 100 + pos % length)
                return out

            self.assertEqual(batch.tokens.tolist(), [expected(0), expected(seq_len)])


if __name__ == "__main__":
    unittest.main()
