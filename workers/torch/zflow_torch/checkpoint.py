"""zflow's checkpoint format (``runtime/src/checkpoint``), written and read by the torch
engine: ``step-N/`` folders committed atomically (files written into ``.tmp-step-N/`` and
fsynced, the BLAKE3 manifest last, then a rename), per-rank parts voted with ``part-R.json``
and committed by rank 0, verification, quarantine of folders that do not verify, retention,
and the ZeRO-1 layout (``runtime/src/checkpoint/layout.rs``) with its optimizer shard files.

An optimizer shard file is a sequence of ``(parameter id u64 LE, length u64 LE, record)``
entries sorted by id; ``zflow ckpt reshape`` moves entries between files without reading them.
A record (``runtime/src/checkpoint/optimizer.rs`` is its page) is ``RECORD`` followed by a
safetensors file of the parameter's optimizer state in zflow's layout (a linear weight's state
``[in, out]``, the transpose of torch's). Muon's state is ``momentum_buffer`` (torch's
``b <- mu b + (1 - mu) g``), or ``velocity`` in a checkpoint of the retired native engine
(``v <- mu v + g``), read as ``(1 - mu) v``; AdamW's is ``step``, ``exp_avg`` and
``exp_avg_sq``. Anything else is refused, naming the file and the parameter.
"""

import json
import os
import shutil
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

WEIGHTS_FORMAT = "zflow-zaya1"
RECORD = b"ZFOPTIM1"
VELOCITY = "velocity"
MOMENTUM_BUFFER = "momentum_buffer"
# The state each optimizer keeps per parameter (torch's names).
STATE_KEYS = {"muon": [MOMENTUM_BUFFER], "adamw": ["exp_avg", "exp_avg_sq", "step"]}
OPTIMIZERS = ["muon", "adamw"]
ENTRY = struct.Struct("<QQ")


# Bytes this process has read from checkpoint files (the log reports them after a resume).
bytes_read = [0]


class CheckpointError(ValueError):
    """A checkpoint that does not verify or cannot be read (named with the file)."""


def dir_name(step: int) -> str:
    return f"step-{step:08}"


def shard_file(optimizer: str, rank: int) -> str:
    return f"optim-{optimizer}.rank-{rank}.bin"


