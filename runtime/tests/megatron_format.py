#!/usr/bin/env python3
"""An independent reader and writer for Megatron-LM indexed datasets (MMIDIDX version 1).

Written from the format description only, with the standard library (no numpy), so the Rust
implementation in runtime/src/data/megatron/ can be checked against a second one.

Usage:
    megatron_format.py read PREFIX
        prints JSON: dtype_code, sequence_lengths, sequence_pointers, document_indices and
        sequences (every sequence's tokens as a list)
    megatron_format.py write PREFIX DTYPE_CODE JSON_DOCS [--seqs-per-doc N]
        writes PREFIX.bin and PREFIX.idx from a JSON list of documents (token lists); with
        --seqs-per-doc N each document is split into N sequences (some may be empty)

The .idx layout (little-endian):
    9 bytes   magic b"MMIDIDX\\x00\\x00"
    u64       version = 1
    u8        dtype code
    u64       sequence count S
    u64       document count D (length of the document index, documents + 1)
    i32 x S   sequence lengths in tokens
    i64 x S   sequence pointers: byte offsets into the .bin
    i64 x D   document index: 0, then the end sequence index of each document
"""

import json
import struct
import sys

MAGIC = b"MMIDIDX\x00\x00"

# dtype code -> struct format character (Megatron's numpy DType enum).
FORMATS = {
    1: "B",  # uint8
    2: "b",  # int8
    3: "h",  # int16
    4: "i",  # int32
    5: "q",  # int64
    6: "d",  # float64
    7: "f",  # float32
    8: "H",  # uint16
}


class Cursor:
    """Reads little-endian values from a bytes object, failing loudly past its end."""

    def __init__(self, data, name):
        self.data = data
        self.name = name
        self.pos = 0

    def take(self, fmt, count=1):
        size = struct.calcsize("<" + fmt) * count
        if self.pos + size > len(self.data):
            sys.exit(f"{self.name}: truncated at byte {self.pos}")
        values = struct.unpack_from(f"<{count}{fmt}", self.data, self.pos)
        self.pos += size
        return list(values)


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = Cursor(f.read(), prefix + ".idx")
    if b"".join(idx.take("c", len(MAGIC))) != MAGIC:
        sys.exit(f"{idx.name}: bad magic")
    (version,) = idx.take("Q")
    if version != 1:
        sys.exit(f"{idx.name}: unsupported version {version}")
    (code,) = idx.take("B")
    if code not in FORMATS:
        sys.exit(f"{idx.name}: unknown dtype code {code}")
    (sequence_count,) = idx.take("Q")
    (document_count,) = idx.take("Q")
    lengths = idx.take("i", sequence_count)
    pointers = idx.take("q", sequence_count)
    document_indices = idx.take("q", document_count)

    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    fmt = FORMATS[code]
    itemsize = struct.calcsize("<" + fmt)
    sequences = []
    for length, pointer in zip(lengths, pointers):
        end = pointer + length * itemsize
        if end > len(data):
            sys.exit(f"{prefix}.bin: truncated: a sequence ends at byte {end}")
        sequences.append(list(struct.unpack_from(f"<{length}{fmt}", data, pointer)))

    return {
        "dtype_code": code,
        "sequence_lengths": lengths,
        "sequence_pointers": pointers,
        "document_indices": document_indices,
        "sequences": sequences,
    }


def split(tokens, parts):
    """Splits a list into `parts` consecutive pieces of near-equal size (some may be empty)."""
    bounds = [len(tokens) * k // parts for k in range(parts + 1)]
    return [tokens[bounds[k] : bounds[k + 1]] for k in range(parts)]


def write(prefix, code, docs, seqs_per_doc):
    fmt = FORMATS[code]
    itemsize = struct.calcsize("<" + fmt)
    lengths, pointers, document_indices = [], [], [0]
    offset = 0
    with open(prefix + ".bin", "wb") as out:
        for doc in docs:
            for sequence in split(doc, seqs_per_doc):
                out.write(struct.pack(f"<{len(sequence)}{fmt}", *sequence))
                lengths.append(len(sequence))
                pointers.append(offset)
                offset += len(sequence) * itemsize
            document_indices.append(len(lengths))

    with open(prefix + ".idx", "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", code))
        out.write(struct.pack("<Q", len(lengths)))
        out.write(struct.pack("<Q", len(document_indices)))
        out.write(struct.pack(f"<{len(lengths)}i", *lengths))
        out.write(struct.pack(f"<{len(pointers)}q", *pointers))
        out.write(struct.pack(f"<{len(document_indices)}q", *document_indices))


def main(args):
    if len(args) == 2 and args[0] == "read":
        json.dump(read(args[1]), sys.stdout)
        print()
    elif len(args) in (4, 6) and args[0] == "write":
        seqs_per_doc = 1
        if len(args) == 6:
            if args[4] != "--seqs-per-doc":
                sys.exit(f"unknown option {args[4]}")
            seqs_per_doc = int(args[5])
            if seqs_per_doc < 1:
                sys.exit("--seqs-per-doc must be at least 1")
        write(args[1], int(args[2]), json.loads(args[3]), seqs_per_doc)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
