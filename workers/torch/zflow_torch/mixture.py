"""zflow's mixture index and the batch a rank reads at a data cursor, token for token as
``runtime/src/data/mixture`` reads them (``tests/torch_data.rs`` checks the two
against each other for several world sizes over many steps).

``samples.idx``, little-endian: magic ``b"ZFMIXIDX"``, version u32 (= 2), sources u32, N u64,
seq_len u64, seed u64, block_size u64, then one u64 per sample: ``source << 48 | k``, the
source-local sample ``k``. ``samples.idx.json`` beside it holds the spec, the report (with the
mixture's fingerprint) and the read plan (``runtime/src/data/mixture/read_plan.rs``): flat u64
arrays, made once by the mix stage, that say where every sample's tokens are. Sample ``i``
reads tokens ``[p, p + seq_len + 1)`` of epoch ``k // samples_per_epoch`` of its source's
stream, ``p = positions[i]``; place ``j`` of that stream is document ``order[j]`` and starts at
``starts[j]``; document ``d``'s tokens start ``addresses[d]`` tokens into the source's
datasets read back to back.

Everything is memory-mapped and nothing is walked: opening a mixture costs the same for a
thousand documents and ten billion, and a batch costs what its own rows do.
"""

import json
import mmap
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .megatron import Tokens, map_random, token_ids, tokens

MAGIC = b"ZFMIXIDX"
INDEX_VERSION = 2
HEADER = struct.Struct("<8sIIQQQQ")
K_BITS = 48
K_MASK = (1 << K_BITS) - 1
# Epochs kept mapped per source: a batch touches at most two (sources are read in order).
EPOCHS_CACHED = 2


class MixtureError(ValueError):
    """A mixture, cursor or batch request that cannot be read (named with what is wrong)."""


@dataclass(frozen=True)
class DataCursor:
    """Where a trainer is in a phase's data (``trainer.json``'s ``cursor``)."""

    phase: str
    sample: int
    fingerprint: str

    def advance(self, world: int, micro_batch: int) -> "DataCursor":
        """The cursor after one global batch of ``world * micro_batch`` samples."""
        return DataCursor(self.phase, self.sample + world * micro_batch, self.fingerprint)


@dataclass
class Batch:
    """One rank's part of a global batch: ``micro_batch`` rows of ``seq_len + 1`` tokens."""

    tokens: Tokens
    sources: list[int]
    first_sample: int


def _u64s(path: Path, count: int) -> npt.NDArray[np.uint64]:
    """The ``count`` little-endian u64s of a read plan file, memory-mapped."""
    size = path.stat().st_size if path.exists() else -1
    if size != 8 * count:
        raise MixtureError(
            f"{path}: {size} bytes, but the mixture's read plan says it holds {count} u64 "
            "values; the file is missing, truncated or damaged (run the mix stage again)"
        )
    return map_random(path, "<u8", count)


