"""zflow's mixture index and the batch a rank reads at a data cursor, token for token as
``runtime/src/data/mixture`` reads them (``runtime/tests/torch_data.rs`` checks the two
against each other for several world sizes over many steps).

``samples.idx``, little-endian: magic ``b"ZFMIXIDX"``, version u32 (= 2), sources u32, N u64,
seq_len u64, seed u64, block_size u64, then one u64 per sample: ``source << 48 | k``, the
source-local sample ``k``. ``samples.idx.json`` beside it holds the spec and the report (with
the mixture's fingerprint). Source-local sample ``k`` of source ``s`` is the window
``[w * seq_len, w * seq_len + seq_len + 1)`` of epoch ``e = k // per_epoch`` of the source's
documents concatenated in that epoch's seeded order, ``w = WindowOrder(seed, s, e,
per_epoch).get(k % per_epoch)`` and ``per_epoch = (tokens_s - 1) // seq_len``.
"""

import bisect
import json
import mmap
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from .megatron import TokenSource, open_concat
from .rng import WindowOrder, epoch_order

MAGIC = b"ZFMIXIDX"
INDEX_VERSION = 2
HEADER = struct.Struct("<8sIIQQQQ")
K_BITS = 48
K_MASK = (1 << K_BITS) - 1


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

    tokens: list[int]
    sources: list[int]
    first_sample: int


class _Epoch:
    """One epoch of a source: its document order, each document's start in the stream, and
    the order its windows are read in."""

    def __init__(self, order: list[int], dataset: TokenSource, windows: WindowOrder) -> None:
        self.order = order
        self.windows = windows
        self.starts = [0]
        for doc in order:
            self.starts.append(self.starts[-1] + dataset.doc_len(doc))


class MixtureReader:
    """Reads a phase's samples: the index (memory-mapped) plus the sources' datasets, given in
    the mixture's source order."""

    def __init__(self, index_path: Path, sources: list[TokenSource]) -> None:
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
        self.entries = memoryview(self._map)[HEADER.size :].cast("Q")
        self.num_samples, self.seq_len, self.seed = n, seq_len, seed
        sidecar = Path(f"{index_path}.json")
        manifest = json.loads(sidecar.read_text())
        report = manifest["report"]
        self.fingerprint: str = report["fingerprint"]
        if num_sources != len(manifest["spec"]["sources"]) or len(sources) != num_sources:
            raise MixtureError(
                f"{index_path}: {len(sources)} token sources given for {num_sources} sources "
                f"({', '.join(manifest['spec']['sources'])})"
            )
        self.per_epoch: list[int] = []
        for s, (dataset, rep) in enumerate(zip(sources, report["sources"], strict=True)):
            tokens = dataset.num_tokens()
            if dataset.num_docs() != rep["documents"] or tokens != rep["data_tokens"]:
                raise MixtureError(
                    f"mixture {index_path}: source {s} ('{rep['name']}') was {rep['documents']} "
                    f"documents / {rep['data_tokens']} tokens when the mixture was made, but the "
                    f"data given has {dataset.num_docs()} documents / {tokens} tokens"
                )
            self.per_epoch.append(max(tokens - 1, 0) // seq_len)
        self.sources = sources
        # Per source: (epoch, layout) of the two most recently used epochs.
        self._epochs: list[list[tuple[int, _Epoch]]] = [[] for _ in sources]

    def start(self, phase: str) -> DataCursor:
        """A cursor at the start of this mixture."""
        return DataCursor(phase, 0, self.fingerprint)

    def lookup(self, i: int) -> tuple[int, int]:
        """Sample ``i`` as (source id, source-local sample number)."""
        if not 0 <= i < self.num_samples:
            raise MixtureError(f"sample {i} is past the end of the mixture, N = {self.num_samples}")
        entry = self.entries[i]
        return entry >> K_BITS, entry & K_MASK

    def _layout(self, source: int, epoch: int) -> _Epoch:
        cache = self._epochs[source]
        for at, (e, layout) in enumerate(cache):
            if e == epoch:
                cache.append(cache.pop(at))
                return layout
        dataset = self.sources[source]
        order = epoch_order(self.seed, source, epoch, dataset.num_docs())
        windows = WindowOrder(self.seed, source, epoch, self.per_epoch[source])
        layout = _Epoch(order, dataset, windows)
        if len(cache) == 2:
            cache.pop(0)
        cache.append((epoch, layout))
        return layout

    def read_sample(self, i: int) -> tuple[list[int], int]:
        """Sample ``i``'s ``seq_len + 1`` tokens and its source id."""
        s, k = self.lookup(i)
        per_epoch = self.per_epoch[s]
        layout = self._layout(s, k // per_epoch)
        dataset = self.sources[s]
        pos = layout.windows.get(k % per_epoch) * self.seq_len
        # The document holding `pos`: the last one starting at or before it.
        j = bisect.bisect_right(layout.starts, pos) - 1
        out: list[int] = []
        want = self.seq_len + 1
        while len(out) < want:
            offset = pos - layout.starts[j]
            length = layout.starts[j + 1] - layout.starts[j]
            take = min(length - offset, want - len(out))
            if take > 0:
                out.extend(dataset.read(layout.order[j], offset, take))
            pos += take
            j += 1
        return out, s

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
        tokens: list[int] = []
        sources: list[int] = []
        for r in range(micro_batch):
            row, s = self.read_sample(first + r)
            tokens.extend(row)
            sources.append(s)
        return Batch(tokens, sources, first)


def _dump(argv: list[str]) -> None:
    """``python -m zflow_torch.mixture INDEX OUT WORLD MICRO_BATCH STEPS SOURCE...``: every
    rank's batch for STEPS global batches from the start, as little-endian u32 tokens, then
    the rows' source ids, rank after rank and step after step (what runtime/tests/torch_data.rs
    compares with the Rust reader). A SOURCE is its datasets' prefixes, comma-separated."""
    index, out, world, micro, steps, *sources = argv
    datasets: list[TokenSource] = [open_concat(s.split(",")) for s in sources]
    reader = MixtureReader(Path(index), datasets)
    cursor = reader.start("dump")
    data = array("I")
    for _ in range(int(steps)):
        for rank in range(int(world)):
            b = reader.batch(cursor, rank, int(world), int(micro))
            data.extend(b.tokens)
            data.extend(b.sources)
        cursor = cursor.advance(int(world), int(micro))
    Path(out).write_bytes(data.tobytes())


if __name__ == "__main__":
    _dump(sys.argv[1:])
