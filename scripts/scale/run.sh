#!/usr/bin/env bash
# Issue 20's scale benchmark: a >= 2 GB corpus of real text on this machine (Rust's HTML docs,
# cargo's crate sources, Python sources: make_corpus.py, 96 files) through fetch, 32-way sharded
# ingest with exact dedup across shards, the tokenizer, tokenize and mix (scale.yaml); once
# locally with -j 2, once on the local Slurm (scripts/slurm-local.sh start first). Prints wall
# time and peak RSS of each, and whether the two stores' outputs are byte-identical.
# Usage: scripts/scale/run.sh WORKDIR   (needs ~12 GB free there)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="${1:?usage: run.sh WORKDIR}"
zflow="$repo/target/debug/zflow"
mkdir -p "$work" && cd "$work"
[ -d corpus ] || python3 "$here/make_corpus.py" corpus ~/.rustup/toolchains/*/share/doc \
  ~/.cargo/registry/src "$repo/target/torch-venv/lib/python3.11/site-packages" \
  $( [ -d ~/.pyenv/versions ] && echo ~/.pyenv/versions )
cp "$here/scale.yaml" r.yaml
rm -rf store-local store-slurm
/usr/bin/time -v "$zflow" run r.yaml --store store-local -j 2 > local.log 2> local.err
echo "local rc=$?"; grep -E "Elapsed|Maximum resident" local.err
sed 's/^name: scale-bench/name: scale-bench\nexecutor: {kind: slurm, poll_s: 1}/' r.yaml > r-slurm.yaml
SLURM_CONF="$repo/target/slurm-local/slurm.conf" /usr/bin/time -v "$zflow" run r-slurm.yaml \
  --store store-slurm > slurm.log 2> slurm.err
echo "slurm rc=$?"; grep -E "Elapsed|Maximum resident" slurm.err
python3 - <<'PY'
import glob, json
def outputs(store):
    return {json.load(open(m))["stage"]: json.load(open(m))["content_hash"]
            for m in glob.glob(f"{store}/*/.zflow-manifest.json")}
a, b = outputs("store-local"), outputs("store-slurm")
print(f"{len(a)} stages local, {len(b)} on Slurm; byte-identical outputs: {a == b}")
PY
