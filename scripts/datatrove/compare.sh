#!/usr/bin/env bash
# zflow against datatrove 0.10.1 on the same corpus: record-separated text files -> Gopher
# repetition, Gopher quality, C4 and FineWeb filters (datatrove's defaults) -> PII redaction ->
# MinHash near dedup (5-grams, 14 bands of 8) -> tokenize with the same tokenizer.json. One core
# each (taskset), alternating zflow / datatrove, twice. Prints, per run: wall seconds, input
# MB/s, output tokens/s, peak RSS, documents kept and tokens.
#
# Usage: scripts/datatrove/compare.sh CORPUS_DIR TOKENIZER_JSON WORK_DIR [ZFLOW_BINARY]
#   CORPUS_DIR: scripts/scale/make_corpus.py's output (or some of its files), through
#     without_long_runs.py (datatrove's spaCy takes time quadratic in a run of non-space
#     characters: a minified script of 800,000 characters holds it for minutes)
#   ZFLOW_BINARY: default target/release/zflow (build it with `cargo build --release`)
# Needs scripts/datatrove/setup.sh's venv (target/datatrove-venv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
corpus="$(cd "${1:?usage: compare.sh CORPUS_DIR TOKENIZER_JSON WORK_DIR [ZFLOW]}" && pwd)"
tokenizer="$(realpath "${2:?tokenizer.json}")"
work="${3:?work dir}"
zflow="${4:-$repo/target/release/zflow}"
python="$repo/target/datatrove-venv/bin/python"
mkdir -p "$work" && work="$(cd "$work" && pwd)"
bytes=$(cat "$corpus"/*.txt | wc -c)
echo "corpus: $(ls "$corpus"/*.txt | wc -l) files, $bytes bytes; zflow: $zflow; one core each"

cat > "$work/r.yaml" <<EOF
name: datatrove-compare
sources:
  web:
    url: "$corpus/*.txt"
    format: text
    delimiter: "\n\x1e\n"
    min_chars: 1
    near_dedup: {}
    filters: {gopher_repetition: {}, gopher_quality: {}, c4: {}, fineweb: {}, pii: {}}
tokenizer:
  file: $work/tokenizer.json
  # GPT-NeoX's one special token begins, ends and pads (datatrove appends it after each document).
  bos: "<|endoftext|>"
  eos: "<|endoftext|>"
  pad: "<|endoftext|>"
EOF
# zflow's tokenizer stage reads a file named tokenizer.json.
cp "$tokenizer" "$work/tokenizer.json"

# The peak RSS (MB) and wall seconds of a /usr/bin/time -v log.
rss_mb() { awk '/Maximum resident/ {printf "%.0f", $6/1024}' "$1"; }
wall_s() { awk -F': ' '/Elapsed \(wall/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$1"; }
report() { # name, log, documents, tokens
  local w; w=$(wall_s "$2")
  printf '%-10s %8.1f s %8.2f MB/s %10.0f tokens/s  peak RSS %6s MB  kept %9s documents  %11s tokens\n' \
    "$1" "$w" "$(echo "$bytes / $w / 1000000" | bc -l)" "$(echo "$4 / $w" | bc -l)" "$(rss_mb "$2")" "$3" "$4"
}

run_zflow() {
  rm -rf "$work/zflow-store"
  (cd "$work" && taskset -c 0 /usr/bin/time -v "$zflow" run r.yaml --store "$work/zflow-store" -j 1 \
    > "$work/zflow.out" 2> "$work/zflow.err")
  local stats; stats=$(cat "$work"/zflow-store/tokenize.web-*/stats.json)
  local docs tokens
  docs=$(echo "$stats" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["documents"]+s["heldout_documents"])')
  tokens=$(echo "$stats" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["tokens"]+s["heldout_tokens"])')
  report zflow "$work/zflow.err" "$docs" "$tokens"
}

run_datatrove() {
  taskset -c 0 /usr/bin/time -v "$python" "$here/pipeline.py" "$corpus" "$tokenizer" "$work/datatrove" \
    --nfc > "$work/datatrove.out" 2> "$work/datatrove.err"
  local line; line=$(tail -1 "$work/datatrove.out")
  local docs tokens
  docs=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["documents_kept"])')
  tokens=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  report datatrove "$work/datatrove.err" "$docs" "$tokens"
}

for round in 1 2; do
  run_zflow
  run_datatrove
done
echo "zflow's drops by rule:"
python3 - "$work" <<'PY'
import glob, json, sys
s = json.load(open(glob.glob(f"{sys.argv[1]}/zflow-store/ingest.web-*/stats.json")[0]))
print("  read", s["docs_in"], "kept", s["docs_out"], {r: n for r, n, _ in s["dropped"] if n})
PY
echo "datatrove's:"
tail -1 "$work/datatrove.out"
