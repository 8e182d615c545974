#!/usr/bin/env bash
# A launch rehearsal at scale on the test cluster (scripts/cluster-local.sh): for each world
# size, a tiny model's phase on NODES x 16 ranks of the CPU (one `srun` step per node, whose
# node agent forks its 16 ranks from the node's torch fork server), with rank WORLD-1 crashed
# after step 5 of the first launch. It prints, per size:
#   - first step: seconds from the launch (the run record's `launch` row) to the first step
#     in metrics.jsonl (polled every 0.2 s);
#   - relaunch: seconds from the supervisor noticing the crash to the relaunched ranks' first
#     step (the run record's failure row: training_again_ms - detected_ms), backoff 0.1 s
#     included;
#   - the largest node's memory in use at the end of the first step (from /proc/meminfo,
#     against the machine's before the run).
# Needs root and Slurm (scripts/slurm-local.sh installs it), target/torch-venv
# (scripts/setup.sh) and a built zflow (`cargo build --release`, or ZFLOW=path).
#
# Usage: scripts/rehearsal.sh [WORLD...]   (default 16 64 256; each a multiple of 16)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ZFLOW=${ZFLOW:-$ROOT/target/release/zflow}
PER_NODE=16
SIZES=("${@:-16 64 256}")
read -r -a SIZES <<<"${SIZES[*]}"
max=0
for w in "${SIZES[@]}"; do
  [ $((w % PER_NODE)) -eq 0 ] || { echo "rehearsal: $w is not a multiple of $PER_NODE" >&2; exit 2; }
  [ "$w" -gt "$max" ] && max=$w
done
nodes_max=$((max / PER_NODE))
export ZFLOW_TORCH_PYTHON=${ZFLOW_TORCH_PYTHON:-$ROOT/target/torch-venv/bin/python}
export ZFLOW_CLUSTER_CPUS=$PER_NODE
eval "$(scripts/cluster-local.sh start "$nodes_max")"
trap 'scripts/cluster-local.sh stop >/dev/null 2>&1 || true' EXIT

ms() { date +%s%3N; }
used_mb() { awk '/MemTotal/ {t=$2} /MemAvailable/ {a=$2} END {print int((t - a) / 1024)}' /proc/meminfo; }

printf '%6s %6s %16s %14s %16s\n' ranks nodes "first step (s)" "relaunch (s)" "memory (MB)"
for world in "${SIZES[@]}"; do
  nodes=$((world / PER_NODE))
  dir=$ROOT/target/rehearsal/$world
  rm -rf "$dir" && mkdir -p "$dir"
  cat >"$dir/r.yaml" <<YAML
name: rehearsal-$world
executor: {kind: slurm, poll_s: 0.3}
model: {hidden_size: 32, num_blocks: 1, vocab_size: 512, num_query_heads: 2, num_kv_heads: 1, head_dim: 16, num_experts: 2, expert_ffn: 32, router_dim: 16}
sources:
  prose: {url: "$ROOT/*.md", format: text, split_regex: "\n\n+", min_chars: 20}
tokenizer:
  train: {vocab_size: 512, sample_bytes_per_source: 200000}
train:
  global_batch: $world
  micro_batch: 1
  schedule: {peak_lr: 0.01, warmup: 0.1, decay: 0.3}
  checkpoint_every: 2
  eval_every: 0
  eval_tokens: 64
  launch: {nodes: $nodes, ranks_per_node: $PER_NODE, cpus_per_rank: 1, env: {GLOO_SOCKET_IFNAME: zeth0}, max_restarts: 1, backoff_s: 0.1, hang_timeout_s: 900, preflight: {enabled: false}}
phases:
  p1: {tokens: $((8 * world * 32)), seq_len: 32, mixture: {prose: 1.0}}
YAML
  before=$(used_mb)
  (cd "$dir" && ZFLOW_FAULTS="crash@5:rank=$((world - 1)):attempt=1" "$ZFLOW" run r.yaml >run.log 2>&1) &
  run=$!
  first="" peak=0
  while kill -0 "$run" 2>/dev/null; do
    m=$(ls -d "$dir"/zflow-store/train.p1-*.partial 2>/dev/null | head -1 || true)
    if [ -z "$first" ] && [ -n "$m" ] && grep -qs '"type":"step"' "$m/metrics.jsonl"; then
      first=$(ms)
      peak=$(($(used_mb) - before))
    fi
    sleep 0.2
  done
  wait "$run" || { echo "rehearsal: the $world-rank run failed; see $dir/run.log" >&2; exit 1; }
  out=$(ls -d "$dir"/zflow-store/train.p1-* | grep -v partial | head -1)
  read -r launch relaunch < <(python3 - "$out/events.jsonl" "$first" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
launch = next(e for e in events if e["kind"] == "launch" and e["attempt"] == 1)
failure = next(e for e in events if e["kind"] == "failure")
first = int(sys.argv[2])
print(f'{(first - launch["detected_ms"]) / 1000:.1f} '
      f'{(failure["training_again_ms"] - failure["detected_ms"]) / 1000:.1f}')
PY
)
  printf '%6s %6s %16s %14s %16s\n' "$world" "$nodes" "$launch" "$relaunch" "$peak"
done
