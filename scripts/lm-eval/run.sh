#!/usr/bin/env bash
# lm-evaluation-harness's side of the eval agreement test: runs lm_eval's hf backend on a
# Hugging Face model folder over the local documents (scripts/lm-eval/tasks), one lm_eval
# process per task, each timed, and writes every request's record (--log_samples).
# Usage: scripts/lm-eval/run.sh MODEL_DIR OUT_DIR [LIMIT]
#   LIMIT: the first LIMIT documents of each task (all when absent).
#   TASKS="a b ..."  the tasks (default: all of tasks/, the names ending in _local);
#   BATCH_SIZE (1), DEVICE (cpu), DTYPE (float32), MAX_LENGTH (2048: lm-eval's context window,
#   else it takes the config's max_position_embeddings, 131072 for ZAYA1);
#   GEN_KWARGS: lm_eval's --gen_kwargs for every generation task (e.g. max_gen_toks=256, as
#   `zflow eval --max-gen-toks 256`);
#   TOGETHER=1: all tasks in one lm_eval process (one start-up, ~13 s, instead of one per task;
#   the timings then name the whole run).
# Offline: HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1; HF_HOME is target/lm-eval-work/hf-home.
# Writes OUT_DIR/<model path, sanitised>/{results_*.json, samples_<task>_*.jsonl} and
# OUT_DIR/timings.tsv (task, seconds, exit status).
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
model="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
limit=(); [ -n "${3:-}" ] && limit=(--limit "$3")
gen_kwargs=(); [ -n "${GEN_KWARGS:-}" ] && gen_kwargs=(--gen_kwargs "$GEN_KWARGS")
default_tasks="gsm8k_cot_local minerva_math_algebra_local minerva_math_counting_and_prob_local
minerva_math_geometry_local minerva_math_intermediate_algebra_local minerva_math_num_theory_local
minerva_math_prealgebra_local minerva_math_precalc_local minerva_math500_local humaneval_local
mbpp_local arc_easy_local boolq_local"
tasks="${TASKS:-$default_tasks}"

"$here/setup.sh" >/dev/null
venv="$repo/target/lm-eval-venv"
export ZFLOW_EVAL_DATA="${ZFLOW_EVAL_DATA:-$repo/target/test-fixtures/data-root}"
"$venv/bin/python" "$here/prepare_data.py" "$repo/target/lm-eval-data" >/dev/null

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_HOME="$repo/target/lm-eval-work/hf-home"
# humaneval and mbpp execute the model's programs (code_eval/code_eval.py, see there).
export HF_ALLOW_CODE_EVAL=1
export TOKENIZERS_PARALLELISM=false
# The tasks' data paths and evaluate.load("code_eval") are relative to scripts/lm-eval/.
cd "$here"

printf 'task\tseconds\tstatus\n' > "$out/timings.tsv"
failed=0
[ -n "${TOGETHER:-}" ] && tasks="$(echo $tasks | tr ' ' ',')"
for task in $tasks; do
  start=$(date +%s.%N)
  status=0
  "$venv/bin/lm_eval" run --model hf \
    --model_args "pretrained=$model,dtype=${DTYPE:-float32},max_length=${MAX_LENGTH:-2048}" \
    --device "${DEVICE:-cpu}" --batch_size "${BATCH_SIZE:-1}" \
    --include_path "$here/tasks" --tasks "$task" "${limit[@]}" "${gen_kwargs[@]}" \
    --confirm_run_unsafe_code --log_samples --output_path "$out" \
    > "$out/$task.log" 2>&1 || status=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  printf '%s\t%.1f\t%s\n' "$task" "$secs" "$status" >> "$out/timings.tsv"
  printf '%-40s %7.1f s  %s\n' "$task" "$secs" "$([ "$status" = 0 ] && echo ok || echo "FAILED ($out/$task.log)")"
  [ "$status" = 0 ] || failed=1
done

echo "samples (one JSON record per document and request):"
find "$out" -name 'samples_*.jsonl' | sort
exit "$failed"
