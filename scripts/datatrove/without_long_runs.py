"""A copy of a scripts/scale/make_corpus.py corpus without the documents that hold a run of
MAX_RUN or more non-whitespace characters (minified JavaScript, search indexes, base64).

datatrove's Gopher repetition filter splits words with spaCy, whose time grows with the square
of such a run: two 800,000-character ones took it ~930 s. zflow's rules are linear. Both sides
of scripts/datatrove/compare.sh read the copy, so the comparison measures the filters on text,
not spaCy on one pathological input.

Usage: python3 without_long_runs.py CORPUS_DIR OUT_DIR [MAX_RUN]   (MAX_RUN: 10000)
"""

import os
import re
import sys

SEPARATOR = "\n\x1e\n"  # make_corpus.py's record separator


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    max_run = int(sys.argv[3]) if len(sys.argv) == 4 else 10_000
    long_run = re.compile(rf"\S{{{max_run}}}")
    os.makedirs(out, exist_ok=True)
    kept = dropped = dropped_bytes = 0
    for name in sorted(os.listdir(src)):
        if not name.endswith(".txt"):
            continue
        with open(os.path.join(src, name), encoding="utf-8") as f:
            docs = f.read().split(SEPARATOR)
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            for doc in docs:
                if not doc:
                    continue
                if long_run.search(doc):
                    dropped += 1
                    dropped_bytes += len(doc.encode())
                    continue
                f.write(doc + SEPARATOR)
                kept += 1
    print(
        f"kept {kept} documents; left out {dropped} ({dropped_bytes / 1e6:.1f} MB) with a run of "
        f"{max_run}+ non-space characters"
    )


if __name__ == "__main__":
    main()
