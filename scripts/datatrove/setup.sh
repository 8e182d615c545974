#!/usr/bin/env bash
# The Python side of the zflow-vs-datatrove benchmark: a venv at target/datatrove-venv with
# datatrove 0.10.1 and what pipeline.py needs (requirements.txt, hash-pinned, --no-deps).
# Idempotent: does nothing when the venv already holds this requirements.txt's packages.
# Usage: scripts/datatrove/setup.sh            (reaches PyPI)
#        WHEELS=DIR scripts/datatrove/setup.sh  (offline, from wheels `pip download`ed into DIR)
# PYTHON picks the interpreter (default python3; the pinned wheels are for CPython 3.11).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$repo/target/datatrove-venv"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import datatrove, spacy, tokenizers, orjson, xxhash" 2>/dev/null; then
  echo "datatrove venv up to date: $venv"
  exit 0
fi

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
rm -f "$stamp"
index=()
[ -n "${WHEELS:-}" ] && index=(--no-index --find-links "$WHEELS")
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet \
  --require-hashes --no-deps "${index[@]}" -r "$req"
"$venv/bin/python" -m pip check
"$venv/bin/python" - <<'PY'
import spacy, datatrove, importlib.metadata as m
# datatrove's English word tokenizer: spaCy's blank pipeline, nothing downloaded.
nlp = spacy.blank("en"); nlp.add_pipe("sentencizer")
assert [t.text for t in nlp("Hello, world.")] == ["Hello", ",", "world", "."]
print("datatrove", m.version("datatrove"), "spacy", spacy.__version__)
PY
echo "$want" > "$stamp"
echo "datatrove venv ready: $venv"
