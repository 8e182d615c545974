#!/usr/bin/env bash
# Scoring throughput, zflow against lm-evaluation-harness's hf backend (the install run.sh uses),
# on the same Hugging Face ZAYA1 folder, tasks and documents, alternating, ROUNDS times:
# - generation: gsm8k_cot and humaneval (output tokens/s: the generated texts' tokens, counted
#   with the model's tokenizer);
# - log-likelihood: arc_easy and boolq (input tokens/s: every request's context and
#   continuation).
# Usage: scripts/lm-eval/bench.sh MODEL_DIR WORK_DIR [LIMIT] [ROUNDS]
#   LIMIT documents per task (default 16), ROUNDS (default 2); LM_EVAL_BATCH (default 16) is
#   lm-eval's --batch_size, ZFLOW (default target/debug/zflow) the binary.
# Each side's samples are compared afterwards (compare.py), so both did the same work.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
model="$(cd "$1" && pwd)"
mkdir -p "$2"
work="$(cd "$2" && pwd)"
limit="${3:-16}"
rounds="${4:-2}"
zflow="${ZFLOW:-$repo/target/debug/zflow}"
data="${ZFLOW_EVAL_DATA:-$repo/target/test-fixtures/data-root}"
python="$repo/target/lm-eval-venv/bin/python"

count() { # KIND SAMPLES...: tokens of the generated texts, or of the scored requests
  "$python" - "$model/tokenizer.json" "$@" <<'EOF'
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
kind, files = sys.argv[2], sys.argv[3:]
n = 0
for f in files:
    data = json.load(open(f))
    for task in data["tasks"]:
        for s in task["samples"]:
            for r in s["requests"]:
                if kind == "generated" and r["type"] == "generate":
                    n += len(tok.encode(r["text"], add_special_tokens=False).ids)
                elif kind == "input" and r["type"] == "loglikelihood":
                    n += len(tok.encode(r["context"] + r["continuation"], add_special_tokens=False).ids)
print(n)
EOF
}

for kind in generation loglikelihood; do
  if [ "$kind" = generation ]; then tasks="gsm8k_cot humaneval"; else tasks="arc_easy boolq"; fi
  for round in $(seq "$rounds"); do
    out="$work/$kind-$round"
    rm -rf "$out"; mkdir -p "$out"
    start=$(date +%s.%N)
    TOGETHER=1 BATCH_SIZE="${LM_EVAL_BATCH:-16}" TASKS="$(for t in $tasks; do printf '%s_local ' "$t"; done)" \
      "$here/run.sh" "$model" "$out/lm-eval" "$limit" > "$out/lm-eval.log" 2>&1
    lm=$(echo "$(date +%s.%N) - $start" | bc)
    start=$(date +%s.%N)
    "$zflow" eval --model "$model" --tokenizer "$model/tokenizer.json" --eos '<|endoftext|>' \
      --tasks "$(echo $tasks | tr ' ' ,)" --limit "$limit" --data "$data" \
      --cache "$out/zflow-cache" --batch-tokens 65536 --log-samples --out "$out/zflow.json" \
      > "$out/zflow.log" 2>&1
    zf=$(echo "$(date +%s.%N) - $start" | bc)
    python3 "$here/compare.py" "$out/zflow.json" "$out/lm-eval" > "$out/compare.txt" || true
    if [ "$kind" = generation ]; then n=$(count generated "$out/zflow.json"); what="output tokens"
    else n=$(count input "$out/zflow.json"); what="input tokens"; fi
    printf '%s round %s: %s %s; lm-eval %.1f s (%.0f/s), zflow %.1f s (%.0f/s), %.1fx; %s\n' \
      "$kind" "$round" "$n" "$what" "$lm" "$(echo "$n / $lm" | bc -l)" "$zf" \
      "$(echo "$n / $zf" | bc -l)" "$(echo "$lm / $zf" | bc -l)" \
      "$(grep -c 'agree$' "$out/compare.txt") of $(echo $tasks | wc -w) tasks agree"
  done
done
