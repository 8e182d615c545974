"""Megatron-LM indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``, ``MMIDIDX`` version 1),
read as zflow's Rust reader reads them (``runtime/src/data/megatron``): each *sequence* is one
document of the token source, tokens are returned as unsigned 32-bit ids. ``ConcatDataset``
reads several as one (a sharded source's shards, ``runtime/src/data/concat.rs``).

The ``.idx`` layout, little-endian: magic ``b"MMIDIDX\\x00\\x00"``, version u64 (= 1), dtype
code u8, sequence count S u64, document-index count D u64, then S i32 lengths, S i64 byte
pointers into the ``.bin``, and D i64 document indices.
"""

import bisect
import mmap
import struct
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")

# Megatron's dtype codes -> (struct/array format, bytes). Float codes (6, 7) hold no token ids.
IntFormat = Literal["B", "b", "h", "i", "q", "H"]
DTYPES: dict[int, tuple[IntFormat, int]] = {
    1: ("B", 1),
    2: ("b", 1),
    3: ("h", 2),
    4: ("i", 4),
    5: ("q", 8),
    8: ("H", 2),
}


class DatasetError(ValueError):
    """A dataset that is not what its files claim (named with the file and what is wrong)."""


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            raise DatasetError(f"{path}: empty file")
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class IndexedDataset:
    """A Megatron dataset opened for reading, both files memory-mapped and checked at open."""

    def __init__(self, prefix: Path) -> None:
        if sys.byteorder != "little":
            raise DatasetError("zflow's datasets are little-endian; this machine is not")
        self.idx_path = Path(f"{prefix}.idx")
        self.bin_path = Path(f"{prefix}.bin")
        idx = _map(self.idx_path)
        if len(idx) < HEADER.size:
            raise DatasetError(f"{self.idx_path}: shorter than the {HEADER.size}-byte header")
        magic, version, code, sequences, doc_indices = HEADER.unpack_from(idx, 0)
        if magic != MAGIC:
            raise DatasetError(f"{self.idx_path}: not a Megatron index (bad magic)")
        if version != 1:
            raise DatasetError(f"{self.idx_path}: index version {version}, expected 1")
        if code not in DTYPES:
            raise DatasetError(f"{self.idx_path}: dtype code {code} holds no token ids")
        self.format, self.itemsize = DTYPES[code]
        need = HEADER.size + sequences * 12 + doc_indices * 8
        # Multimodal datasets append one i8 mode per sequence.
        if len(idx) not in (need, need + sequences):
            raise DatasetError(
                f"{self.idx_path}: {len(idx)} bytes, but {sequences} sequences and "
                f"{doc_indices} document indices need {need}"
            )
        lengths = array("i")
        lengths.frombytes(idx[HEADER.size : HEADER.size + 4 * sequences])
        pointers = array("q")
        start = HEADER.size + 4 * sequences
        pointers.frombytes(idx[start : start + 8 * sequences])
        docs = array("q")
        start += 8 * sequences
        docs.frombytes(idx[start : start + 8 * doc_indices])
        idx.close()
        if doc_indices == 0 or docs[0] != 0 or docs[-1] != sequences:
            raise DatasetError(
                f"{self.idx_path}: the document index must run from 0 to the {sequences} sequences"
            )
        if any(later < earlier for earlier, later in zip(docs, docs[1:], strict=False)):
            raise DatasetError(f"{self.idx_path}: the document index decreases")
        expected = 0
        for seq, (length, pointer) in enumerate(zip(lengths, pointers, strict=True)):
            if length < 0 or pointer != expected:
                raise DatasetError(
                    f"{self.idx_path}: sequence {seq} (length {length}, at byte {pointer}) "
                    f"does not follow the one before it (expected byte {expected})"
                )
            expected += length * self.itemsize
        self.lengths = lengths
        self.starts = [p // self.itemsize for p in pointers]
        self.bin = _map(self.bin_path) if expected > 0 else None
        size = len(self.bin) if self.bin is not None else 0
        if size != expected:
            raise DatasetError(f"{self.bin_path}: {size} bytes, but the index describes {expected}")
        self.tokens = memoryview(self.bin).cast(self.format) if self.bin is not None else None

    def num_docs(self) -> int:
        """Number of documents (sequences)."""
        return len(self.lengths)

    def doc_len(self, doc: int) -> int:
        """Length in tokens of document ``doc``."""
        return self.lengths[doc]

    def num_tokens(self) -> int:
        """Tokens in all documents."""
        return sum(self.lengths)

    def read(self, doc: int, offset: int, count: int) -> list[int]:
        """Tokens ``offset .. offset + count`` of document ``doc``; fails on ids below 0."""
        if offset + count > self.lengths[doc]:
            raise IndexError(f"document {doc}: {offset}+{count} past its {self.lengths[doc]}")
        if count == 0:
            return []
        assert self.tokens is not None
        start = self.starts[doc] + offset
        out: list[int] = self.tokens[start : start + count].tolist()
        if self.format in ("b", "h", "i", "q") and min(out) < 0:
            raise DatasetError(f"{self.bin_path}: document {doc} holds a negative token id")
        if self.format == "q" and max(out) > 0xFFFFFFFF:
            raise DatasetError(f"{self.bin_path}: document {doc} holds an id beyond 32 bits")
        return out


class TokenSource(Protocol):
    """Documents of token ids, read by index (what the mixture reads)."""

    def num_docs(self) -> int: ...

    def doc_len(self, doc: int) -> int: ...

    def num_tokens(self) -> int: ...

    def read(self, doc: int, offset: int, count: int) -> list[int]: ...


class ConcatDataset:
    """The documents of ``parts`` in order, as one source: document ``d`` is document
    ``d - start`` of the part whose range holds it."""

    def __init__(self, parts: Sequence[TokenSource]) -> None:
        self.parts = list(parts)
        self.starts = [0]
        for p in self.parts:
            self.starts.append(self.starts[-1] + p.num_docs())

    def _locate(self, doc: int) -> tuple[TokenSource, int]:
        if not 0 <= doc < self.starts[-1]:
            raise IndexError(f"document {doc} of {self.starts[-1]}")
        # The last part starting at or before ``doc`` (empty parts share a start).
        part = bisect.bisect_right(self.starts, doc) - 1
        return self.parts[part], doc - self.starts[part]

    def num_docs(self) -> int:
        return self.starts[-1]

    def doc_len(self, doc: int) -> int:
        part, d = self._locate(doc)
        return part.doc_len(d)

    def num_tokens(self) -> int:
        return sum(p.num_tokens() for p in self.parts)

    def read(self, doc: int, offset: int, count: int) -> list[int]:
        part, d = self._locate(doc)
        return part.read(d, offset, count)


def open_concat(prefixes: Sequence[str | Path]) -> ConcatDataset:
    """The datasets at ``prefixes``, read as one."""
    return ConcatDataset([IndexedDataset(Path(p)) for p in prefixes])