class _Source:
    """One source of a mixture: its plan's arrays and its datasets, each mapped when first
    read."""

    def __init__(self, base: Path, plan: dict[str, Any], prefixes: list[str], name: str) -> None:
        parts = plan["part_tokens"]
        if len(parts) != len(prefixes):
            raise MixtureError(
                f"source '{name}': the mixture was made from {len(parts)} datasets, but "
                f"{len(prefixes)} are given"
            )
        self.base, self.plan, self.prefixes, self.name = base, plan, prefixes, name
        self.documents: int = plan["documents"]
        self.per_epoch: int = plan["samples_per_epoch"]
        self.part_tokens: list[int] = parts
        self.part_starts = np.concatenate(([0], np.cumsum(np.array(parts, dtype=np.int64))))
        self.addresses = _u64s(base / plan["addresses"], self.documents + 1)
        self.bins: dict[int, npt.NDArray[np.integer]] = {}
        self.epochs: list[tuple[int, npt.NDArray[np.uint64], npt.NDArray[np.uint64]]] = []

    def epoch(self, e: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """Epoch ``e``'s document order and place starts."""
        for at, (held, order, starts) in enumerate(self.epochs):
            if held == e:
                self.epochs.append(self.epochs.pop(at))
                return order, starts
        if e >= len(self.plan["epochs"]):
            raise MixtureError(
                f"the read plan of source '{self.name}' holds {len(self.plan['epochs'])} "
                f"epochs; epoch {e} was asked for"
            )
        files = self.plan["epochs"][e]
        order = _u64s(self.base / files["order"], self.documents)
        starts = _u64s(self.base / files["starts"], self.documents + 1)
        if len(self.epochs) == EPOCHS_CACHED:
            self.epochs.pop(0)
        self.epochs.append((e, order, starts))
        return order, starts

    def gather(self, addresses: Tokens) -> Tokens:
        """The tokens at ``addresses`` (offsets into the datasets read back to back)."""
        part_of = np.searchsorted(self.part_starts, addresses, side="right") - 1
        out = np.empty(len(addresses), dtype=np.int64)
        for part in np.unique(part_of).tolist():
            if part not in self.bins:
                self.bins[part] = tokens(Path(self.prefixes[part]), self.part_tokens[part])
            mine = part_of == part
            values = self.bins[part][addresses[mine] - self.part_starts[part]]
            out[mine] = token_ids(np.asarray(values), f"{self.prefixes[part]}.bin")
        return out


class MixtureReader:
    """Reads a phase's samples: the index and its read plan (memory-mapped) plus each source's
    datasets, given as their prefixes in the mixture's source order."""

    def __init__(self, index_path: Path, sources: list[list[str]]) -> None:
        if sys.byteorder != "little":
            raise MixtureError("zflow's mixture index is little-endian; this machine is not")
        with open(index_path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._map) < HEADER.size:
            raise MixtureError(f"{index_path}: not a mixture index (shorter than its header)")
        magic, version, num_sources, n, seq_len, seed, _block = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            raise MixtureError(f"{index_path}: not a mixture index (bad magic)")
        if version != INDEX_VERSION:
            raise MixtureError(
                f"{index_path}: mixture index version {version}, this reader reads "
                f"{INDEX_VERSION} (an older one was made before windows were read in a shuffled "
                "order: run its mix stage again)"
            )
        if len(self._map) != HEADER.size + 8 * n:
            raise MixtureError(f"{index_path}: {len(self._map)} bytes for {n} samples")
        self.entries = np.frombuffer(self._map, dtype="<u8", offset=HEADER.size, count=n)
        self.num_samples, self.seq_len, self.seed = n, seq_len, seed
        manifest = json.loads(Path(f"{index_path}.json").read_text())
        self.fingerprint: str = manifest["report"]["fingerprint"]
        names: list[str] = manifest["spec"]["sources"]
        if num_sources != len(names) or len(sources) != num_sources:
            raise MixtureError(
                f"{index_path}: {len(sources)} token sources given for {num_sources} sources "
                f"({', '.join(names)})"
            )
        plan = manifest["read_plan"]
        base = index_path.parent
        self.positions = _u64s(base / plan["positions"], n)
        self.sources = [
            _Source(base, p, prefixes, name)
            for p, prefixes, name in zip(plan["sources"], sources, names, strict=True)
        ]

    def start(self, phase: str) -> DataCursor:
        """A cursor at the start of this mixture."""
        return DataCursor(phase, 0, self.fingerprint)

    def lookup(self, i: int) -> tuple[int, int]:
        """Sample ``i`` as (source id, source-local sample number)."""
        if not 0 <= i < self.num_samples:
            raise MixtureError(f"sample {i} is past the end of the mixture, N = {self.num_samples}")
        entry = int(self.entries[i])
        return entry >> K_BITS, entry & K_MASK

    def read_sample(self, i: int) -> tuple[Tokens, int]:
        """Sample ``i``'s ``seq_len + 1`` tokens and its source id."""
        s, k = self.lookup(i)
        source = self.sources[s]
        order, starts = source.epoch(k // source.per_epoch)
        want = self.seq_len + 1
        pos = int(self.positions[i])
        # The places whose documents overlap [pos, pos + want): from the last one starting at
        # or before pos (empty documents start where the next one does) to the last one
        # starting before the end.
        # Keys of the array's own dtype: numpy would otherwise convert the whole array first.
        first = int(np.searchsorted(starts, np.uint64(pos), side="right")) - 1
        end = int(np.searchsorted(starts, np.uint64(pos + want), side="left"))
        begin = starts[first : end + 1].astype(np.int64)
        lo = np.maximum(begin[:-1], pos)
        take = np.minimum(begin[1:], pos + want) - lo
        # Where each piece's tokens are, then one address per token of the row.
        at = source.addresses[order[first:end]].astype(np.int64) + (lo - begin[:-1])
        addresses = np.repeat(at - (np.cumsum(take) - take), take) + np.arange(want)
        return source.gather(addresses), s

    def batch(self, cursor: DataCursor, rank: int, world: int, micro_batch: int) -> Batch:
        """Rank ``rank``'s part of the global batch at ``cursor``: samples
        ``cursor.sample + rank * micro_batch ..``, so the global order never depends on the
        world size. Fails for a cursor of another mixture, or a global batch past N."""
        if cursor.fingerprint != self.fingerprint:
            raise MixtureError(
                f"phase '{cursor.phase}': the data cursor's mixture fingerprint "
                f"{cursor.fingerprint} does not match this mixture's {self.fingerprint}"
            )
        if world <= 0 or micro_batch <= 0 or not 0 <= rank < world:
            raise MixtureError(f"batch: rank {rank}, world {world}, micro_batch {micro_batch}")
        end = cursor.sample + world * micro_batch
        if end > self.num_samples:
            raise MixtureError(
                f"phase '{cursor.phase}': the mixture has N = {self.num_samples} samples, but the "
                f"batch at sample {cursor.sample} needs samples up to {end}"
            )
        first = cursor.sample + rank * micro_batch
        rows = np.empty((micro_batch, self.seq_len + 1), dtype=np.int64)
        sources: list[int] = []
        for r in range(micro_batch):
            rows[r], s = self.read_sample(first + r)
            sources.append(s)
        return Batch(rows, sources, first)


def _dump(argv: list[str]) -> None:
    """``python -m zflow_torch.mixture INDEX OUT WORLD MICRO_BATCH STEPS SOURCE...``: every
    rank's batch for STEPS global batches from the start, as little-endian u32 tokens, then
    the rows' source ids, rank after rank and step after step (what tests/torch_data.rs
    compares with the Rust reader). A SOURCE is its datasets' prefixes, comma-separated."""
    index, out, world, micro, steps, *sources = argv
    reader = MixtureReader(Path(index), [s.split(",") for s in sources])
    cursor = reader.start("dump")
    chunks: list[bytes] = []
    for _ in range(int(steps)):
        for rank in range(int(world)):
            b = reader.batch(cursor, rank, int(world), int(micro))
            chunks.append(b.tokens.astype("<u4").tobytes())
            chunks.append(np.array(b.sources, dtype="<u4").tobytes())
        cursor = cursor.advance(int(world), int(micro))
    Path(out).write_bytes(b"".join(chunks))


def _first_batch(argv: list[str]) -> None:
    """``python -m zflow_torch.mixture first-batch INDEX MICRO_BATCH SOURCE...``: opens the
    mixture as a rank does and reads rank 0's first batch of a world of one; prints the seconds
    that took, this process's peak RSS and its anonymous memory then, as one JSON line
    (``zflow bench data-scale``)."""
    index, micro, *sources = argv
    start = time.perf_counter()
    reader = MixtureReader(Path(index), [s.split(",") for s in sources])
    batch = reader.batch(reader.start("bench"), 0, 1, int(micro))
    seconds = time.perf_counter() - start
    # VmHWM, this address space's peak, not ru_maxrss: Linux carries the latter over from the
    # parent across fork and exec, so a large parent would show as this process's peak.
    status = Path("/proc/self/status").read_text()
    kib = {k: int(status.split(f"{k}:")[1].split()[0]) for k in ("VmHWM", "RssAnon")}
    figures = {
        "seconds": seconds,
        "peak_rss_bytes": kib["VmHWM"] * 1024,
        "anonymous_bytes": kib["RssAnon"] * 1024,
    }
    print(json.dumps(figures | {"tokens": batch.tokens.size}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["first-batch"]:
        _first_batch(sys.argv[2:])
    else:
        _dump(sys.argv[1:])
