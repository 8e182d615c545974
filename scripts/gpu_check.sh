#!/usr/bin/env bash
# The torch engine on one GPU: the worker's own step (zflow_torch.bench gpu) at world 1, bf16
# autocast over f32 master weights, SDPA attention, for a ZAYA1-shaped model (8 blocks at hidden
# 2048, 16 experts + the skip route, ZAYA1's 262,272-token vocabulary, 4096-token sequences).
# Prints one JSON line (tokens/s, MFU against the GPU's dense bf16 peak, peak memory) and writes
# it to $OUT/gpu.json when $OUT is set (the device machine's result folder).
#
#   scripts/gpu_check.sh --prepare   # here, with network: the engine's Python packages (bar
#                                    # torch) as wheels in target/gpu-wheels (~46 MB)
#   scripts/gpu_check.sh             # on the GPU machine (PyTorch with CUDA installed; no network
#                                    # needed: carry target/gpu-wheels)
#   scripts/gpu_check.sh --backend rocm   # on an AMD GPU (PyTorch's ROCm build; MI300X peak)
# PEAK_TFLOPS (default 989, an H100/H200's dense bf16; 1307, an MI300X's, with --backend rocm)
# sets the MFU's denominator; BATCH, SEQ_LEN, STEPS, BLOCKS the workload.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=target/gpu-wheels
if [ "${1:-}" = "--prepare" ]; then
  target/torch-venv/bin/pip download --quiet -d "$wheels" \
    transformers==5.23.0 safetensors==0.8.0 blake3==1.0.11 numpy==2.4.6
  # blake3 is compiled per Python: the GPU machine's Python may not be this one's.
  for v in 3.11 3.12 3.13; do
    target/torch-venv/bin/pip download --quiet -d "$wheels" --no-deps --only-binary=:all: \
      --python-version "$v" --platform manylinux_2_17_x86_64 blake3==1.0.11
  done
  du -sh "$wheels"
  exit 0
fi
backend=cuda
if [ "${1:-}" = "--backend" ]; then backend="${2:?--backend cuda|rocm}"; fi
case "$backend" in
cuda) peak=${PEAK_TFLOPS:-989} ;;
rocm) peak=${PEAK_TFLOPS:-1307} ;;
*) echo "gpu_check.sh: --backend cuda or rocm, not $backend" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
pkgs=workers/torch
if ! "$python" -c "import transformers, blake3, safetensors; assert transformers.__version__ == '5.23.0'" 2>/dev/null; then
  # Keep the machine's PyTorch (its CUDA or ROCm build) and its other packages; put the
  # worker's pins from the carried wheels in front of them.
  "$python" -m pip install --quiet --no-index --no-deps --find-links "$wheels" \
    --upgrade --target /tmp/zflow-gpu-pkgs transformers==5.23.0 safetensors==0.8.0 blake3==1.0.11
  pkgs=/tmp/zflow-gpu-pkgs:workers/torch
fi
export PYTHONPATH=$pkgs
"$python" - "$backend" <<'PY'
import sys, torch
backend = sys.argv[1]
assert torch.cuda.is_available(), "no GPU visible to PyTorch"
if backend == "rocm":
    assert torch.version.hip, "--backend rocm, but this PyTorch is not a ROCm build"
    stack = f"HIP {torch.version.hip}, RCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
else:
    assert torch.version.cuda, "--backend cuda, but this PyTorch has no CUDA"
    stack = f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
print("torch", torch.__version__, torch.cuda.get_device_name(0), stack)
PY
# The launch on a GPU: the rank's device and stack as the run record keeps them, the preflight
# probe at ZAYA1's GEMM shape, and two ranks told to bind the same GPU stopping with zflow's own
# error (before NCCL sees them).
"$python" - "$backend" <<'PY'
import json, os, secrets, socket, subprocess, sys
from zflow_torch.distributed import describe, device_for, probe
backend = sys.argv[1]
device = device_for(backend, 0)
p = probe(device, 0)
print(json.dumps({"device": describe(device), "probe_gemm_gflops": round(p.gemm_gflops), "probe_hbm_gbps": round(p.membw_gbps),
                  "probe_f32_gflops": round(p.f32_gflops), "probe_bf16_gflops": round(p.bf16_gflops)}))