def tmp_dir(d: Path) -> Path:
    return d.with_name(f".tmp-{d.name}")


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_files(tmp: Path, files: list[tuple[str, bytes]]) -> dict[str, list[Any]]:
    """Writes and fsyncs ``files`` into ``tmp``; returns their (size, BLAKE3) entries. The
    hashing runs in a second thread while the files are written and flushed (both release the
    GIL)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        digests = pool.submit(
            lambda: [
                blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() for _, data in files
            ]
        )
        opened = []
        try:
            for name, data in files:
                f = open(tmp / name, "wb")  # closed below, after the fsyncs
                opened.append(f)
                f.write(data)
            for f in opened:
                f.flush()
                os.fsync(f.fileno())
        finally:
            for f in opened:
                f.close()
        hashes = digests.result()
    return {name: [len(data), h] for (name, data), h in zip(files, hashes, strict=True)}


def _finish(d: Path, files: dict[str, list[Any]]) -> None:
    tmp = tmp_dir(d)
    step = int(d.name[5:]) if d.name.startswith("step-") else 0
    manifest = {"step": step, "files": dict(sorted(files.items()))}
    _write_synced(tmp / "manifest.json", json.dumps(manifest, indent=2).encode())
    _fsync_dir(tmp)
    # A checkpoint of this step may exist already (a rerun after a crash right after the
    # commit): the new one replaces it.
    if d.exists():
        shutil.rmtree(d)
    os.rename(tmp, d)
    _fsync_dir(d.parent)


def commit(
    root: Path,
    step: int,
    rank: int,
    world: int,
    files: list[tuple[str, bytes]],
    before_commit: Callable[[Path, list[tuple[str, bytes]]], None] | None = None,
    part_timeout_s: float = 900.0,
) -> Path | None:
    """Writes this rank's ``files`` of the step-``step`` checkpoint; rank 0 commits once every
    rank's part is there. Returns the committed folder on rank 0. ``before_commit`` runs
    after the temporary folder exists (fault injection)."""
    import time

    d = root / dir_name(step)
    tmp = tmp_dir(d)
    tmp.mkdir(parents=True, exist_ok=True)
    if before_commit is not None:
        before_commit(tmp, files)
    part = write_files(tmp, files)
    if world == 1:
        _finish(d, part)
        return d
    # Atomically: rank 0 reads the vote as soon as the name exists.
    vote = tmp / f".part-{rank}.json.tmp"
    _write_synced(vote, json.dumps(part).encode())
    os.rename(vote, tmp / f"part-{rank}.json")
    if rank != 0:
        return None
    every: dict[str, list[Any]] = {}
    started = time.monotonic()
    for r in range(world):
        path = tmp / f"part-{r}.json"
        while not path.exists():
            if time.monotonic() - started > part_timeout_s:
                raise CheckpointError(
                    f"{d}: rank {r} did not write its part within {part_timeout_s} s"
                )
            time.sleep(0.02)
        every.update(json.loads(path.read_bytes()))
        path.unlink()
    _finish(d, every)
    return d


def read_verified(d: Path) -> dict[str, bytes]:
    """Every file of the checkpoint ``d``, after checking each against the manifest."""
    mpath = d / "manifest.json"
    try:
        manifest = json.loads(mpath.read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mpath}: {e}") from e
    out = {}
    for name, (size, digest) in manifest["files"].items():
        path = d / name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CheckpointError(f"reading {path}: {e}") from e
        bytes_read[0] += len(data)
        if len(data) != size:
            raise CheckpointError(f"{path}: {len(data)} bytes, the manifest says {size}")
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != digest:
            raise CheckpointError(f"{path}: checksum mismatch")
        out[name] = data
    return out


def listing(root: Path) -> list[tuple[int, Path]]:
    """The ``step-N`` folders under ``root``, newest first."""
    found = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith("step-") and p.name[5:].isdigit():
                found.append((int(p.name[5:]), p))
    return sorted(found, reverse=True)


def read_files(d: Path, names: list[str]) -> dict[str, bytes]:
    """The files ``names`` of checkpoint ``d``, unverified: for the ranks that read their part
    of a checkpoint another rank has just verified whole (``newest_verified``)."""
    out = {}
    for name in names:
        path = d / name
        try:
            out[name] = path.read_bytes()
        except OSError as e:
            raise CheckpointError(f"reading {path}: {e}") from e
        bytes_read[0] += len(out[name])
    return out


def remove_unfinished(root: Path) -> None:
    """Removes ``.tmp-*`` folders: checkpoints whose writing never finished."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p)


def newest_verified(
    root: Path, warn: Callable[[str], None]
) -> tuple[Path, dict[str, bytes]] | None:
    """The newest checkpoint that verifies, with its files. Newer ones that do not verify are
    moved into ``quarantine/``; older ones are not read."""
    for _, d in listing(root):
        try:
            return d, read_verified(d)
        except CheckpointError as e:
            to = root / "quarantine" / d.name
            to.parent.mkdir(parents=True, exist_ok=True)
            if to.exists():
                shutil.rmtree(to)
            os.rename(d, to)
            warn(f"quarantined checkpoint {to} (it does not verify: {e}); it will not be loaded")
    return None


def shards_holding(layout_json: bytes, optimizer: str, ids: set[int]) -> list[str]:
    """The shard files of ``optimizer`` that hold the records of parameter ids ``ids``, by
    the checkpoint's own layout (which may have another number of ranks)."""
    saved = json.loads(layout_json)
    owners = sorted({s["owner"] for s in saved["params"] if s["id"] in ids})
    return [shard_file(optimizer, r) for r in owners]


def retain(root: Path, keep: int) -> None:
    """Keeps the newest ``keep`` checkpoints."""
    for _, d in listing(root)[max(keep, 1) :]:
        shutil.rmtree(d)


def layout(params: list[tuple[str, int, int]], dp: int) -> dict[str, Any]:
    """ZeRO-1 ownership of whole tensors (``zero::Layout::new``): largest first, each to the
    least-loaded rank; ties keep model order and the lowest rank."""
    order = sorted(range(len(params)), key=lambda i: (-params[i][2], i))
    load = [0] * dp
    owner = [0] * len(params)
    for i in order:
        r = min(range(dp), key=lambda r: (load[r], r))
        load[r] += params[i][2]
        owner[i] = r
    slots = [
        {"name": n, "id": pid, "numel": numel, "owner": o}
        for (n, pid, numel), o in zip(params, owner, strict=True)
    ]
    return {"dp": dp, "params": slots}


