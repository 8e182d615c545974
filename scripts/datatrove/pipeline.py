"""datatrove 0.10.1's side of the zflow-vs-datatrove benchmark: the same work as zflow's recipe
(records of the text files -> Gopher repetition, Gopher quality, C4 quality and FineWeb quality
filters with datatrove's defaults -> PIIFormatter -> MinHash near dedup -> tokenize), with
datatrove's LocalPipelineExecutor. Prints one JSON line at the end.

Usage (in the venv of scripts/datatrove/setup.sh):
  target/datatrove-venv/bin/python scripts/datatrove/pipeline.py CORPUS_DIR TOKENIZER_JSON WORK_DIR \
      [--tasks N] [--workers N]

Stages (one LocalPipelineExecutor each, run one after the other):
  filter     reader -> 4 filters -> PIIFormatter -> JsonlWriter (uncompressed) -> MinHash signatures
  buckets    MinhashDedupBuckets (num_buckets tasks: datatrove needs tasks % num_buckets == 0)
  cluster    MinhashDedupCluster (one task, as datatrove requires)
  tokenize   JsonlReader (task r reads filter's task r's file) -> MinhashDedupFilter ->
             DocumentTokenizer (no shuffling, EOS after each document, as zflow's tokenize
             stage writes them)
WORK_DIR is emptied of this script's folders first, so every run does all the work.
"""

import argparse
import json
import os
import shutil
import sys
import time


RECORD_SEPARATOR = b"\n\x1e\n"  # scripts/scale/make_corpus.py: a line holding only 0x1e


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", help="folder of text files, documents separated by a line holding only 0x1e")
    p.add_argument("tokenizer", help="a tokenizer.json (HF tokenizers)")
    p.add_argument("work", help="work folder (signatures, buckets, filtered documents, tokens, logs)")
    p.add_argument("--tasks", type=int, default=1, help="tasks of the filter and tokenize stages (default 1)")
    p.add_argument("--workers", type=int, default=1, help="tasks run at once (default 1: per-core throughput)")
    p.add_argument("--glob", default="*.txt", help="corpus files (default *.txt)")
    p.add_argument("--eos-token", default="<|endoftext|>", help="appended to every document; '' for none")
    p.add_argument("--nfc", action="store_true", help="NFC-normalise documents as read (zflow's ingest default)")
    return p.parse_args()


args = parse_args()
# One worker measures one core: keep the tokenizers library's Rayon pool from using the others
# (datatrove's DocumentTokenizer calls encode_batch). An explicit setting wins.
if args.workers == 1:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
# Everything is local (the tokenizer is a file): never ask the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from importlib.metadata import version  # noqa: E402