rank_code = """
import os, torch
from zflow_torch.contract import Fatal
from zflow_torch.distributed import device_for, device_index, join_group
d = device_for(os.environ["BACKEND"], device_index())
try:
    join_group(int(os.environ["ZFLOW_RANK"]), 2, d)
    print("joined")
except Fatal as e:
    print("fatal:", e)
"""
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, ZFLOW_RENDEZVOUS=f"127.0.0.1:{port}", ZFLOW_GROUP_SECRET=secrets.token_hex(32),
           ZFLOW_WORLD="2", ZFLOW_DEVICE="0", BACKEND=backend)
ranks = [subprocess.Popen([sys.executable, "-c", rank_code], env=dict(env, ZFLOW_RANK=str(r)),
                          stdout=subprocess.PIPE, text=True) for r in range(2)]
said = [p.communicate(timeout=300)[0].strip() for p in ranks]
print(json.dumps({"two_ranks_on_gpu_0": said}))
assert all("both bound device" in s for s in said), said
PY
# The step as the engine runs it (activation checkpointing none, the loss in chunks), then the
# memory settings' variants (fewer steps): their peak memory and speed side by side.
bench() { # STEPS ACTIVATION_CHECKPOINTING LOSS
cfg=$(mktemp)
cat > "$cfg" <<JSON
{"model": {"hidden_size": 2048, "num_blocks": ${BLOCKS:-8}, "vocab_size": 262272,
  "num_query_heads": 8, "num_kv_heads": 2, "head_dim": 128, "conv_kernel": 2,
  "rope_fraction": 0.5, "rope_base": 10000.0, "num_experts": 16, "top_k": 1,
  "expert_ffn": 2048, "mod_skip": true, "skip_output": "zero", "router_dim": 256,
  "router_mlp_layers": 3, "eda": true, "residual_scaling": true, "tie_embeddings": true,
  "rms_norm_eps": 1e-5, "sliding_blocks": [], "sliding_window": 4096,
  "sliding_rope_base": 10000.0},
 "train": {"grad_clip": 1.0, "seed": 0,
  "schedule": {"peak_lr": 0.002, "warmup": 0.01, "decay": 0.1, "min_lr_ratio": 0.1,
   "decay_shape": "sqrt"},
  "muon": {"momentum": 0.95, "nesterov": true, "ns_steps": 5, "weight_decay": 0.1},
  "adamw": {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0},
  "balance": {"kp": 1.0, "ki": 0.0, "kd": 0.0, "lr": 0.001, "beta1": 0.9, "beta2": 0.99,
   "skip_share": null, "enabled": true},
  "rope_base": null, "carry_optimizer": true, "checkpoint_every": 500, "keep_checkpoints": 3,
  "eval_every": 0, "eval_tokens": 0, "engine": "torch", "backend": "$backend",
  "async_checkpoints": true,
  "spike": {"enabled": true, "window": 20, "z": 6.0, "min_jump": 0.5, "min_history": 8,
   "max_rollbacks": 5}, "loss_chunk_tokens": 4096},
 "batch": ${BATCH:-4}, "seq_len": ${SEQ_LEN:-4096}, "steps": $1, "threads": 8,
 "peak_tflops": $peak, "backend": "$backend", "activation_checkpointing": "$2", "loss": "$3"}
JSON
"$python" -m zflow_torch.bench gpu "$cfg" | tail -1
}
result=$(bench "${STEPS:-10}" none chunked)
echo "$result"
if [ -n "${OUT:-}" ]; then echo "$result" > "$OUT/gpu.json"; fi
for variant in "full chunked" "selective chunked" "none full"; do
  # shellcheck disable=SC2086 # two words: the checkpointing mode and the loss
  line=$(bench 3 $variant || echo "{\"variant\": \"$variant\", \"failed\": true}")
  echo "$line"
  if [ -n "${OUT:-}" ]; then echo "$line" >> "$OUT/gpu-memory.jsonl"; fi
done
