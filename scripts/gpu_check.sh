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
if ! "$python" -c "import transformers, safetensors, blake3" 2>/dev/null; then
  # Keep the machine's PyTorch (its CUDA build); add the rest from the carried wheels.
  "$python" -m venv --system-site-packages /tmp/zflow-gpu-venv
  python=/tmp/zflow-gpu-venv/bin/python
  "$python" -m pip install --quiet --no-index --find-links "$wheels" \
    transformers==5.23.0 safetensors==0.8.0 blake3==1.0.11
fi
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
cfg=$(mktemp)
cat > "$cfg" <<JSON
{"model": {"hidden_size": 2048, "num_blocks": ${BLOCKS:-8}, "vocab_size": 262272,
  "num_query_heads": 8, "num_kv_heads": 2, "head_dim": 128, "conv_kernel": 2,
  "rope_fraction": 0.5, "rope_base": 10000.0, "num_experts": 16, "top_k": 1,
  "expert_ffn": 2048, "mod_skip": true, "router_dim": 256, "router_mlp_layers": 3,
  "eda": true, "residual_scaling": true, "tie_embeddings": true, "rms_norm_eps": 1e-5},
 "train": {"grad_clip": 1.0, "seed": 0,
  "muon": {"momentum": 0.95, "nesterov": true, "ns_steps": 5, "weight_decay": 0.1},
  "adamw": {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0},
  "balance": {"kp": 1.0, "ki": 0.0, "kd": 0.0, "lr": 0.001, "beta1": 0.9, "beta2": 0.99,
   "skip_share": null, "enabled": true}},
 "batch": ${BATCH:-4}, "seq_len": ${SEQ_LEN:-4096}, "steps": ${STEPS:-10}, "threads": 8,
 "peak_tflops": $peak, "backend": "$backend"}
JSON
result=$(PYTHONPATH=workers/torch "$python" -m zflow_torch.bench gpu "$cfg" | tail -1)
echo "$result"
if [ -n "${OUT:-}" ]; then echo "$result" > "$OUT/gpu.json"; fi