def entries(data: bytes, origin: str) -> list[tuple[int, bytes]]:
    """The ``(id, record)`` entries of a shard file."""
    out = []
    at = 0
    while at < len(data):
        if at + ENTRY.size > len(data):
            raise CheckpointError(f"{origin}: truncated optimizer state at byte {at}")
        pid, n = ENTRY.unpack_from(data, at)
        at += ENTRY.size
        if at + n > len(data):
            raise CheckpointError(f"{origin}: entry {pid} wants {n} bytes at byte {at}")
        out.append((pid, data[at : at + n]))
        at += n
    return out


def join_entries(items: list[tuple[int, bytes]]) -> bytes:
    return b"".join(ENTRY.pack(pid, len(r)) + r for pid, r in sorted(items))


def encode_state(state: dict[str, torch.Tensor], linear: bool) -> bytes:
    """One parameter's optimizer state as a record, in zflow's layout (``linear``: the
    parameter is a linear weight, whose 2-D state is transposed)."""
    tensors = {}
    for k, v in state.items():
        v = v.detach().float().cpu()
        tensors[k] = (v.T if linear and v.dim() == 2 else v).contiguous()
    return RECORD + st_save(tensors)


def decode_state(record: bytes, linear: bool, momentum: float) -> dict[str, torch.Tensor]:
    """A record as torch's state of the parameter (``linear`` as for ``encode_state``), a
    native checkpoint's Muon velocity as torch's momentum buffer at this run's ``momentum``.
    Raises ValueError for anything that is not a record of this format."""
    if not record.startswith(RECORD):
        raise ValueError(f"not an optimizer record of this format (it begins {record[:8]!r})")
    out = {}
    for k, v in st_load(record[len(RECORD) :]).items():
        if linear and v.dim() == 2:
            v = v.T.contiguous()
        if k == VELOCITY:
            k, v = MOMENTUM_BUFFER, v * (1.0 - momentum)
        out[k] = v
    return out


def check_state(optimizer: str, state: dict[str, torch.Tensor], shape: list[int]) -> None:
    """Raises ValueError unless ``state`` is what ``optimizer`` keeps for a parameter of
    ``shape``."""
    if sorted(state) != STATE_KEYS[optimizer]:
        raise ValueError(f"holds {sorted(state)}, where {optimizer} keeps {STATE_KEYS[optimizer]}")
    for k, v in state.items():
        want = [] if k == "step" else shape
        if list(v.shape) != want or v.dtype != torch.float32:
            raise ValueError(f"`{k}` is {v.dtype} {list(v.shape)}, expected float32 {want}")


def read_shard(
    files: dict[str, bytes], d: Path, optimizer: str, mine: set[int]
) -> dict[int, bytes]:
    """The records of ``optimizer`` for the parameter ids ``mine``, from whichever ranks'
    files hold them (the saved layout may have another number of ranks)."""
    out = {}
    for name in shards_holding(files["layout.json"], optimizer, mine):
        if name not in files:
            raise CheckpointError(f"{d}: its layout puts records in {name}, which is missing")
        for pid, record in entries(files[name], f"{d}/{name}"):
            if pid in mine:
                out[pid] = record
    return out


class Saver:
    """Writes checkpoints in a background thread (one in flight; the next save waits); its
    error fails the run at the next wait."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, work: Callable[[], None], wait: bool) -> None:
        self.wait()
        if not self.asynchronous or wait:
            work()
            return

        def run() -> None:
            try:
                work()
            except BaseException as e:  # reported by wait(), on the training thread
                self.error = e

        self.thread = threading.Thread(target=run, name="checkpoint-writer", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            e, self.error = self.error, None
            raise e


if __name__ == "__main__":
    # What tests/torch_model.rs compares with runtime's checkpoint::optimizer.
    print(
        json.dumps(
            {
                "record": RECORD.decode(),
                "velocity": VELOCITY,
                "momentum_buffer": MOMENTUM_BUFFER,
                "adamw": STATE_KEYS["adamw"],
            }
        )
    )
