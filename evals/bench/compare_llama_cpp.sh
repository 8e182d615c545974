#!/usr/bin/env bash
# GGUF scoring throughput of zflow's adapter against llama.cpp, on the same model and the same
# token ids, in one command:
#   evals/bench/compare_llama_cpp.sh [--threads N] [--rounds R] [--limit DOCS]
# 1. installs llama.cpp as its Python users do: llama-cpp-python 0.3.16 from PyPI, built from
#    its sdist with this machine's native CPU flags (CMAKE_ARGS=-DGGML_NATIVE=ON), into
#    target/bench/llama-cpp-venv (once; the build takes minutes);
# 2. fetches Gemma 3 270M and the benchmark data with their pins (scripts/fixtures.sh);
# 3. writes the piqa + arc_easy requests once (first DOCS documents of each, default 100);
# 4. scores them R times on each side (default 2), alternating zflow, llama.cpp, zflow, ...,
#    and prints every run's input tokens/s and each round's ratio. Both sides use N threads
#    (default 2). llama.cpp reuses each question's KV cache and computes logits only where a
#    continuation token is scored, its best case.
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=2 rounds=2 limit=100
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--rounds R] [--limit DOCS]" >&2; exit 2 ;;
  esac
done
venv=target/bench/llama-cpp-venv
if ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  echo "installing llama-cpp-python 0.3.16 (built with -DGGML_NATIVE=ON) into $venv" >&2
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install --quiet --no-cache-dir llama-cpp-python==0.3.16 numpy
fi
eval "$(scripts/fixtures.sh)"
cargo build --quiet -p zflow-evals --example bench_gguf
bench=target/debug/examples/bench_gguf
work=target/bench/llama-cpp
mkdir -p "$work"
model=(--model "$ZFLOW_EVAL_GGUF")
"$bench" dump "${model[@]}" --tokenizer "$ZFLOW_EVAL_TOKENIZER" --data "$ZFLOW_EVAL_DATA" --tasks piqa,arc_easy --limit "$limit" --out "$work/requests.jsonl"
rate() { sed -n 's/.*s: \([0-9.]*\) input tokens\/s.*/\1/p' "$1"; }
for round in $(seq "$rounds"); do
  RAYON_NUM_THREADS=$threads "$bench" score "${model[@]}" --tokenizer "$ZFLOW_EVAL_TOKENIZER" --requests "$work/requests.jsonl" --out "$work/zflow.jsonl" | tee "$work/zflow.txt"
  "$venv/bin/python" evals/bench/llama_cpp_score.py "${model[@]}" --requests "$work/requests.jsonl" --threads "$threads" --compare "$work/zflow.jsonl" | tee "$work/llama.txt"
  echo "round $round: zflow $(rate "$work/zflow.txt") vs llama.cpp $(rate "$work/llama.txt") input tokens/s: $(awk -v a="$(rate "$work/zflow.txt")" -v b="$(rate "$work/llama.txt")" 'BEGIN {printf "%.2fx", a / b}')"
done
