"""Megatron-LM indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``, ``MMIDIDX`` version 1),
read through numpy memory maps.

A dataset's structure is checked once, in Rust, where it is made or taken in
(``runtime/src/data/megatron``); a worker reads only the ``.idx`` header (for the token
dtype) and maps the ``.bin``, so opening one costs the same for any number of documents. A
document's tokens sit back to back in the ``.bin`` in document order, which is what lets the
mixture's read plan (``zflow_torch.mixture``) address them by token offset alone.

The ``.idx`` header, little-endian: magic ``b"MMIDIDX\\x00\\x00"``, version u64 (= 1), dtype
code u8, sequence count u64, document-index count u64.
"""

import mmap
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")

# Megatron's dtype codes; float codes (6, 7) hold no token ids.
DTYPES: dict[int, type[np.integer]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    8: np.uint16,
}

Tokens = npt.NDArray[np.int64]


class DatasetError(ValueError):
    """A dataset that is not what its files claim (named with the file and what is wrong)."""


def token_dtype(prefix: Path) -> np.dtype:
    """The token dtype of the dataset at ``prefix``, from its ``.idx`` header."""
    if sys.byteorder != "little":
        raise DatasetError("zflow's datasets are little-endian; this machine is not")
    path = Path(f"{prefix}.idx")
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise DatasetError(f"{path}: shorter than the {HEADER.size}-byte header")
    magic, version, code, _, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise DatasetError(f"{path}: not a Megatron index (bad magic)")
    if version != 1:
        raise DatasetError(f"{path}: index version {version}, expected 1")
    if code not in DTYPES:
        raise DatasetError(f"{path}: dtype code {code} holds no token ids")
    return np.dtype(DTYPES[code])


def map_random(path: Path, dtype: npt.DTypeLike, count: int) -> npt.NDArray[Any]:
    """The first ``count`` values of ``dtype`` in the file at ``path``, memory-mapped for random
    reads: without read-ahead, a lookup costs the pages it touches, not the kernel's window
    around each (which made a rank's memory grow with the arrays it looked into)."""
    if count == 0:
        return np.zeros(0, dtype=dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=count)


def tokens(prefix: Path, expected: int | None = None) -> npt.NDArray[np.integer]:
    """Every token of the dataset at ``prefix``, memory-mapped in its dtype; ``expected``, when
    given, is the count the ``.bin`` must hold."""
    dtype = token_dtype(prefix)
    path = Path(f"{prefix}.bin")
    size = path.stat().st_size
    if size % dtype.itemsize != 0 or (expected is not None and size != expected * dtype.itemsize):
        want = f"{expected} tokens of {dtype.itemsize} bytes" if expected is not None else "whole"
        raise DatasetError(f"{path}: {size} bytes, but {want} tokens were expected")
    return map_random(path, dtype, size // dtype.itemsize)


def token_ids(values: npt.NDArray[np.integer], where: str) -> Tokens:
    """``values`` as 64-bit ids; fails on a value no ``u32`` id has (a corrupt dataset)."""
    if values.size and values.dtype.kind == "i" and int(values.min()) < 0:
        raise DatasetError(f"{where} holds a negative token id")
    if values.size and values.dtype.itemsize == 8 and int(values.max()) > 0xFFFFFFFF:
        raise DatasetError(f"{where} holds an id beyond 32 bits")
    return values.astype(np.int64)


def first_tokens(prefixes: Sequence[str | Path], count: int) -> Tokens:
    """The first ``count`` tokens (fewer if they hold fewer) of the datasets at ``prefixes``
    read back to back: their documents in order, whole, each after the one before."""
    parts: list[Tokens] = []
    left = count
    for prefix in prefixes:
        if left == 0:
            break
        part = tokens(Path(prefix))[:left]
        parts.append(token_ids(np.asarray(part), f"{prefix}.bin"))
        left -= len(part)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