from datatrove.data import DocumentsPipeline  # noqa: E402
from datatrove.executor import LocalPipelineExecutor  # noqa: E402
from datatrove.pipeline.dedup import (  # noqa: E402
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.dedup.minhash import MinhashConfig  # noqa: E402
from datatrove.pipeline.filters import (  # noqa: E402
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from datatrove.pipeline.formatters import PIIFormatter  # noqa: E402
from datatrove.pipeline.readers import JsonlReader  # noqa: E402
from datatrove.pipeline.readers.base import BaseDiskReader  # noqa: E402
from datatrove.pipeline.tokens import DocumentTokenizer  # noqa: E402
from datatrove.pipeline.writers import JsonlWriter  # noqa: E402
from datatrove.utils.hashing import HashConfig  # noqa: E402


class RecordTextReader(BaseDiskReader):
    """Text files of records separated by `separator` (bytes), one Document per record, in file
    order. Records blank after strip() are skipped (zflow's `empty` rule; `min_chars: 1` is the
    same). Counts `records` and `bytes_in` (UTF-8 bytes of every record, as zflow's bytes_in)."""

    name = "📄 Record text"

    def __init__(self, data_folder, separator: bytes = RECORD_SEPARATOR, nfc: bool = False, **kwargs):
        super().__init__(data_folder, **kwargs)
        self.separator = separator
        self.nfc = nfc

    def read_file(self, filepath: str) -> DocumentsPipeline:
        import unicodedata

        # Binary, so "\r\n" stays as it is (text mode would translate it); the file at once:
        # the corpus' files are ~22 MB.
        with self.data_folder.open(filepath, "rb") as f:
            raw = f.read()
        for i, record in enumerate(raw.split(self.separator)):
            with self.track_time():
                self.stat_update("records")
                self.stat_update("bytes_in", value=len(record))
                text = record.decode("utf-8")
                if not text.strip():
                    self.stat_update("empty")
                    continue
                if self.nfc:
                    text = unicodedata.normalize("NFC", text)
                document = self.get_document_from_dict({"text": text}, filepath, i)
            if document:
                yield document


class RankJsonlReader(JsonlReader):
    """Task r reads the file JsonlWriter's task r wrote ("{r:05d}.jsonl"), whose document
    indices MinhashDedupSignature and MinhashDedupCluster used, and nothing when that task
    wrote nothing (a plain JsonlReader would shift the files between tasks then)."""

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        name = f"{rank:05d}.jsonl"
        if self.data_folder.exists(name):
            for doc in self.read_files_shard([name]):
                self.update_doc_stats(doc)
                yield doc


# zflow's near_dedup defaults (stages/src/minhash.rs): 5-word shingles, 14 bands of 8 rows,
# 64-bit values mod 2^61 - 1. datatrove's own defaults are the same; its shingle hash is xxhash64
# (zflow: blake3) and its permutations come from numpy's RandomState(seed) (zflow: SplitMix64).
MINHASH = MinhashConfig(
    n_grams=5,
    num_buckets=14,
    hashes_per_bucket=8,
    seed=1,
    hash_config=HashConfig(precision=64, hash_fc="xxhash"),
)


def stage_dirs(work):
    return {
        name: os.path.join(work, name)
        for name in ("filtered", "signatures", "buckets", "remove_ids", "tokens", "logs")
    }


def main():
    t0 = time.perf_counter()
    work = os.path.abspath(args.work)
    d = stage_dirs(work)
    for path in d.values():
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    logs = d["logs"]

    tokenizer_path = os.path.abspath(args.tokenizer)
    from tokenizers import Tokenizer

    eos = args.eos_token or None
    if eos is not None and Tokenizer.from_file(tokenizer_path).token_to_id(eos) is None:
        print(f"note: {eos!r} is not in the tokenizer's vocabulary; no EOS appended", file=sys.stderr)
        eos = None

    stages = {
        "filter": LocalPipelineExecutor(
            pipeline=[
                RecordTextReader(os.path.abspath(args.corpus), nfc=args.nfc, glob_pattern=args.glob),
                GopherRepetitionFilter(),
                GopherQualityFilter(),
                C4QualityFilter(),
                FineWebQualityFilter(),
                PIIFormatter(),
                JsonlWriter(d["filtered"], compression=None),
                MinhashDedupSignature(output_folder=d["signatures"], config=MINHASH),
            ],
            tasks=args.tasks,
            workers=args.workers,
            logging_dir=os.path.join(logs, "filter"),
        ),
        "buckets": LocalPipelineExecutor(
            pipeline=[MinhashDedupBuckets(input_folder=d["signatures"], output_folder=d["buckets"], config=MINHASH)],
            tasks=MINHASH.num_buckets,
            workers=args.workers,
            logging_dir=os.path.join(logs, "buckets"),
        ),
        "cluster": LocalPipelineExecutor(
            pipeline=[MinhashDedupCluster(input_folder=d["buckets"], output_folder=d["remove_ids"], config=MINHASH)],
            tasks=1,
            workers=1,
            logging_dir=os.path.join(logs, "cluster"),
        ),
        "tokenize": LocalPipelineExecutor(
            pipeline=[
                RankJsonlReader(d["filtered"], compression=None),  # same tasks as "filter"
                MinhashDedupFilter(input_folder=d["remove_ids"]),
                DocumentTokenizer(
                    output_folder=d["tokens"],
                    tokenizer_name_or_path=tokenizer_path,
                    eos_token=eos,
                    shuffle_documents=False,
                ),
            ],
            tasks=args.tasks,
            workers=args.workers,
            logging_dir=os.path.join(logs, "tokenize"),
        ),
    }
    seconds = {}
    for name, executor in stages.items():
        t = time.perf_counter()
        executor.run()
        seconds[name] = round(time.perf_counter() - t, 3)
    total = time.perf_counter() - t0

    stats = {name: json.load(open(os.path.join(logs, name, "stats.json"))) for name in stages}
    result = summarize(stats)
    result = {
        "seconds": round(total, 3),
        **result,
        "per_stage_seconds": seconds,
        "per_step_seconds": {
            f"{name}/{step}": round(s, 3) for name in stages for step, s in step_times(stats[name]).items()
        },
        "tasks": args.tasks,
        "workers": args.workers,
        "mb_per_s": round(result["bytes_in"] / 1e6 / total, 3) if total else None,
        "tokens_per_s": round(result["tokens"] / total, 1) if total else None,
        "datatrove": version("datatrove"),
    }
    print(json.dumps(result))


def step_stats(stats, cls_name):
    """The stats dict of the step whose name contains `cls_name` (datatrove names steps
    "<type>: <name>")."""
    for step in stats:
        if cls_name in step["name"]:
            return step["stats"]
    return {}


def count(stats, key):
    v = stats.get(key, 0)
    return v["total"] if isinstance(v, dict) else v


def step_times(stats):
    """Seconds each step spent on its own work, summed over tasks. datatrove times
    MinhashDedupSignature's whole loop, the steps before it included (they are generators it
    pulls from): their times are taken off its own."""
    out = {}
    before = 0.0
    for step in stats:
        t = (step.get("time_stats") or {}).get("total")
        if t is None:
            continue
        name = step["name"].split(": ", 1)[-1] if ": " in step["name"] else step["name"]
        name = name.encode("ascii", "ignore").decode().strip()
        out[name] = t - before if MinhashDedupSignature.name in step["name"] else t
        before += out[name]
    return out


def summarize(stats):
    f = stats["filter"]
    reader = step_stats(f, RecordTextReader.name)
    dropped = {}
    reasons = {}
    for key, cls in [
        ("gopher_repetition", GopherRepetitionFilter),
        ("gopher_quality", GopherQualityFilter),
        ("c4", C4QualityFilter),
        ("fineweb", FineWebQualityFilter),
    ]:
        s = step_stats(f, cls.name)
        dropped[key] = count(s, "dropped")
        reasons[key] = {k.removeprefix("dropped_"): count(s, k) for k in s if k.startswith("dropped_")}
    t = stats["tokenize"]
    mf = step_stats(t, MinhashDedupFilter.name)
    dropped["near_dedup"] = count(mf, "dropped")
    pii = step_stats(f, PIIFormatter.name)
    tok = step_stats(t, DocumentTokenizer.name)
    return {
        "documents_in": count(reader, "documents"),
        "documents_kept": count(mf, "forwarded"),
        "tokens": count(tok, "tokens"),
        "bytes_in": count(reader, "bytes_in"),
        "dropped": dropped,
        "dropped_reasons": reasons,
        "empty_records": count(reader, "empty"),
        "pii_documents": count(pii, "total"),
    }


if __name__ == "__main__":
    main()
